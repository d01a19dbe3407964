"""Checks of request arguments shared by the broker's handlers (each error names the argument),
and the one session an address names."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from agent_bridge.common import display, ledger
from agent_bridge.common.domain import InputError
from agent_bridge.common.rows import Peer

ADDRESS_MAX = 200


def no_unknown(args: dict[str, Any], allowed: Set[str], op: str) -> None:
    if args.keys() <= allowed:  # (every request passes here: the usual answer, without sorting)
        return
    extra = sorted(set(args) - allowed)
    if extra:
        known = ", ".join(sorted(allowed)) or "none"
        raise InputError(f"{op}: unknown argument {extra[0]!r} (allowed: {known})")


def req_str(args: dict[str, Any], key: str, limit: int) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{key}: expected a non-empty string")
    if len(value) > limit:
        raise InputError(f"{key}: at most {limit} characters")
    return value.strip()


def opt_str(args: dict[str, Any], key: str, limit: int) -> str | None:
    if args.get(key) is None:
        return None
    return req_str(args, key, limit)


def parse_host(raw: object) -> tuple[int, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("host: expected {\"pid\": int, \"start\": int, \"exe\": str} or null")
    pid, start = raw.get("pid"), raw.get("start")
    if (
        not isinstance(pid, int)
        or not isinstance(start, int)
        or isinstance(pid, bool)
        or isinstance(start, bool)
    ):
        raise InputError("host: pid and start must be integers")
    return pid, start


def parse_parent(chain: object) -> tuple[int, int] | None:
    """The first hop of an ancestor chain ([[pid, start, exe], …]): the MCP server's parent."""
    if chain is None:
        return None
    if not isinstance(chain, list):
        raise InputError("chain: expected a list of [pid, start, exe]")
    if not chain:
        return None
    first = chain[0]
    if (
        not isinstance(first, list)
        or len(first) < 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in first[:2])
    ):
        raise InputError("chain: expected a list of [pid, start, exe]")
    return first[0], first[1]


def parse_resume(raw: object) -> tuple[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"id", "secret"}:
        raise InputError("resume: expected {\"id\": session id, \"secret\": its secret} or null")
    peer_id, secret = raw["id"], raw["secret"]
    if not isinstance(peer_id, str) or not isinstance(secret, str) or not peer_id or not secret:
        raise InputError("resume: id and secret must be non-empty strings")
    if len(peer_id) > ADDRESS_MAX or len(secret) > ADDRESS_MAX:
        raise InputError(f"resume: id and secret have at most {ADDRESS_MAX} characters")
    return peer_id, secret


SESSIONS_COMMAND = "`agent-bridge sessions`"
CANDIDATES_SHOWN = 10  # sessions named in one ambiguity error


def one_session(field: str, address: str, found: list[Peer], listing: str) -> Peer:
    """The one session `address` names among `found` (its matches, most recently seen first): an
    exact id wins; a name or host session id held by several gone sessions is refused with the
    candidates, never guessed (a name is reused once its session is gone)."""
    exact = [p for p in found if p.id == address]
    if exact:
        return exact[0]
    if len(found) == 1:
        return found[0]
    shown = "; ".join(f"{p.id} ({p.agent}, {p.project}, last seen {display.when(p.last_seen_at)})"
                      for p in found[:CANDIDATES_SHOWN])
    more = f"; and {len(found) - CANDIDATES_SHOWN} more" if len(found) > CANDIDATES_SHOWN else ""
    raise InputError(f"{field}: {address!r} names {len(found)} sessions that are not connected: "
                     f"{shown}{more}; give the id of the one you mean (see {listing})")


def message_ids(args: dict[str, Any]) -> list[str]:
    ids = args.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) and len(i) <= ADDRESS_MAX for i in ids):
        raise InputError("ids: expected a list of message ids")
    if len(ids) > ledger.IDS_MAX:
        raise InputError(f"ids: at most {ledger.IDS_MAX} per request")
    return ids

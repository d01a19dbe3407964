"""The owner's commands: `agent-bridge decide | send | retract | forget | sessions`.

`decide`, `send`, `retract` and `forget` change bridge.db, so they go through the broker (the only
writer), starting one when none runs, as an MCP server does: the command then behaves exactly as
the MCP tools (same rules, limits, errors, fan-out and notices). `sessions` only reads, so it
reads bridge.db directly and works with the broker down.

Results go to stdout as JSON (exit 0); a refusal is one line on stderr and a non-zero exit.
Standard library and the blocking client only: no Trio, no MCP.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent_bridge import paths
from agent_bridge.ipc import blocking
from agent_bridge.ipc.protocol import RemoteError

CALL_TIMEOUT = 30.0  # a decide fans out to every connected session in one transaction
START_TIMEOUT = 60.0  # `up --detach` waits up to 20 s itself; this only bounds a stuck child
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
DURATION_MAX_MS = 36_500 * UNIT_MS["d"]


class CommandError(Exception):
    """A refusal, said in one line."""


def _fail(command: str, message: str) -> int:
    print(f"agent-bridge {command}: {message}", file=sys.stderr)
    return 1


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False, indent=2))


def ensure_broker(home: Path) -> None:
    """Start a detached broker when none runs for `home` (what an MCP server does), saying so on
    stderr; a broker that refuses to start (a newer database, a bad config) is a CommandError."""
    if blocking.broker_socket(home) is not None:
        return
    up = subprocess.run(
        [sys.executable, "-m", "agent_bridge", "up", "--detach"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        env={**os.environ, "AGENT_BRIDGE_HOME": str(home)},
    )
    if up.returncode != 0 or blocking.broker_socket(home) is None:
        lines = [line for line in (up.stderr or "").splitlines() if line.strip()]
        why = lines[-1].removeprefix("agent-bridge up: ") if lines else f"exit status {up.returncode}"
        raise CommandError(f"no broker was running and none could be started: {why}")
    print(f"agent-bridge: started a broker for {home} (stop it with `agent-bridge down`)", file=sys.stderr)


def broker_call(op: str, **args: Any) -> Any:
    from agent_bridge.ipc.protocol import unstorable_text

    where = unstorable_text(args)
    if where is not None:  # argv bytes that are not UTF-8 arrive as lone surrogates
        raise CommandError(f"{where}: not valid text (is it UTF-8?); nothing was sent")
    home = paths.ensure_home(paths.home())
    ensure_broker(home)
    try:
        return blocking.call(home, op, timeout=CALL_TIMEOUT, **args)
    except RemoteError as exc:
        raise CommandError(exc.message) from None
    except blocking.BrokerUnavailable as exc:
        raise CommandError(f"the broker did not answer: {exc}") from None


def decide(topic: str, text: str, scope: str | None) -> int:
    args: dict[str, Any] = {"topic": topic, "text": text, "project": os.path.abspath(os.getcwd())}
    if scope is not None:
        from agent_bridge import domain

        try:  # a bad argument is refused here (exit 2), before a broker is started for it
            domain.parse_scope(scope)
        except domain.InputError as exc:
            _fail("decide", str(exc))
            return 2
        args["scope"] = scope  # a string: "all" or JSON, parsed by the broker's rules
    return _run("decide", args)


def send(to: str, text: str) -> int:
    return _run("send", {"to": to, "text": text})


def retract(topic: str, reason: str | None) -> int:
    args: dict[str, Any] = {"topic": topic}
    if reason is not None:
        args["reason"] = reason
    return _run("retract", args)


def _run(op: str, args: dict[str, Any]) -> int:
    try:
        result = broker_call(op, **args)
    except CommandError as exc:
        return _fail(op, str(exc))
    except OSError as exc:
        return _fail(op, f"{type(exc).__name__}: {exc}")
    _print_json(result)
    return 0


# --- sessions and forget -------------------------------------------------------------


def parse_duration(text: str) -> int:
    """`90s`, `30m`, `12h`, `7d`, `2w` -> milliseconds."""
    match = DURATION.match(text)
    if not match:
        raise CommandError(f"--gone-for: expected a number and a unit s, m, h, d or w (e.g. 7d), got {text!r}")
    ms = float(match.group(1)) * UNIT_MS[match.group(2)]
    if not ms <= DURATION_MAX_MS:  # (also inf, from a number too long for a float)
        raise CommandError(f"--gone-for: at most {DURATION_MAX_MS // UNIT_MS['d']}d (100 years), got {text!r}")
    return int(ms)


def list_sessions(home: Path) -> list[dict[str, Any]]:
    """Every known session as the `peers` tool's objects plus `lastSeen` and `unacknowledged`,
    connected ones first. Read-only: the broker, when it runs, is asked only who is connected."""
    from agent_bridge.store import queries, reader

    try:
        connected = set(blocking.call(home, "connected", timeout=5.0))
    except (blocking.BrokerUnavailable, RemoteError, OSError, TypeError):
        connected = set()  # no broker (or an older one): nobody is connected
    with reader.reading(paths.db_path(home)) as conn:
        if conn is None:
            return []
        peers = queries.list_peers(conn)
        unacked = queries.unacked_counts(conn)
    out = []
    for p in peers:
        item = {**p.public(), "connected": p.id in connected, "lastSeen": p.last_seen_at}
        item["unacknowledged"] = unacked.get(p.id, 0)
        out.append(item)
    out.sort(key=lambda s: (not s["connected"], -int(s["lastSeen"] or 0), s["name"]))
    return out


def sessions(as_json: bool) -> int:
    from agent_bridge.store.schema import SchemaError

    try:
        found = list_sessions(paths.home())
    except SchemaError as exc:
        return _fail("sessions", str(exc))
    if as_json:
        _print_json(found)
        return 0
    if not found:
        print("No sessions.")
        return 0
    now = time.time_ns() // 1_000_000
    for s in found:
        state = "connected" if s["connected"] else f"gone, last seen {_age(now - int(s['lastSeen'] or 0))} ago"
        waiting = f", {s['unacknowledged']} unacknowledged" if s["unacknowledged"] else ""
        print(f"{s['name']:<24} {s['agent']:<8} {s['kind']:<11} {state}{waiting}")
        print(f"    {s['project']}  id {s['id']}" + (f"  host {s['hostSessionId']}" if s["hostSessionId"] else ""))
    return 0


def forget(addresses: list[str], gone_for: str | None, as_json: bool) -> int:
    if bool(addresses) == (gone_for is not None):
        return _fail("forget", "give session names/ids, or --gone-for DURATION (not both)")
    try:
        args: dict[str, Any] = {"sessions": addresses} if addresses else {"goneForMs": parse_duration(gone_for or "")}
    except CommandError as exc:  # a bad argument: exit 2, as everywhere (SPEC §2)
        _fail("forget", str(exc))
        return 2
    try:
        result = broker_call("forget", **args)
    except CommandError as exc:
        return _fail("forget", str(exc))
    except OSError as exc:
        return _fail("forget", f"{type(exc).__name__}: {exc}")
    if as_json:
        _print_json(result)
        return 0
    forgotten = result.get("forgotten", [])
    if not forgotten:
        print("Nothing to forget.")
    for item in forgotten:
        s, dropped = item["session"], item["dropped"]
        print(f"Forgot {s['name']} ({s['id']}); {len(dropped)} queued message(s) dropped" + (":" if dropped else "."))
        for m in dropped:
            sender = (m.get("from") or {}).get("name") or "?"
            text = " ".join(str(m.get("text", "")).split())
            print(f"    [{m.get('kind')}] from {sender}: {text[:120] + ('…' if len(text) > 120 else '')}")
    return 0


def _age(ms: int) -> str:
    seconds = max(ms, 0) // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"

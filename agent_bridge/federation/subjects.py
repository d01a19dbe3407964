"""The names on the wire (SPEC §10): subjects, streams and consumers, as pure functions.

One team shares one stream for what must arrive (messages, receipts, decisions) and one for presence:

  stream AB_<TEAM>            <team>.msg.>  <team>.rcpt.>  <team>.dec.>
  <team>.msg.<from>.<to>      a message from machine `from` to machine `to`
  <team>.rcpt.<from>.<to>     receipts sent by `from` (the machine that received the messages) back to `to`
  <team>.dec.<from>           decisions and retractions recorded on `from`
  stream AB_<TEAM>_PRESENCE   <team>.presence.<machine>, the last one per machine

  consumer <machine>_msg      filter <team>.msg.*.<machine>
  consumer <machine>_rcpt     filter <team>.rcpt.*.<machine>
  consumer <machine>_dec      filter <team>.dec.*  (the machine skips its own)

The sending machine is the subject's token, never anything in the body: the hub lets a machine publish
only subjects that name it as sender (hub.py), so `parse` is what a receiver trusts.

Machine and team names are 1 to 32 of a-z, 0-9 and "-": no "." (a subject token), no "_" (so that
`AB_<TEAM>` and `<machine>_<kind>` cannot collide), no wildcard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

NAME_RE = re.compile(r"[a-z0-9-]{1,32}")
NAME_RULE = "1 to 32 of a-z, 0-9 and -"
DEFAULT_TEAM = "ab"
# Every team's presence stream is AB_<TEAM>_PRESENCE; a team named "x-presence" would take team x's
# presence stream for its own, so the suffix is refused (settings, hub-config).
RESERVED_TEAM_SUFFIX = "-presence"

Kind = Literal["msg", "rcpt", "dec"]
KINDS: tuple[Kind, ...] = ("msg", "rcpt", "dec")
INBOX_PREFIX = "_INBOX_"  # + machine: each machine's replies under a prefix only it may subscribe to


class SubjectError(ValueError):
    """A subject that is not one of the team's, or a name outside NAME_RULE."""


def is_name(value: object) -> bool:
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def is_team(value: object) -> bool:
    return is_name(value) and not str(value).endswith(RESERVED_TEAM_SUFFIX)


def _check(value: str, what: str) -> str:
    if not is_name(value):
        raise SubjectError(f"{what}: expected {NAME_RULE}, got {value!r}")
    return value


def stream(team: str) -> str:
    """The team's stream of messages, receipts and decisions: AB_<TEAM>, "-" becoming "_"."""
    return "AB_" + _check(team, "team").upper().replace("-", "_")


def presence_stream(team: str) -> str:
    return stream(team) + "_PRESENCE"


def stream_subjects(team: str) -> list[str]:
    _check(team, "team")
    return [f"{team}.{kind}.>" for kind in KINDS]


def presence_subjects(team: str) -> list[str]:
    return [f"{_check(team, 'team')}.presence.*"]


def msg(team: str, sender: str, to: str) -> str:
    return f"{_check(team, 'team')}.msg.{_check(sender, 'from')}.{_check(to, 'to')}"


def rcpt(team: str, sender: str, to: str) -> str:
    return f"{_check(team, 'team')}.rcpt.{_check(sender, 'from')}.{_check(to, 'to')}"


def dec(team: str, sender: str) -> str:
    return f"{_check(team, 'team')}.dec.{_check(sender, 'from')}"


def presence(team: str, machine: str) -> str:
    return f"{_check(team, 'team')}.presence.{_check(machine, 'machine')}"


def consumer(machine: str, kind: Kind) -> str:
    """The durable consumer `machine` reads `kind` with: <machine>_<kind>."""
    if kind not in KINDS:
        raise SubjectError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    return f"{_check(machine, 'machine')}_{kind}"


def consumer_filter(team: str, machine: str, kind: Kind) -> str:
    """What `machine`'s consumer of `kind` reads: what is addressed to it (all decisions for "dec")."""
    _check(team, "team")
    _check(machine, "machine")
    if kind == "dec":
        return f"{team}.dec.*"
    if kind in KINDS:
        return f"{team}.{kind}.*.{machine}"
    raise SubjectError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")


def inbox_prefix(machine: str) -> str:
    return INBOX_PREFIX + _check(machine, "machine")


@dataclass(frozen=True)
class Address:
    """What a subject says: its kind, the machine that sent it, and the one it is for (None: every
    machine, for decisions and presence)."""

    kind: Literal["msg", "rcpt", "dec", "presence"]
    sender: str
    to: str | None


def parse(team: str, subject: str) -> Address:
    """The kind, sender and recipient of one of the team's subjects; SubjectError for anything else
    (another team's, a wildcard, an unknown kind, a token outside NAME_RULE)."""
    parts = subject.split(".")
    if len(parts) < 3 or parts[0] != team:
        raise SubjectError(f"not a subject of team {team!r}: {subject!r}")
    kind, names = parts[1], parts[2:]
    expected = {"msg": 2, "rcpt": 2, "dec": 1, "presence": 1}.get(kind)
    if expected is None or len(names) != expected or not all(is_name(n) for n in names):
        raise SubjectError(f"not a subject of team {team!r}: {subject!r}")
    return Address(kind, names[0], names[1] if expected == 2 else None)  # type: ignore[arg-type]

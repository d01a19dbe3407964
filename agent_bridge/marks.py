"""A session's busy/idle mark, as the hooks keep it (SPEC §3 "Session state"), read in one place.

The UserPromptSubmit hook marks a turn's start (`busy`), the Stop hook its end (`idle`), in
`<home>/waiters/<sha256(host session id)[:32]>.state` (hooks.wake writes it; the wake waiter
reads it too). `peers`, `agent-bridge sessions` and the dashboard read it here, through
`session_state`, so how marks are written can change behind this one function.

Light: the standard library and `paths` (the hooks import it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from agent_bridge import paths

WAITERS_DIR = "waiters"
BUSY, IDLE, OFFLINE = "busy", "idle", "offline"
MARK_MAX = 4096  # bytes of a mark read: a few words; anything longer is not one


class SessionState(NamedTuple):
    """`state`: busy, idle or offline (None: unknown, a session without hooks); `since`: epoch ms."""

    state: str | None
    since: int | None

    def to_json(self) -> dict[str, str | int | None]:
        return {"state": self.state, "stateSince": self.since}


UNKNOWN = SessionState(None, None)


def mark_path(home: Path, host_session_id: str) -> Path:
    """`<home>/waiters/<digest>.state`: "busy <launch>" while a turn runs, "idle <prompt id>
    <launch>" once its Stop hook has finished; <launch> is when the host started the hook that
    wrote it (hooks.wake `launch_stamp`, "-" when unknown)."""
    return home / WAITERS_DIR / f"{paths.host_session_digest(host_session_id)}.state"


def read_mark(home: Path, host_session_id: str) -> str:
    return _read(mark_path(home, host_session_id))[0]


def _read(path: Path) -> tuple[str, int | None]:
    """The mark's text ("" when there is none) and when it was written (epoch ms), both read
    from one open file: a mark replaced meanwhile (os.replace) cannot pair one's text with the
    other's time."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return "", None
    try:
        written = os.fstat(fd).st_mtime_ns // 1_000_000
        return os.read(fd, MARK_MAX).decode("utf-8", "replace"), written
    except OSError:
        return "", None
    finally:
        os.close(fd)


def session_state(
    home: Path, host_session_id: str | None, *, connected: bool, last_seen: int | None
) -> SessionState:
    """A session's state: `offline` (since last seen) when it is not connected; else busy or
    idle since its hooks last marked it; unknown (None) for a session whose hooks never did
    (no hooks, or no host session id to find their mark by)."""
    if not connected:
        return SessionState(OFFLINE, last_seen)
    if not host_session_id:
        return UNKNOWN
    text, written = _read(mark_path(home, host_session_id))
    word = text.split(" ", 1)[0]
    return SessionState(word, written) if word in (BUSY, IDLE) else UNKNOWN

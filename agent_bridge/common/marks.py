"""A session's busy/idle mark, as the hooks keep it (SPEC §3 "Session state"), read in one place.

The UserPromptSubmit hook marks a turn's start (`busy`), the Stop hook its end (`idle`), in
`<home>/waiters/<sha256(host session id)[:32]>.state` (hooks.wake writes it; the wake waiter
reads it too). `peers`, `agent-bridge sessions` and the dashboard read it here, through
`session_state`, so how marks are written can change behind this one function.

Beside each mark, the session's waiter lock (`<digest>.lock`, held by hooks.wake for its life)
and the one protocol for removing the two when the session is over (`forget_files` under the
lock; `forget_ended` for a forgotten session, which leaves them to a waiter that holds the lock).

Light: the standard library and `paths` (the hooks import it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from agent_bridge.common import paths

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


# --- the session's files in <home>/waiters/: its mark and its waiter's lock ------------------


def lock_path(home: Path, host_session_id: str) -> Path:
    """`<home>/waiters/<digest>.lock`: the session's waiter lock (hooks.wake holds it)."""
    return home / WAITERS_DIR / f"{paths.host_session_digest(host_session_id)}.lock"


def lock_folder(folder: Path) -> int | None:
    """An exclusive flock on the folder itself (a descriptor to close), held for microseconds by
    each mark writer and by whoever removes a session's files; None where there is no flock (no
    waiter runs there either)."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold_lock(home: Path, host_session_id: str) -> int | None:
    """This session's waiter lock (an open descriptor, flock held), or None when another waiter
    holds it. The lock goes with the process, however it ends. Whoever removes a session's files
    does it while holding the lock (forget_files): a lock taken on a file that is no longer at
    its path is let go and taken again on the path's new file."""
    import fcntl

    paths.ensure_home(home)
    (home / WAITERS_DIR).mkdir(mode=0o700, exist_ok=True)
    path = lock_path(home, host_session_id)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                return fd
            os.close(fd)  # removed by the waiter that held it: try the path again
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise


def forget_files(home: Path, host_session_id: str) -> None:
    """The session is over: its mark and its waiter lock go. The caller holds the lock
    (hold_lock), so no waiter of the session is there to lose it."""
    folder = home / WAITERS_DIR
    held = lock_folder(folder)  # mark writers hold it for the look and the write
    try:
        for path in (mark_path(home, host_session_id), lock_path(home, host_session_id)):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
    finally:
        if held is not None:
            os.close(held)


def forget_ended(home: Path, host_session_id: str) -> bool:
    """A session that is over for good (forgotten): its files go, unless a waiter holds its
    lock (its host still runs; the waiter removes them when the host ends). True when removed.
    Without a waiters folder, or flock (Windows), nothing to do."""
    if not (home / WAITERS_DIR).is_dir():
        return False
    try:
        lock = hold_lock(home, host_session_id)
    except ImportError:
        return False
    if lock is None:
        return False
    try:
        forget_files(home, host_session_id)
    finally:
        os.close(lock)
    return True

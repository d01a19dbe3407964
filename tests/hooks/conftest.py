"""Helpers for the hook tests: fixture databases built with the broker's own Store, and the
hook commands run as the hosts run them (the installed `agent-bridge` script, JSON on stdin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent_bridge.common import domain, paths
from agent_bridge.common.domain import Scope, SessionView
from agent_bridge.store.writer import Store

SCRIPT = Path(sys.executable).with_name("agent-bridge")
HOOK = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "agent_bridge"]


def build_db(
    home: Path,
    decisions: Sequence[tuple[str, str, Scope]],
    *,
    peers: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """A bridge.db with `peers` (create_peer keyword arguments) and `decisions` (topic, text,
    scope, normalized as the broker does), recorded oldest first by one author. Returns the
    created peers."""
    paths.ensure_home(home)
    store = Store.open(paths.db_path(home))
    try:
        author = store.create_peer(
            agent="claude",
            name="claude-author",
            project="/work/author",
            kind="interactive",
            host_session_id=None,
            now=1,
        )
        view = SessionView(author.id, author.name, author.project)
        created = [store.create_peer(now=2, **p) for p in peers]
        for i, (topic, text, scope) in enumerate(decisions):
            store.record_decision(
                author=view, author_agent="claude", topic=topic, text=text, scope=domain.parse_scope(scope),
                source_message_id=None, recipients=[], now=1_000 + i,
            )
    finally:
        store.close()
    return created


def hook_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("AGENT_BRIDGE_HOST_SESSION_ID", "CLAUDE_CODE_SESSION_ID", "AGENT_BRIDGE_HOP_LIMIT",
                "AGENT_BRIDGE_HOST_PID", "AGENT_BRIDGE_FAULT"):
        env.pop(key, None)
    env["AGENT_BRIDGE_HOME"] = str(home)
    env.update(extra)
    return env


def run_hook(
    event: str, agent: str, payload: bytes | dict[str, Any], env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`agent-bridge hook <event> --agent <agent>` with `payload` on stdin."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return subprocess.run(
        [*HOOK, "hook", event, "--agent", agent],
        input=data,
        env=env,
        cwd=cwd,
        capture_output=True,
        timeout=60,
    )


def note_of(result: subprocess.CompletedProcess[bytes]) -> str:
    """The additionalContext of a SessionStart answer (asserting the documented shape)."""
    assert result.returncode == 0, result.stderr.decode()
    answer = json.loads(result.stdout)
    assert set(answer) == {"hookSpecificOutput"}
    assert set(answer["hookSpecificOutput"]) == {"hookEventName", "additionalContext"}
    assert answer["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    return answer["hookSpecificOutput"]["additionalContext"]


def log_lines(home: Path) -> list[str]:
    try:
        return paths.log_path(home).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


@pytest.fixture
def hook_home(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    return folder


@pytest.fixture
def fake_host() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in agent host process (named by AGENT_BRIDGE_HOST_PID): alive until the test ends."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def offered_check(home: Path, mid: str) -> Callable[[], Awaitable[bool]]:
    """For `wait_for`: whether message `mid` has been offered (a hook or waiter fetched it)."""
    from agent_bridge.store import reader

    async def offered() -> bool:
        with reader.reading(home / "bridge.db") as conn:
            assert conn is not None
            row = conn.execute("SELECT offered_at FROM receipts WHERE message_id = ?", (mid,)).fetchone()
        return row is not None and row[0] is not None

    return offered


def full_pipe() -> tuple[int, int, int]:
    """A pipe whose write end is full (a host that stopped reading): (read end, write end, the
    number of filler bytes in it). The write end blocks again, as a hook's stdout does."""
    import fcntl

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETFL, os.O_NONBLOCK)
    filler = 0
    try:
        while True:
            filler += os.write(write_end, b"x")
    except BlockingIOError:
        pass
    fcntl.fcntl(write_end, fcntl.F_SETFL, 0)
    return read_end, write_end, filler


def waiter_locks_held(home: Path) -> int:
    """How many idle-wake waiters hold their session's lock in `home` (one waits per session)."""
    import fcntl

    folder = home / "waiters"
    held = 0
    # only the locks (marks.lock_path): a session's state mark is written to a temporary file
    # and renamed, which can be gone between the listing and the open
    for lock in folder.glob("*.lock") if folder.exists() else ():
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            continue  # its session's files were removed meanwhile: nobody holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held += 1
        finally:
            os.close(fd)
    return held

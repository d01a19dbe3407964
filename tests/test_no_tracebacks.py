"""SPEC §8: no command prints a Python traceback for a condition a user can cause (Ctrl-C, a
busy or corrupt database); one line says what is wrong, the details go to broker.log."""

from __future__ import annotations

import os
import pty
import select
import sys
import time
from pathlib import Path

import apsw
import pytest

from agent_bridge.common import paths
from agent_bridge.store.schema import STEPS
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def plain_database(home: Path) -> Path:
    """A current-schema bridge.db in rollback-journal mode (a writer's lock then blocks readers)."""
    paths.ensure_home(home)
    db = home / "bridge.db"
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA journal_mode = DELETE")
    for step in STEPS:
        conn.execute(step)
    conn.close()
    return db


def assert_one_clear_line(done, *expected: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for text in expected:
        assert text in lines[0], lines[0]


def test_decisions_on_a_corrupt_database(env, home):
    paths.ensure_home(home)
    (home / "bridge.db").write_bytes(b"not a database at all" * 200)
    assert_one_clear_line(run_cli(env, "decisions"), "cannot read", "not a database", "broker.log")
    assert "Traceback" in (home / "broker.log").read_text()


def test_decisions_on_a_busy_database(env, home):
    db = plain_database(home)
    holder = apsw.Connection(str(db))
    # connection hooks of this process may have switched it to WAL
    holder.execute("PRAGMA journal_mode = DELETE")
    assert holder.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    holder.execute("BEGIN EXCLUSIVE")
    try:
        done = run_cli(env, "decisions")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert_one_clear_line(done, "busy")


def test_decisions_with_its_wal_deleted_under_a_running_broker(env, home):
    assert run_cli(env, "up", "--detach").returncode == 0
    try:
        (home / "bridge.db-wal").unlink()
        done = run_cli(env, "decisions")
    finally:
        run_cli(env, "down")
    # SQLite may read the main file as it stands: fine, as long as it says nothing odd
    if done.returncode == 0:
        assert done.stderr == ""
    else:
        assert_one_clear_line(done, "cannot read")


def read_until(fd: int, marker: bytes, deadline: float) -> bytes:
    seen = b""
    while marker not in seen:
        assert time.monotonic() < deadline, (
            f"timed out waiting for {marker!r}; got {seen.decode(errors='replace')}"
        )
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_demo_ctrl_c_through_a_real_terminal(env, tmp_path):
    e = {k: v for k, v in env.items() if k != "AGENT_BRIDGE_HOME"}
    e["HOME"] = str(tmp_path)
    pid, master = pty.fork()
    if pid == 0:  # the child: the demo on a real terminal, as a person runs it
        os.execve(sys.executable, [sys.executable, "-m", "agent_bridge", "demo"], e)
    try:
        deadline = time.monotonic() + 120
        shown = read_until(master, b"Press Ctrl-C", deadline)
        os.write(master, b"\x03")  # the terminal turns it into SIGINT for the foreground group
        shown += read_until(master, b"\x00never", deadline)  # everything up to the end
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(master)
    text = shown.decode("utf-8", "replace")
    assert "Traceback" not in text, text
    assert "Stopped the demo broker." in text, text
    assert os.waitstatus_to_exitcode(status) in (0, 130), text


@pytest.mark.parametrize("buffered", [False, True])
@pytest.mark.parametrize(
    "argv", [["decisions"], ["decisions", "--history", "--json"], ["--version"], ["status", "--json"]]
)
def test_a_reader_that_has_gone_is_not_a_traceback(env, home, argv, buffered):
    """`agent-bridge decisions --json | head -1`: the reader leaves before the output is written."""
    import subprocess

    from tests.conftest import CLI

    e = {k: v for k, v in env.items() if not (buffered and k == "PYTHONUNBUFFERED")}
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone: every write to the pipe fails with EPIPE
    try:
        done = subprocess.run(
            [*CLI, *argv], env=e, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write_end)
    assert done.stderr == "", done.stderr

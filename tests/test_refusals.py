"""SPEC §8: a database the broker cannot use is refused before anything writes to it, and the
reason reaches whoever started it (`up`, `up --detach`), in one line, without a traceback."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import apsw
import pytest

from agent_bridge.common import paths
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def newer_database(home: Path) -> Path:
    """A database written by a future agent-bridge (schema 99), in rollback-journal mode."""
    paths.ensure_home(home)
    db = home / "bridge.db"
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA journal_mode = DELETE")  # whatever connection hooks this process has
    conn.execute("CREATE TABLE future(x); PRAGMA user_version = 99")
    conn.close()
    assert not (home / "bridge.db-wal").exists()
    return db


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("detach", [False, True])
def test_a_newer_database_is_refused_byte_for_byte_unchanged(env, home, detach):
    db = newer_database(home)
    before = digest(db)
    done = run_cli(env, "up", *(["--detach"] if detach else []))
    assert done.returncode == 1
    assert "schema version 99" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert digest(db) == before, "the refused database was modified"
    assert not (home / "bridge.db-wal").exists()  # never switched to WAL


def taken_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize("case", ["taken port", "bad port setting", "newer database", "not a database"])
def test_up_detach_prints_each_reason(env, home, case):
    e = dict(env)
    holder = None
    if case == "taken port":
        holder = taken_port()
        e["AGENT_BRIDGE_WEB_PORT"] = str(holder.getsockname()[1])
        expected = "Address already in use"
    elif case == "bad port setting":
        e["AGENT_BRIDGE_WEB_PORT"] = "abc"
        expected = "AGENT_BRIDGE_WEB_PORT: expected a port number"
    elif case == "newer database":
        newer_database(home)
        expected = "schema version 99"
    else:
        paths.ensure_home(home)
        (home / "bridge.db").write_bytes(b"this is not a database\n" * 100)
        expected = "not a SQLite database"
    try:
        done = run_cli(e, "up", "--detach")
    finally:
        if holder is not None:
            holder.close()
    assert done.returncode == 1
    assert expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_up_on_a_locked_database_says_so_in_one_line(env, home):
    paths.ensure_home(home)
    db = home / "bridge.db"
    holder = apsw.Connection(str(db))
    holder.execute("CREATE TABLE t(x); PRAGMA user_version = 1")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        done = run_cli(env, "up")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert "locked" in done.stderr and "broker.log" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" in (home / "broker.log").read_text()  # the details are kept

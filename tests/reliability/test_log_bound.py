"""broker.log stays bounded however much is logged: a client of the same user can make the
broker log without end (each connection that says hello and leaves writes two lines)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from agent_bridge.broker import control
from agent_bridge.common import paths
from tests.conftest import run_cli, wait_until


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:], root.level = saved


def test_the_broker_log_is_capped_and_keeps_the_newest_lines(tmp_path: Path, monkeypatch, restore_logging):
    home = paths.ensure_home(tmp_path / "home")
    monkeypatch.setattr(control, "LOG_MAX_BYTES", 20_000, raising=False)
    control.setup_logging(home, to_stderr=False)
    log = logging.getLogger("agent_bridge.identity")
    for i in range(2_000):  # what 1,000 connections that say hello and leave write, ~270 KB
        log.info("session codex-p connected (%08d, no host session id, new)", i)
        log.info("session codex-p left without a host identity or a tool call; nothing kept")
    kept = sorted(p.name for p in home.iterdir() if p.name.startswith(paths.LOG_NAME))
    assert kept == [paths.LOG_NAME, paths.LOG_NAME + ".1"]
    total = sum((home / name).stat().st_size for name in kept)
    assert total <= 2 * control.LOG_MAX_BYTES, f"{total} bytes of log for a {control.LOG_MAX_BYTES}-byte cap"
    assert "(00001999," in (home / paths.LOG_NAME).read_text()  # the newest line is in broker.log itself
    assert all((home / name).stat().st_mode & 0o777 == 0o600 for name in kept)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads a process's open files through /proc")
def test_a_detached_brokers_stdout_and_stderr_follow_the_rotation(env, home):
    """A detached broker's stdout and stderr are broker.log: after the log rotates, what it
    writes there (a crash traceback) goes to the new broker.log, not to broker.log.1."""
    log = paths.log_path(paths.ensure_home(home))
    # full: the next line rotates it
    log.write_bytes(b"an older broker's line\n" * (control.LOG_MAX_BYTES // 23 + 1))
    log.chmod(0o600)
    started = run_cli(env, "up", "--detach")
    assert started.returncode == 0, started.stderr
    record = paths.read_broker_json(home)
    assert record is not None
    pid = record["pid"]
    try:
        rotated = home / (paths.LOG_NAME + ".1")
        # A line in the new broker.log: the rotation is over, the broker runs on.
        wait_until(
            lambda: rotated.exists() and log.exists() and log.stat().st_size > 0, what="broker.log rotated"
        )
        assert {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (1, 2)} == {1: str(log), 2: str(log)}
    finally:
        run_cli(env, "down")

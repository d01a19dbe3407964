"""SPEC §8 "Local surface": `down`, `status` and `dashboard` trust only a broker confirmed by
its lock; a state folder owned by another user is refused by every command, untouched."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from agent_bridge import paths
from tests.conftest import CLI, run_cli

pytestmark = pytest.mark.slow

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a folder owned by another uid needs root to set up")


def stale_record(home: Path, pid: int) -> None:
    """What a broker killed with -9 leaves behind, its pid since taken by another process."""
    paths.ensure_home(home)
    (home / paths.LOCK_NAME).touch(mode=0o600)
    (home / paths.BROKER_JSON).write_text(json.dumps(
        {"pid": pid, "socket": str(home / "broker.sock"), "web": "http://127.0.0.1:1", "startedAt": 0, "home": str(home)}
    ))
    (home / paths.DASHBOARD_URL).write_text("http://127.0.0.1:1/?t=stale")


def test_down_status_and_dashboard_never_take_a_stale_pid_for_the_broker(env, home):
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        stale_record(home, sleeper.pid)
        down = run_cli(env, "down")
        assert down.returncode == 0, down.stderr
        assert "no broker is running" in down.stdout
        assert sleeper.poll() is None, "down signalled a process that is not the broker"

        status = json.loads(run_cli(env, "status", "--json").stdout)
        assert status["running"] is False
        assert "error" not in status, status  # no "broker pid N does not answer": there is no broker

        dashboard = subprocess.Popen([*CLI, "dashboard"], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = dashboard.stdout.readline().strip()
        finally:
            dashboard.terminate()
            dashboard.wait(timeout=30)
        assert first.startswith("http://127.0.0.1:") and "stale" not in first, first  # it serves the page itself
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_down_still_stops_a_real_broker(env, home):
    assert run_cli(env, "up", "--detach").returncode == 0
    pid = paths.read_broker_json(home)["pid"]
    down = run_cli(env, "down")
    assert down.returncode == 0 and f"pid {pid}" in down.stdout, down.stdout + down.stderr
    assert paths.read_broker_json(home) is None


# --- a folder owned by another user ------------------------------------------------------------


def planted_home(home: Path) -> dict[str, bytes]:
    """`home` as another user would leave it for us: theirs, with their bridge.db in it."""
    import apsw

    from agent_bridge.store.schema import CURRENT_VERSION, STEPS

    home.mkdir(mode=0o755)
    db = apsw.Connection(str(home / "bridge.db"))
    for step in STEPS[:CURRENT_VERSION]:
        db.execute(step)
    db.close()
    nobody = pwd.getpwnam("nobody")
    for p in (home, *home.iterdir()):
        os.chown(p, nobody.pw_uid, nobody.pw_gid)
    return snapshot(home)


def snapshot(home: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(home.iterdir())}


@needs_root
@pytest.mark.parametrize("argv, stdin", [
    (["up"], None),
    (["up", "--detach"], None),
    (["mcp", "--project", "/w/x"], ""),
    (["hook", "session-start"], '{"session_id": "s1", "cwd": "/w/x", "source": "startup"}'),
    (["hook", "stop", "--agent", "codex"], '{"session_id": "s1", "cwd": "/w/x"}'),
    (["decisions"], None),
    (["dashboard"], None),
    (["status"], None),
    (["down"], None),
])
def test_a_folder_owned_by_another_user_is_refused_and_left_untouched(env, home, argv, stdin):
    before = planted_home(home)
    done = subprocess.run([*CLI, *argv], env=env, input=stdin, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    assert str(home) in done.stderr and "belongs to uid" in done.stderr, done.stderr
    assert done.stdout == "", done.stdout  # no note, no block, no URL, no decisions
    assert done.returncode == (0 if argv[0] == "hook" else 1)
    assert snapshot(home) == before, "something was created or changed in the other user's folder"

"""`agent-bridge up | down | status` as a user runs them (SPEC §2, §8)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from agent_bridge.broker import control, root
from agent_bridge.common import config, paths
from agent_bridge.store.schema import CURRENT_VERSION
from tests.conftest import CLI, BrokerProcess, run_cli, wait_until

pytestmark = pytest.mark.slow


def test_up_detach_status_down(env, home):
    started = run_cli(env, "up", "--detach")
    assert started.returncode == 0, started.stderr
    record = json.loads((home / "broker.json").read_text())
    assert set(record) >= {"pid", "socket", "web", "startedAt"}
    assert isinstance(record["pid"], int) and isinstance(record["startedAt"], int)
    assert record["socket"] == str(home / "broker.sock")
    assert "agent-bridge install --claude" in started.stdout and "Codex" in started.stdout
    try:
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert stat.S_IMODE(os.stat(record["socket"]).st_mode) == 0o600
        status = json.loads(run_cli(env, "status", "--json").stdout)
        assert (
            status["running"] is True
            and status["pid"] == record["pid"]
            and status["schemaVersion"] == CURRENT_VERSION
        )
        second = run_cli(env, "up", "--detach")  # "make sure it is up" (SPEC §2)
        assert second.returncode == 0 and f"already running for {home} (pid {record['pid']})" in second.stdout
        foreground = run_cli(env, "up")
        assert foreground.returncode == 1 and "already running" in foreground.stderr
    finally:
        stopped = run_cli(env, "down")
    assert stopped.returncode == 0, stopped.stderr
    assert not (home / "broker.json").exists()  # removed on clean exit
    assert not os.path.exists(record["socket"])
    assert json.loads(run_cli(env, "status", "--json").stdout)["running"] is False
    assert "no broker" in run_cli(env, "down").stdout


def test_up_detach_starts_one_when_the_lock_it_waited_on_goes_free(env, home, tmp_path):
    """Two MCP servers start a broker at once after a crash: one `up --detach` finds the lock held
    by the other between its probe and its child's lock. When the lock goes free and nothing
    answers, it starts one itself (it used to say "the broker that was starting exited")."""
    import fcntl
    import socket

    home.mkdir(parents=True, exist_ok=True)
    lock = os.open(home / paths.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other starter, which then gives up
    address = str(tmp_path / "starting.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen()
    listener.settimeout(60)
    paths.write_private(home / "broker.json", json.dumps({"pid": os.getpid(), "socket": address}))
    waiting = subprocess.Popen([*CLI, "up", "--detach"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        asked, _ = listener.accept()  # its ping: it waits on the lock's holder to answer
        os.close(lock)
        asked.close()
        listener.close()
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        record = paths.running_broker(home)
        assert record is not None and record["pid"] != os.getpid()
        assert f"broker running (pid {record['pid']})" in out
    finally:
        if waiting.poll() is None:
            waiting.kill()
        run_cli(env, "down")


# A broker as `agent-bridge up` runs one (the lock for its whole life, then the real run_broker),
# held between the two until the test lets it go on: a broker caught starting, for as long as
# the test needs, with no gap in which the lock is free.
# (The modules by their names here, so that the script follows them wherever they move.)
GATED_BROKER = f"""
import sys
from functools import partial

import trio

import {config.__name__} as config
import {paths.__name__} as paths
from {control.__name__} import BrokerLock
from {root.__name__} import run_broker

home = paths.writable_home(paths.home())
assert BrokerLock(home).acquire()
sys.stdin.readline()  # the test lets it come up
trio.run(partial(run_broker, home, config.load(home)))
"""


def test_down_waits_for_a_broker_still_starting_then_stops_it(env, home):
    """`down` while a broker holds the lock and is not ready yet (a relay starting one right
    after the last one stopped): `down` used to find no broker.json, say none runs, and the
    broker came up after it and stayed. It waits for that broker, then stops it."""
    starting = subprocess.Popen([sys.executable, "-c", GATED_BROKER], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    down = None
    try:
        wait_until(lambda: paths.lock_holder(home) == starting.pid, what="the starting broker's lock")
        down = subprocess.Popen([*CLI, "down"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        assert down.stdout is not None and starting.stdin is not None
        # it saw the broker starting (the lock held, no broker.json) and waits for it
        said = down.stdout.readline()
        assert said == f"agent-bridge: a broker (pid {starting.pid}) is starting; waiting for it to stop it\n"
        assert paths.read_broker_json(home) is None
        starting.stdin.write("\n")  # now it comes up
        starting.stdin.flush()
        out, err = down.communicate(timeout=60)
        assert down.returncode == 0, err
        assert f"agent-bridge: broker (pid {starting.pid}) stopped" in out
        assert starting.wait(timeout=30) == 0, starting.stderr.read() if starting.stderr else ""
        assert paths.lock_holder(home) is None and not (home / "broker.json").exists()
    finally:
        for proc in (starting, down):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def test_down_says_so_when_a_starting_broker_gives_up(env, home):
    """The lock's holder lets it go without becoming ready (a broker that could not start):
    `down` stops waiting and says no broker runs."""
    starting = subprocess.Popen([sys.executable, "-c", GATED_BROKER], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    down = None
    try:
        wait_until(lambda: paths.lock_holder(home) == starting.pid, what="the starting broker's lock")
        down = subprocess.Popen([*CLI, "down"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        assert down.stdout is not None
        assert "is starting; waiting for it to stop it" in down.stdout.readline()
        starting.kill()  # it never becomes ready; the kernel lets the lock go
        starting.wait(timeout=30)
        out, err = down.communicate(timeout=60)
        assert (down.returncode, out, err) == (0, "agent-bridge: no broker is running\n", "")
    finally:
        for proc in (starting, down):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def test_a_killed_broker_does_not_block_the_next(env, home):
    first = BrokerProcess(env, home).start()
    first.kill()  # SIGKILL: broker.json and the socket are left behind
    assert (home / "broker.json").exists()
    assert json.loads(run_cli(env, "status", "--json").stdout)["running"] is False
    second = BrokerProcess(env, home).start()
    try:
        assert paths.read_broker_json(home)["pid"] == second.pid
    finally:
        assert second.stop() == 0
    assert not (home / "broker.json").exists()


def test_sigterm_and_sigint_shut_down_gracefully(env, home):
    for sig in (signal.SIGTERM, signal.SIGINT):
        b = BrokerProcess(env, home).start()
        b.proc.send_signal(sig)
        assert b.proc.wait(timeout=30) == 0
        assert not (home / "broker.json").exists()
    log = (home / "broker.log").read_text()
    assert "SIGTERM" in log and "SIGINT" in log


def test_bad_hop_limit_is_refused_with_a_clear_error(env, home):
    out = run_cli({**env, "AGENT_BRIDGE_HOP_LIMIT": "0"}, "up")
    assert out.returncode == 2 and "AGENT_BRIDGE_HOP_LIMIT" in out.stderr and "1..100" in out.stderr
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("hop_limit = 'lots'\n")
    out = run_cli(env, "up")
    assert out.returncode == 2 and "hop_limit" in out.stderr
    (home / "config.toml").write_text("hop_limt = 3\n")
    out = run_cli(env, "up")
    assert out.returncode == 2 and "unknown setting 'hop_limt'" in out.stderr


@pytest.mark.parametrize("value", ["0", "65", "true", "'4'", "2.5"])
def test_a_bad_max_jobs_is_refused_with_a_clear_error(env, home, value):
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f"max_jobs = {value}\n")
    out = run_cli(env, "up")
    err = out.stderr.strip()
    assert out.returncode == 2 and "max_jobs: expected a whole number from 1 to 64" in err, err
    assert not (home / "broker.json").exists()


def test_newer_database_is_refused_at_start(env, home):
    import apsw

    home.mkdir(parents=True)
    conn = apsw.Connection(str(home / "bridge.db"))
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    proc = subprocess.run([*CLI, "up"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "version 99" in proc.stderr and "newer" in proc.stderr
    assert "Traceback" not in proc.stderr  # a refusal, said plainly
    assert not (home / "broker.json").exists()


def test_bad_dashboard_port_is_refused_plainly(env, home):
    out = run_cli({**env, "AGENT_BRIDGE_WEB_PORT": "web"}, "up")
    assert out.returncode == 1
    assert "AGENT_BRIDGE_WEB_PORT" in out.stderr and "Traceback" not in out.stderr
    assert not (home / "broker.json").exists()


def test_long_home_path_puts_the_socket_in_the_runtime_dir(env, tmp_path):
    long_home = tmp_path / ("h" * 60) / ("o" * 60)
    e = {**env, "AGENT_BRIDGE_HOME": str(long_home)}
    b = BrokerProcess(e, long_home).start()
    try:
        sock = paths.read_broker_json(long_home)["socket"]
        assert len(os.fsencode(sock)) <= paths.SOCKET_PATH_MAX
        assert not sock.startswith(str(long_home))
        assert stat.S_IMODE(os.stat(os.path.dirname(sock)).st_mode) == 0o700
    finally:
        b.stop()
    wait_until(lambda: not os.path.exists(sock), what="socket removed")


def test_help_for_every_command():
    for command in ("up", "down", "status", "mcp", "dashboard", "decisions", "install", "doctor", "demo",
                    "decide", "send", "sent", "retract", "sessions", "forget"):
        out = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "usage:" in out.stdout
    bad = subprocess.run([*CLI, "frobnicate"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr

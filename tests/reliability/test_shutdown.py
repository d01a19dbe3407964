"""SPEC §8 "Shutdown is graceful": the store outlives the connections, so every session
connected when the broker stops has its last-seen time written, and nothing fails in
broker.log; a stop asked for during a slow start (a migration and its backup) is honoured
without the broker ever becoming ready."""

from __future__ import annotations

import signal
import socket
import subprocess

import apsw
import pytest

from agent_bridge.common import paths
from tests.conftest import CLI, wait_until
from tests.reliability.test_surrogates import raw_frame
from tests.test_pipelining import read_frames
from tests.test_store import build_v2

pytestmark = pytest.mark.slow


def last_seen(home, name: str) -> int:
    conn = apsw.Connection(str(home / "bridge.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute("SELECT last_seen_at FROM peers WHERE name = ?", (name,)).fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("how", ["SIGTERM", "down"])
def test_stopping_writes_every_connected_sessions_last_seen_and_logs_no_error(broker, env, home, how):
    sock_path = broker.status()["socket"]
    names = [f"stay-{i}" for i in range(3)]
    connections = []
    try:
        for name in names:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(30)
            s.connect(sock_path)
            s.sendall(raw_frame(f'{{"v":1,"id":1,"op":"hello","agent":"codex","project":"/w/stop","name":"{name}"}}'))
            assert read_frames(s, 1)[0]["ok"]
            connections.append(s)
        joined = {name: last_seen(home, name) for name in names}
        log_before = (home / "broker.log").read_text()
        if how == "SIGTERM":
            assert broker.stop() == 0
        else:
            assert subprocess.run([*CLI, "down"], env=env, capture_output=True, timeout=60).returncode == 0
            broker.proc.wait(timeout=30)
    finally:
        for s in connections:
            s.close()
    log = (home / "broker.log").read_text()[len(log_before):]
    for name in names:
        assert last_seen(home, name) > joined[name], f"{name}'s last-seen time was not written"
    assert "could not record" not in log and " ERROR " not in log and "Traceback" not in log, log
    assert "broker stopped" in log
    assert paths.read_broker_json(home) is None


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def test_ctrl_c_during_a_slow_start_is_honoured(env, home):
    paths.ensure_home(home)
    build_v2(home / "bridge.db")  # an upgrade, with its backup, stands before ready
    proc = subprocess.Popen([*CLI, "up"], env={**env, "AGENT_BRIDGE_FAULT": "upgrade:after-backup/stop"},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: proc_state(proc.pid) == "T", what="the broker to stand still in its upgrade")
        proc.send_signal(signal.SIGINT)  # pending until it runs again
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    log = (home / "broker.log").read_text()
    assert proc.returncode == 0, err.decode()
    assert "broker ready" not in log, "the broker finished starting although it was asked to stop"
    assert b"Traceback" not in err, err.decode()
    assert paths.read_broker_json(home) is None

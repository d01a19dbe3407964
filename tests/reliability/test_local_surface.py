"""SPEC §8 "Local surface": `down`, `status` and `dashboard` trust only a broker confirmed by
its lock; a state folder owned by another user is refused by every command, untouched."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
from pathlib import Path

import pytest

from agent_bridge.common import paths
from tests.conftest import CLI, run_cli

pytestmark = pytest.mark.slow

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a folder owned by another uid needs root to set up"
)


def stale_record(home: Path, pid: int) -> None:
    """What a broker killed with -9 leaves behind, its pid since taken by another process."""
    paths.ensure_home(home)
    (home / paths.LOCK_NAME).touch(mode=0o600)
    (home / paths.BROKER_JSON).write_text(
        json.dumps(
            {
                "pid": pid,
                "socket": str(home / "broker.sock"),
                "web": "http://127.0.0.1:1",
                "startedAt": 0,
                "home": str(home),
            }
        )
    )
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
        # it serves the page itself
        assert first.startswith("http://127.0.0.1:") and "stale" not in first, first
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
    (["sessions"], None),
    (["decide", "deploy", "run the script"], None),
    (["send", "claude-x", "hello"], None),
    (["retract", "deploy"], None),
    (["forget", "claude-x"], None),
    (["doctor"], None),
])
def test_a_folder_owned_by_another_user_is_refused_and_left_untouched(env, home, argv, stdin):
    before = planted_home(home)
    done = subprocess.run([*CLI, *argv], env=env, input=stdin, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == (0 if argv[0] == "hook" else 1)
    if argv[0] == "doctor":  # a report on stdout: the folder refused, nothing in it read
        assert str(home) in done.stdout and "belongs to uid" in done.stdout, done.stdout
        for check in ("broker", "socket", "schema", "dashboard"):
            assert re.search(
                rf"^  skip  {check} +not read: the state folder is not yours$", done.stdout, re.M
            ), done.stdout
    else:
        assert str(home) in done.stderr and "belongs to uid" in done.stderr, done.stderr
        assert done.stdout == "", done.stdout  # no note, no block, no URL, no decisions
    assert snapshot(home) == before, "something was created or changed in the other user's folder"


@needs_root
def test_demo_with_another_users_folder_as_home_is_refused_before_anything(env, home):
    before = planted_home(home)
    done = run_cli(env, "demo", "--no-wait", "--home", str(home), timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(home) in lines[0] and "belongs to uid" in lines[0], done.stderr
    assert done.stdout == "", done.stdout  # no "Starting a broker", no warning that it will write there
    assert snapshot(home) == before


# --- the dashboard's connections ---------------------------------------------------------------

FLOOD = 1100  # more than the common 1024 open-files limit


def hold_connections(port: int, ready_w: int, done_r: int) -> dict[str, int]:
    """In a child running as `nobody`: open FLOOD tokenless connections to the dashboard, each
    sending one request, and keep them all until told; then count those the server closed."""
    import socket as sk

    conns = []
    refused = 0
    for _ in range(FLOOD):
        s = sk.socket(sk.AF_INET, sk.SOCK_STREAM)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /api/sessions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
        except OSError:
            refused += 1
        conns.append(s)
    os.write(ready_w, b"r")
    os.read(done_r, 1)
    closed = 0
    for s in conns:
        try:
            s.setblocking(False)
            while True:
                if not s.recv(65536):  # EOF: the server closed it
                    closed += 1
                    break
        except BlockingIOError:
            pass  # still open
        except OSError:
            closed += 1  # reset by the server
        s.close()
    return {"closed_by_server": closed, "refused": refused}


def fork_as_nobody(fn, *args):
    """Fork; the child raises its open-files limit (as root), drops to `nobody` and runs
    fn(*args), writing its JSON result to a pipe. Returns (pid, result pipe)."""
    import resource

    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_end)
            resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result = {"raised": repr(exc)}
            code = 1
        os.write(write_end, json.dumps(result).encode())
        os._exit(code)
    os.close(write_end)
    return pid, read_end


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@needs_root
async def test_tokenless_connections_from_another_uid_cannot_exhaust_the_broker(env, home):
    import resource

    import trio

    from tests.conftest import BrokerProcess, call, mcp_session

    def low_limit() -> None:  # the common default soft limit; the broker may raise it to the hard one
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    broker = BrokerProcess(env, home)
    broker.proc = subprocess.Popen([*CLI, "up"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # noqa: ASYNC220
                                   stderr=subprocess.PIPE, preexec_fn=low_limit)
    try:
        from tests.conftest import wait_until

        wait_until(lambda: (paths.read_broker_json(home) or {}).get("web"), what="broker ready")
        port = int(paths.read_broker_json(home)["web"].rsplit(":", 1)[1])
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        child, result_r = fork_as_nobody(hold_connections, port, ready_w, done_r)
        try:
            assert os.read(ready_r, 1) == b"r"
            held = open_fds(broker.pid)
            with trio.fail_after(60):
                async with mcp_session(env, "--project", "/w/flood") as s:
                    assert (await call(s, "whoami"))["project"] == "/w/flood"
        finally:
            os.write(done_w, b"d")
            result = json.loads(os.read(result_r, 65536))
            os.waitpid(child, 0)  # noqa: ASYNC222 - it has written its result: it is exiting
    finally:
        broker.kill()
    from agent_bridge.dashboard.server import MAX_CONNECTIONS

    assert "raised" not in result, result
    assert held < 200 + MAX_CONNECTIONS, f"the broker holds {held} descriptors with {FLOOD} idle clients"
    assert result["closed_by_server"] >= FLOOD - MAX_CONNECTIONS, result
    log = (home / "broker.log").read_text()
    assert "EMFILE" not in log and "Too many open files" not in log


@pytest.mark.parametrize("request_bytes, status", [
    (b"NOT A REQUEST LINE\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
])
def test_the_servers_own_error_answers_carry_the_security_headers(broker, request_bytes, status):
    import socket

    from agent_bridge.dashboard.auth import SECURITY_HEADERS

    port = int(broker.status()["web"].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            s.sendall(request_bytes)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered before reading everything
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := s.recv(65536)):
            answer += chunk
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    assert head.startswith(f"http/1.1 {status}"), head
    for name, value in SECURITY_HEADERS.items():
        assert f"{name.lower()}: {value.lower()}" in head, (name, head)

"""`agent-bridge dashboard` as a real process (SPEC §1, §2): prints the running broker's URL, or
serves the same app itself, read-only, until Ctrl-C."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import stat
import sys
from pathlib import Path

import httpx
import pytest
import trio
from webfixtures import (
    AGENT_BRIDGE,
    TIMEOUT,
    build_database,
    build_old_database,
    standalone_env,
    start_standalone,
)

from agent_bridge.dashboard.standalone import OPEN_PAGE

pytestmark = pytest.mark.slow


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes() if sys.platform == "linux" else b""


_held_locks: list[int] = []


@pytest.fixture(autouse=True)
def _release_locks():
    yield
    while _held_locks:
        os.close(_held_locks.pop())


def pretend_broker(home: Path, record: dict) -> None:
    """This test process as the home's running broker: its record, and its lock held (a record
    alone is not trusted: it may be left by a broker killed long ago)."""
    import fcntl

    (home / "broker.json").write_text(json.dumps(record))
    fd = os.open(home / "broker.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _held_locks.append(fd)


async def get(base: str, token: str, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base, headers={"Cookie": f"ab_ui={token}"}) as client:
        return await client.get(path)


async def test_serves_itself_when_no_broker_runs(nursery: trio.Nursery, web_home: Path) -> None:
    with trio.fail_after(TIMEOUT):
        dash = await start_standalone(nursery, standalone_env(web_home))
        assert dash.url.startswith("http://127.0.0.1:") and "/?t=" in dash.url
        url_file = web_home / "dashboard.url"
        assert url_file.read_text() == dash.url
        assert stat.S_IMODE(url_file.stat().st_mode) == 0o600
        assert dash.token.encode() not in cmdline(dash.process.pid)  # never on a command line

        async with httpx.AsyncClient() as client:
            response = await client.get(dash.url)
        assert response.status_code == 303 and response.headers["location"] == "/"
        assert (await get(dash.base, "wrong", "/api/decisions")).status_code == 403
        status = (await get(dash.base, dash.token, "/api/status")).json()
        assert status["mode"] == "standalone" and status["home"] == str(web_home)
        for path, body in {
            "/api/decisions": {"decisions": []},
            "/api/decisions/build%20%2F%20ci/history": {
                "topic": "build / ci",
                "decisions": [],
                "retractions": [],
            },
            "/api/sessions": {"sessions": []},
            "/api/messages": {"messages": []},
        }.items():
            response = await get(dash.base, dash.token, path)
            assert (response.status_code, response.json()) == (200, body), path

        assert await dash.stop(signal.SIGINT) == 0
    assert not url_file.exists()
    assert not (web_home / "bridge.db").exists()
    assert b"no broker is running" in b"".join(dash.stderr_chunks)


async def test_serves_the_data_with_percent_encoded_topics(nursery: trio.Nursery, web_home: Path) -> None:
    facts = build_database(web_home)
    with trio.fail_after(TIMEOUT):
        dash = await start_standalone(nursery, standalone_env(web_home))
        decisions = (await get(dash.base, dash.token, "/api/decisions")).json()["decisions"]
        assert decisions == facts.current()
        history = (await get(dash.base, dash.token, "/api/decisions/BUILD%20%2F%20CI/history")).json()
        assert history == {"topic": "build / ci", "decisions": facts.history("build / ci"), "retractions": []}
        history = (await get(dash.base, dash.token, "/api/decisions/caf%C3%A9/history")).json()
        assert history["topic"] == "café" and len(history["decisions"]) == 1
        sessions = (await get(dash.base, dash.token, "/api/sessions")).json()["sessions"]
        assert {s["name"] for s in sessions} == set(facts.peers)
        assert not any(s["connected"] for s in sessions)  # no broker: nothing is connected
        assert await dash.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize("version", [1, 2])
async def test_old_schema_database(nursery: trio.Nursery, web_home: Path, version: int) -> None:
    build_old_database(web_home, version)
    with trio.fail_after(TIMEOUT):
        dash = await start_standalone(nursery, standalone_env(web_home))
        assert (await get(dash.base, dash.token, "/api/decisions")).json() == {"decisions": []}
        history = await get(dash.base, dash.token, "/api/decisions/x%2Fy/history")
        assert history.json() == {"topic": "x/y", "decisions": [], "retractions": []}
        sessions = (await get(dash.base, dash.token, "/api/sessions")).json()["sessions"]
        assert [s["name"] for s in sessions] == ["claude-old", "codex-old"]
        assert await dash.stop() == 0
    conn_version = (web_home / "bridge.db").read_bytes()[60:64]  # the header's user_version
    assert int.from_bytes(conn_version, "big") == version  # never migrated


async def test_prints_the_url_of_a_running_broker(web_home: Path) -> None:
    url = "http://127.0.0.1:7878/?t=published-by-the-broker"
    pretend_broker(web_home, {"pid": os.getpid(), "socket": "x", "web": "http://127.0.0.1:7878"})
    (web_home / "dashboard.url").write_text(url)
    with trio.fail_after(TIMEOUT):
        result = await trio.run_process(
            [str(AGENT_BRIDGE), "dashboard"],
            env=standalone_env(web_home),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert (result.returncode, result.stdout.decode(), result.stderr.decode()) == (0, url + "\n", "")
    assert (web_home / "dashboard.url").read_text() == url  # left alone


async def test_running_broker_without_dashboard_url_says_so(web_home: Path) -> None:
    pretend_broker(web_home, {"pid": os.getpid(), "socket": "x"})
    with trio.fail_after(TIMEOUT):
        result = await trio.run_process(
            [str(AGENT_BRIDGE), "dashboard"],
            env=standalone_env(web_home),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1 and result.stdout == b""
    assert b"dashboard.url is missing" in result.stderr


async def test_a_stale_broker_record_is_ignored(nursery: trio.Nursery, web_home: Path) -> None:
    finished = await trio.lowlevel.open_process([sys.executable, "-c", "pass"])
    await finished.wait()
    (web_home / "broker.json").write_text(json.dumps({"pid": finished.pid, "socket": "x"}))
    (web_home / "dashboard.url").write_text("http://127.0.0.1:1/?t=stale")
    with trio.fail_after(TIMEOUT):
        dash = await start_standalone(nursery, standalone_env(web_home))
        assert "stale" not in dash.url
        assert (await get(dash.base, dash.token, "/api/status")).json()["mode"] == "standalone"
        assert await dash.stop() == 0


@pytest.mark.parametrize("value", ["web", "99999", "-5"])
async def test_an_invalid_port_setting_is_a_clear_error(web_home: Path, value: str) -> None:
    with trio.fail_after(TIMEOUT):
        result = await trio.run_process(
            [str(AGENT_BRIDGE), "dashboard"], env=standalone_env(web_home, AGENT_BRIDGE_WEB_PORT=value),
            capture_stdout=True, capture_stderr=True, check=False,
        )
    assert result.returncode == 1 and result.stdout == b""
    assert (
        f"AGENT_BRIDGE_WEB_PORT: expected a port number 0..65535 (0 = any free port), got '{value}'".encode()
        in result.stderr
    )


@pytest.mark.parametrize("broker_running", [False, True])
async def test_open_hands_the_browser_a_private_redirect_page_not_the_token(
    nursery: trio.Nursery, web_home: Path, tmp_path: Path, broker_running: bool
) -> None:
    """`--open` through $BROWSER (which webbrowser honours): a recorder that reports its argv."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    recorder = tmp_path / "browser"
    recorder.write_text(
        f"#!{sys.executable}\nimport socket, sys\n"
        f"socket.create_connection(('127.0.0.1', {port})).sendall('\\0'.join(sys.argv[1:]).encode())\n"
    )
    recorder.chmod(0o755)
    env = standalone_env(web_home, BROWSER=str(recorder))
    if broker_running:
        url = "http://127.0.0.1:7878/?t=published-by-the-broker"
        pretend_broker(web_home, {"pid": os.getpid(), "socket": "x"})
        (web_home / "dashboard.url").write_text(url)
    with trio.fail_after(TIMEOUT):
        if broker_running:
            result = await trio.run_process([str(AGENT_BRIDGE), "dashboard", "--open"], env=env,
                                            capture_stdout=True, check=False)
            assert (result.returncode, result.stdout.decode()) == (0, url + "\n")
        else:
            dash = await start_standalone(nursery, env, "--open")
            url = dash.url
        stream = await listeners[0].accept()
        argv = b""
        while chunk := await stream.receive_some(4096):
            argv += chunk
        await stream.aclose()
        if not broker_running:
            assert await dash.stop() == 0
    page = web_home / OPEN_PAGE
    assert argv.decode().split("\0") == [page.as_uri()]
    token = url.split("?t=", 1)[1]
    assert token.encode() not in argv
    if broker_running:  # the standalone dashboard's token is dead once it stopped; the page stays
        assert stat.S_IMODE(page.stat().st_mode) == 0o600
        text = page.read_text()
        assert f'<meta http-equiv="refresh" content="0; url={url}">' in text
    for listener in listeners:
        await listener.aclose()


# --- no handler can write: the database is read-only for the dashboard process ---------------

CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER = 1, 2, 3
PR_CAPBSET_DROP = 24


def without_file_capabilities() -> None:
    """preexec_fn: as root, drop the capabilities that bypass file permissions, so that mode bits
    bind this process as they bind any user (tests run as root; chmod alone would not stop it)."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.skipif(sys.platform != "linux", reason="capabilities and mode bits as on Linux")
async def test_every_endpoint_answers_from_a_read_only_database(
    nursery: trio.Nursery, web_home: Path
) -> None:
    facts = build_database(web_home)
    before = freeze(web_home)
    try:
        with trio.fail_after(TIMEOUT):
            dash = await start_standalone(
                nursery, standalone_env(web_home), preexec_fn=without_file_capabilities
            )
            answers = {}
            for path in (
                "/api/status",
                "/api/decisions",
                "/api/decisions?q=nox&scope=all",
                "/api/decisions/build%20%2F%20ci/history",
                "/api/sessions",
                "/api/messages",
                "/",
                "/static/app.js",
            ):
                response = await get(dash.base, dash.token, path)
                answers[path] = response.status_code
                if path == "/api/decisions":
                    assert response.json() == {"decisions": facts.current()}
                if path == "/api/messages":
                    assert len(response.json()["messages"]) == 3
            assert set(answers.values()) == {200}, answers
            assert await dash.stop() == 0
    finally:
        after = thaw(web_home)
    # It could not even publish dashboard.url, and said so; it printed the URL instead.
    stderr = b"".join(dash.stderr_chunks).decode()
    assert "cannot write" in stderr and "dashboard.url" in stderr
    assert after == before  # same files, same bytes


def freeze(home: Path) -> dict[str, str]:
    """Make the home and its database read-only (owner r-x / r--); return what they hold."""
    state = snapshot(home)
    assert list(state) == ["bridge.db"]  # WAL checkpointed by the broker: no -wal, no -shm
    (home / "bridge.db").chmod(0o400)
    home.chmod(0o500)
    return state


def thaw(home: Path) -> dict[str, str]:
    home.chmod(0o700)
    (home / "bridge.db").chmod(0o600)
    return snapshot(home)


def snapshot(home: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(home.iterdir())}

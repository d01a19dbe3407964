"""SPEC §2, §6, §8: the state folder is 0700 and what is in it is this user's alone; another uid
cannot talk to the broker (the socket's mode refuses it, and behind that the broker checks the
peer's uid with SO_PEERCRED); the dashboard token is never on a command line or in broker.log.

Tests run as root (here and in CI): a forked child drops to `nobody` to be the other user."""

from __future__ import annotations

import json
import os
import pwd
import socket
import stat
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_bridge.common import paths
from tests.conftest import CLI, run_cli, wait_until
from tests.reliability.harness import all_cmdlines

pytestmark = pytest.mark.slow

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
PING = struct.pack(">I", 26) + b'{"v":1,"id":1,"op":"ping"}'


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_state_folder_socket_and_files_are_private(env, home):
    started = run_cli(env, "up", "--detach")
    assert started.returncode == 0, started.stderr
    try:
        record = paths.read_broker_json(home)
        assert mode(home) == 0o700
        assert mode(record["socket"]) == 0o600
        wait_until(lambda: (home / "dashboard.url").exists(), what="dashboard.url")
        for name in ("dashboard.url", "broker.json", "broker.log", "bridge.db", "broker.lock"):
            assert mode(home / name) == 0o600, name
        for extra in home.glob("bridge.db-*"):  # the WAL files
            assert mode(extra) == 0o600, extra.name
    finally:
        assert run_cli(env, "down").returncode == 0


def test_an_existing_loose_home_is_tightened(env, home):
    home.mkdir(parents=True, mode=0o755)
    home.chmod(0o755)
    started = run_cli(env, "up", "--detach")
    try:
        assert started.returncode == 0, started.stderr
        assert mode(home) == 0o700
    finally:
        run_cli(env, "down")


# --- another uid ------------------------------------------------------------------------------


def as_nobody(fn: Callable[[], Any]) -> Any:
    """Run `fn` in a forked child that has dropped to uid/gid `nobody`; returns its JSON result."""
    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no Trio, only the standard library
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            assert os.getuid() == nobody.pw_uid and os.geteuid() == nobody.pw_uid
            result = {"uid": os.getuid(), "result": fn()}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result = {"raised": type(exc).__name__, "errno": getattr(exc, "errno", None), "text": str(exc)}
        try:
            os.write(write_end, json.dumps(result).encode())
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(b"".join(chunks))


def ping_over(sock_path: str) -> Callable[[], Any]:
    """Connect, send a ping, read until the broker answers or closes."""

    def attempt() -> Any:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(20)
            s.connect(sock_path)
            data = b""
            try:
                s.sendall(PING)
                while chunk := s.recv(65536):
                    data += chunk
                    if len(data) >= 4 and len(data) >= 4 + struct.unpack(">I", data[:4])[0]:
                        break
            except (ConnectionResetError, BrokenPipeError):
                pass  # closed by the broker before or after we wrote: refused either way
            return {"connected": True, "answer": data.decode("utf-8", "replace")}

    return attempt


@contextmanager
def loosened(*targets: tuple[Path | str, int]) -> Iterator[None]:
    """Temporarily open up modes (restored afterwards, whatever happens)."""
    saved = [(t, mode(t)) for t, _ in targets]
    try:
        for t, m in targets:
            os.chmod(t, m)
        yield
    finally:
        for t, m in reversed(saved):
            os.chmod(t, m)


@needs_root
def test_another_uid_is_refused_by_the_socket_mode(broker, home):
    sock_path = broker.status()["socket"]
    assert json.loads(ping_over(sock_path)()["answer"][4:])["result"] == "pong"  # this uid: served
    seen = as_nobody(ping_over(sock_path))
    assert seen.get("raised") == "PermissionError", seen  # the 0700 folder / 0600 socket stop it


@needs_root
def test_another_uid_is_refused_by_the_peer_uid_check(broker, home):
    """With the file modes opened up on purpose, the kernel lets `nobody` connect: the broker's
    own SO_PEERCRED check must then close the connection without serving anything."""
    sock_path = broker.status()["socket"]
    log_before = (home / "broker.log").read_text()
    with loosened((home.parent, 0o711), (home, 0o711), (sock_path, 0o666)):
        seen = as_nobody(ping_over(sock_path))
    assert seen.get("uid") == pwd.getpwnam("nobody").pw_uid, seen
    assert seen["result"] == {"connected": True, "answer": ""}, "the broker answered another uid"
    nobody_uid = pwd.getpwnam("nobody").pw_uid
    wait_until(
        lambda: (
            f"refused a connection from uid {nobody_uid}"
            in (home / "broker.log").read_text()[len(log_before) :]
        ),
        what="the refusal in broker.log",
    )
    assert broker.status()["pid"] == broker.pid  # and it goes on serving its own user


# --- the dashboard token --------------------------------------------------------------------


def token_of(home: Path) -> str:
    url = (home / "dashboard.url").read_text(encoding="utf-8").strip()
    token = url.split("?t=", 1)[1]
    assert len(token) >= 40
    return token


def assert_not_on_any_command_line(token: str) -> None:
    found = {pid: argv for pid, argv in all_cmdlines().items() if token.encode() in argv}
    assert not found, f"the dashboard token is on a command line: {found}"


def test_the_token_is_never_on_a_command_line_or_in_the_log(env, home, tmp_path):
    browser_argv = tmp_path / "browser-argv.json"
    fake_browser = tmp_path / "browser.py"
    fake_browser.write_text(  # what `--open` runs as the browser: records its own argv
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(browser_argv)!r}, 'w').write(json.dumps(sys.argv))\n",
        encoding="utf-8",
    )
    fake_browser.chmod(0o755)
    e = {**env, "BROWSER": str(fake_browser)}

    # 1. the broker, detached as a user starts it, and a real MCP server that started it
    assert run_cli(env, "up", "--detach").returncode == 0
    try:
        wait_until(lambda: (home / "dashboard.url").exists(), what="dashboard.url")
        token = token_of(home)
        assert_not_on_any_command_line(token)
        mcp = subprocess.Popen([*CLI, "mcp", "--project", "/w/token"], env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert_not_on_any_command_line(token)
            # 2. `dashboard` prints the URL; `dashboard --open` hands the browser a file, not the URL
            printed = run_cli(e, "dashboard")
            assert printed.returncode == 0 and token in printed.stdout
            opened = run_cli(e, "dashboard", "--open")
            assert opened.returncode == 0, opened.stderr
            argv = json.loads(browser_argv.read_text())
            assert argv[-1].startswith("file://") and token not in " ".join(argv)
            page = home / "dashboard-open.html"
            assert mode(page) == 0o600
            # 3. the token used for real: exchanged for the cookie
            response = httpx.get(printed.stdout.strip(), headers={"Sec-Fetch-Site": "none"}, timeout=20)
            assert response.status_code in (200, 303)
            assert_not_on_any_command_line(token)
        finally:
            mcp.stdin.close()
            mcp.wait(timeout=30)
    finally:
        run_cli(env, "down")
    log = (home / "broker.log").read_text(encoding="utf-8")
    assert "dashboard" in log or "broker ready" in log  # the log is there and was written
    assert token not in log, "the dashboard token is in broker.log"

    # 4. the standalone dashboard (no broker): a fresh token, also only in dashboard.url
    standalone = subprocess.Popen(
        [*CLI, "dashboard"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = standalone.stdout.readline().strip()
        second = url.split("?t=", 1)[1]
        assert second != token
        assert_not_on_any_command_line(second)
    finally:
        standalone.terminate()
        standalone.wait(timeout=30)
    assert second not in (home / "broker.log").read_text(encoding="utf-8")

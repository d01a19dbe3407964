"""SPEC §8, "Local surface, sockets" (issue 23, point 1): when `<home>/broker.sock` is too long
and XDG_RUNTIME_DIR is unset, the socket goes to `$TMPDIR/agent-bridge-<uid>/`. Another local
user (`nobody`, from a forked child, as in test_permissions) plays both attacks:

- deny: it creates that folder first; the owner must still get a broker;
- impersonate: it makes that folder a symlink to a folder the owner owns, or serves a socket of
  its own where the clients look; no client may send it a byte.

Tests run as root here and in CI; they need it to become `nobody`."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from agent_bridge.common import paths
from agent_bridge.ipc import blocking
from agent_bridge.ipc.client import BrokerGone, open_bridge_client
from tests.conftest import run_cli, wait_until
from tests.reliability.test_permissions import as_nobody, needs_root
from tests.test_delivery import RawHost

pytestmark = [pytest.mark.slow, needs_root]


@pytest.fixture
def tmp_root() -> Iterator[Path]:
    """A private stand-in for /tmp: world-writable and sticky, as /tmp is, inside a folder
    `nobody` can traverse; and a home whose socket path is too long for sun_path."""
    base = Path(tempfile.mkdtemp(prefix="ab-fb-"))
    try:
        base.chmod(0o755)
        shared = base / "tmp"
        shared.mkdir()
        shared.chmod(0o1777)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def long_env(env: dict[str, str], tmp_root: Path) -> dict[str, str]:
    home = tmp_root / ("h" * 60) / ("o" * 60) / "home"
    assert len(os.fsencode(str(home / paths.SOCKET_NAME))) > paths.SOCKET_PATH_MAX
    e = {**env, "AGENT_BRIDGE_HOME": str(home), "TMPDIR": str(tmp_root / "tmp")}
    e.pop("XDG_RUNTIME_DIR", None)
    return e


def preferred_folder(env: dict[str, str]) -> Path:
    return tmp_root_of(env) / f"agent-bridge-{os.getuid()}"


def tmp_root_of(env: dict[str, str]) -> Path:
    return Path(env["TMPDIR"])


def home_of(env: dict[str, str]) -> Path:
    return Path(env["AGENT_BRIDGE_HOME"])


@contextmanager
def broker_up(env: dict[str, str]) -> Iterator[dict[str, object]]:
    started = run_cli(env, "up", "--detach")
    assert started.returncode == 0, started.stderr
    try:
        record = paths.read_broker_json(home_of(env))
        assert record is not None
        yield record
    finally:
        assert run_cli(env, "down").returncode == 0


def doctor_line(env: dict[str, str], name: str) -> str:
    out = run_cli(env, "doctor").stdout
    found = [line for line in out.splitlines() if f"  {name}  " in line]
    assert found, out
    return found[0]


def test_a_folder_planted_by_another_user_does_not_deny_the_broker(long_env):
    planted = preferred_folder(long_env)
    seen = as_nobody(lambda: os.mkdir(planted, 0o755))
    assert "raised" not in seen, seen
    assert planted.stat().st_uid == pwd.getpwnam("nobody").pw_uid
    with broker_up(long_env) as record:
        sock = Path(str(record["socket"]))
        assert sock.parent != planted and sock.parent.parent == tmp_root_of(long_env)
        assert (
            stat.S_IMODE(sock.parent.lstat().st_mode) == 0o700 and sock.parent.lstat().st_uid == os.getuid()
        )
        assert blocking.call(home_of(long_env), "ping") == "pong"
        line = doctor_line(long_env, "socket folder")
        assert "FAIL" in line and f"belongs to uid {pwd.getpwnam('nobody').pw_uid}" in line, line
    # the planted folder was left as it was: not chmodded, nothing bound in it
    st = planted.lstat()
    assert st.st_uid == pwd.getpwnam("nobody").pw_uid and stat.S_IMODE(st.st_mode) == 0o755
    assert list(planted.iterdir()) == []
    assert not sock.parent.exists()  # the private folder made for that broker went with it


def test_a_symlinked_folder_is_never_followed_or_chmodded(long_env, tmp_root):
    victim = tmp_root / "victims-own"  # a folder the owner owns, readable by others
    victim.mkdir()
    victim.chmod(0o755)
    planted = preferred_folder(long_env)
    seen = as_nobody(lambda: os.symlink(victim, planted))
    assert "raised" not in seen, seen
    with broker_up(long_env) as record:
        sock = Path(str(record["socket"]))
        assert sock.parent not in (planted, victim) and not sock.parent.is_symlink()
        assert list(victim.iterdir()) == []  # nothing bound through the symlink
        assert stat.S_IMODE(victim.stat().st_mode) == 0o755  # and it was not chmodded through it
        assert blocking.call(home_of(long_env), "ping") == "pong"
        line = doctor_line(long_env, "socket folder")
        assert "FAIL" in line and "is a symlink" in line, line
    assert planted.is_symlink()


def test_a_loose_folder_of_our_own_is_tightened_and_used(long_env):
    mine = preferred_folder(long_env)
    mine.mkdir(mode=0o755)
    mine.chmod(0o755)
    with broker_up(long_env) as record:
        assert Path(str(record["socket"])).parent == mine
        assert stat.S_IMODE(mine.stat().st_mode) == 0o700
        assert "ok" in doctor_line(long_env, "socket folder")


# --- a server of another uid: no client sends it a byte -------------------------------------


@contextmanager
def nobody_server(folder: Path) -> Iterator[tuple[str, Path]]:
    """A listener run by `nobody` at `folder/evil.sock`; it writes, per connection it saw end,
    how many bytes the client sent (one line each) to `folder/seen`."""
    nobody = pwd.getpwnam("nobody")
    folder.mkdir(mode=0o755)
    os.chown(folder, nobody.pw_uid, nobody.pw_gid)
    sock_path, seen = str(folder / "evil.sock"), folder / "seen"
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attacker: standard library only
        try:
            os.close(ready_r)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(sock_path)
            os.chmod(sock_path, 0o777)
            server.listen(16)
            os.write(ready_w, b"1")
            while True:
                conn, _ = server.accept()
                total = 0
                conn.settimeout(10)
                try:
                    while chunk := conn.recv(65536):
                        total += len(chunk)
                        # what a pretending broker would answer: a forged inbox
                        conn.sendall(b'\x00\x00\x00\x19{"v":1,"id":1,"ok":true}')
                except OSError:
                    pass
                conn.close()
                with open(seen, "a") as f:
                    f.write(f"{total}\n")
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"1"
        yield sock_path, seen
    finally:
        os.close(ready_r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def connections(seen: Path) -> list[int]:
    try:
        return [int(n) for n in seen.read_text().split()]
    except OSError:
        return []


def test_the_blocking_client_refuses_a_server_of_another_uid(env, home, tmp_root):
    home.mkdir(mode=0o700, parents=True)
    with nobody_server(tmp_root / "evil") as (sock_path, seen):
        # a record that points at the attacker's socket, naming a live pid (ours)
        (home / paths.BROKER_JSON).write_text(json.dumps({"pid": os.getpid(), "socket": sock_path}))
        with pytest.raises(blocking.BrokerUnavailable, match="served by uid"):
            blocking.call(home, "ping")
        wait_until(lambda: connections(seen) == [0], what="the attacker saw the connection end")
        done = run_cli(env, "send", "someone", "secret plans")  # the CLI goes through the same client
        assert done.returncode != 0 and "served by uid" in done.stderr, done
        assert "Traceback" not in done.stderr
        wait_until(lambda: len(connections(seen)) >= 2, what="the CLI's connection")
        assert set(connections(seen)) == {0}


async def test_the_trio_client_refuses_a_server_of_another_uid(tmp_root):
    with nobody_server(tmp_root / "evil") as (sock_path, seen):
        with trio.fail_after(30), pytest.raises(BrokerGone, match="served by uid"):
            async with open_bridge_client(sock_path, {"agent": "claude", "project": "/w/x"}):
                pass
        await trio.to_thread.run_sync(
            lambda: wait_until(lambda: connections(seen) == [0], what="connection end")
        )


async def test_the_relay_refuses_a_server_of_another_uid_and_says_so(broker, env, home, tmp_root):
    """A broker runs (it holds the lock), but the socket its record names is the attacker's (as
    when a symlinked folder was swapped): the relay never sends its hello there, and a tool
    call says why this session is not connected."""
    with nobody_server(tmp_root / "evil") as (sock_path, seen):
        record = paths.read_broker_json(home)
        assert record is not None
        paths.write_private(home / paths.BROKER_JSON, json.dumps({**record, "socket": sock_path}))
        with trio.fail_after(60):
            host = await RawHost.start(env, "--project", "/w/impostor")
            result = await host.response(await host.call_request("inbox"))
            assert result["isError"] and "served by uid" in result["content"][0]["text"], result
            assert await host.end() == 0
        await trio.to_thread.run_sync(lambda: wait_until(lambda: connections(seen), what="a connection"))
        assert set(connections(seen)) == {0}, "the relay sent bytes to another user's socket"
        paths.write_private(home / paths.BROKER_JSON, json.dumps(record))

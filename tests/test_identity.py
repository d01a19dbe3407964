"""Identity that holds for every host (SPEC §3 "Identity without a host session id"): resume
after a broker restart, a host instance restarting its MCP server, no ghost sessions from
health checks, one connection per host session id without an eviction loop, names that never
capture another session's address. Real broker, real `agent-bridge mcp` processes; the MCP
side is a raw JSON-RPC client over stdio with no host session id anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agent_bridge.common import paths
from agent_bridge.store import reader
from tests.conftest import (
    CLI,
    BrokerProcess,
    call,
    call_error,
    load_dashboard,
    mcp_session,
    run_cli,
    wait_for,
    wait_until,
)

pytestmark = pytest.mark.slow

PROTOCOL_VERSION = "2025-06-18"  # a version the MCP spec defines; spelled here, not taken from the SDK


class RawMcp:
    """An MCP host as the spec describes it: newline-delimited JSON-RPC over the server's stdio."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = bytearray()
        self.next_id = 1

    async def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all((json.dumps(obj) + "\n").encode())

    async def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while b"\n" not in self.buffer:
            chunk = await self.proc.stdout.receive_some(65536)
            if not chunk:
                raise EOFError("the MCP server closed its stdout")
            self.buffer += chunk
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        return json.loads(line)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id, self.next_id = self.next_id, self.next_id + 1
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            frame = await self.receive()
            if frame.get("id") == request_id and "method" not in frame:
                assert "error" not in frame, frame
                return frame["result"]

    async def initialize(self) -> None:
        await self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw-host", "version": "1"},
            },
        )
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def tool_result(self, name: str, **args: Any) -> dict[str, Any]:
        return await self.request("tools/call", {"name": name, "arguments": args})

    async def tool(self, name: str, **args: Any) -> Any:
        result = await self.tool_result(name, **args)
        assert not result.get("isError"), result
        return json.loads(result["content"][0]["text"])

    async def inbox_until(self, count: int) -> list[dict[str, Any]]:
        async def ready():
            return len(await self.tool("inbox", peek=True, wait_seconds=1)) >= count

        await wait_for(ready, timeout=30, what=f"{count} messages")
        return await self.tool("inbox")


@asynccontextmanager
async def raw_mcp(env: dict[str, str], *args: str):
    proc = await trio.lowlevel.open_process(
        [*CLI, "mcp", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    client = RawMcp(proc)
    try:
        await client.initialize()
        yield client
    finally:
        assert proc.stdin is not None
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await proc.stdin.aclose()  # the host closes stdin: the server exits
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def rows(home: Path, sql: str, *args: Any) -> list[tuple]:
    with reader.reading(home / "bridge.db") as conn:
        return [tuple(r) for r in conn.execute(sql, args)]


def down(env: dict[str, str]) -> None:
    run_cli(env, "down", timeout=60)


async def test_broker_kill_9_and_restart_keeps_the_session(env, home):
    """No host session id anywhere: the MCP server resumes its own session (id + secret)."""
    broker = BrokerProcess(env, home).start()
    try:
        with trio.fail_after(150):
            async with raw_mcp(env, "--project", "/w/resume") as r, mcp_session(
                env, "--agent", "codex", "--project", "/w/sender"
            ) as s:
                me = await r.tool("whoami")
                assert me["hostSessionId"] is None
                shown = (await call(s, "send", to=me["id"], text="shown before the kill"))["message"]
                assert [m["id"] for m in await r.inbox_until(1)] == [shown["id"]]
                wait_until(
                    lambda: rows(home, "SELECT acked_at FROM receipts WHERE message_id = ?", shown["id"])[0][
                        0
                    ],
                    what="the shown message acknowledged",
                )
                before = (await call(s, "send", to=me["id"], text="sent before the kill"))["message"]

                broker.kill()  # the MCP servers start a new broker by themselves
                during = (await call(s, "send", to=me["id"], text="sent during the outage"))["message"]

                again = await r.tool("whoami")
                assert again == me  # same id, name, everything
                got = await r.inbox_until(2)
                # the shown one is not shown again
                assert [m["id"] for m in got] == [before["id"], during["id"]]
                listed = [p for p in await call(s, "peers") if p["project"] == "/w/resume"]
                assert len(listed) == 1 and listed[0]["id"] == me["id"] and listed[0]["connected"]
                wait_until(
                    lambda: (
                        rows(
                            home,
                            "SELECT count(*) FROM receipts WHERE peer_id = ? AND acked_at IS NULL",
                            me["id"],
                        )
                        == [(0,)]
                    ),
                    what="every shown receipt acknowledged",
                )
    finally:
        broker.kill()
        down(env)


STAND_IN_HOST = textwrap.dedent(
    """
    # A stand-in MCP host: runs `agent-bridge mcp` as its child, restarts it on request.
    import json, subprocess, sys

    server = None

    def rpc(method, params, rid):
        server.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\\n"
        )
        server.stdin.flush()
        while True:
            frame = json.loads(server.stdout.readline())
            if frame.get("id") == rid and "method" not in frame:
                return frame["result"]

    for command in sys.stdin:
        command = command.strip()
        if command == "start":
            server = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "stand-in", "version": "1"}}, 1)
            server.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\\n")
            server.stdin.flush()
            result = rpc("tools/call", {"name": "whoami", "arguments": {}}, 2)
        elif command == "inbox":
            result = rpc("tools/call", {"name": "inbox", "arguments": {"wait_seconds": 20}}, 3)
        elif command == "stop":
            server.stdin.close()
            result = {"exit": server.wait()}
        print(json.dumps(result), flush=True)
    """
)


async def test_a_host_restarting_its_mcp_server_gets_the_same_session(broker, env, home, tmp_path):
    script = tmp_path / "stand_in_host.py"
    script.write_text(STAND_IN_HOST)
    command = [sys.executable, str(script), *CLI, "mcp", "--project", "/w/restarted"]
    host = await trio.to_thread.run_sync(  # no AGENT_BRIDGE_HOST_PID: its parent is the host instance
        lambda: subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    )

    def ask(command: str) -> Any:
        assert host.stdin is not None and host.stdout is not None
        host.stdin.write(command + "\n")
        host.stdin.flush()
        return json.loads(host.stdout.readline())

    try:
        with trio.fail_after(120):
            first = json.loads((await trio.to_thread.run_sync(ask, "start"))["content"][0]["text"])
            async with mcp_session(env, "--agent", "codex", "--project", "/w/sender") as s:
                unread = (await call(s, "send", to=first["name"], text="before the restart, unread"))[
                    "message"
                ]
                assert (await trio.to_thread.run_sync(ask, "stop"))["exit"] == 0
                by_id = (await call(s, "send", to=first["id"], text="while your server restarted"))["message"]
                by_name = (await call(s, "send", to=first["name"], text="by name while it was down"))[
                    "message"
                ]
            second = json.loads((await trio.to_thread.run_sync(ask, "start"))["content"][0]["text"])
            assert second == first
            shown = json.loads((await trio.to_thread.run_sync(ask, "inbox"))["content"][0]["text"])
            assert [m["id"] for m in shown] == [unread["id"], by_id["id"], by_name["id"]]
            await trio.to_thread.run_sync(ask, "stop")
    finally:
        host.kill()
        host.wait()


def dashboard_sessions(home: Path) -> list[dict[str, Any]]:
    url = (home / "dashboard.url").read_text().strip()  # SPEC §2
    base, _, token = url.partition("/?t=")
    response = httpx.get(f"{base}/api/sessions", headers={"Cookie": f"ab_ui={token}"}, timeout=10)
    assert response.status_code == 200
    return response.json()["sessions"]


@pytest.mark.parametrize(
    "check_env",
    # `claude mcp list` 2.1.197 sets a fresh one per probe
    [{}, {"CLAUDE_CODE_SESSION_ID": str(uuid.uuid4())}],
    ids=["no-host-id", "claude-env-id"],
)
async def test_a_health_check_leaves_nothing_behind(broker, env, home, check_env):
    with trio.fail_after(120):
        async with mcp_session(env, "--agent", "codex", "--project", "/w/real") as s:
            me = await call(s, "whoami")
            peers_before = await call(s, "peers")
            api_before = await trio.to_thread.run_sync(dashboard_sessions, home)
            others = (
                "SELECT message_id, peer_id, delivered_at, acked_at FROM receipts "
                "WHERE peer_id != ? ORDER BY 1"
            )
            receipts_before = rows(home, others, me["id"])

            # `claude mcp list` and the like
            async with raw_mcp({**env, **check_env}, "--project", "/w/real") as check:
                await check.request("tools/list", {})

                async def listed():
                    return any(p["name"] == "claude-real" and p["connected"] for p in await call(s, "peers"))

                await wait_for(listed, what="the health check connected")
                # a decision while it is connected: it is a connected session in scope, so it is named,
                # but its notice waits for a first tool call that never comes (checked below: nothing kept)
                decided = await call(s, "decide", topic="probe", text="anything", scope="all")
                assert decided["deliveredTo"] == ["claude-real", "codex-real"]

            async def gone():
                return not any(p["name"] == "claude-real" for p in await call(s, "peers"))

            await wait_for(gone, what="the health check gone")
            assert await call(s, "peers") == peers_before
            assert await trio.to_thread.run_sync(dashboard_sessions, home) == api_before
            assert rows(home, others, me["id"]) == receipts_before
            assert rows(home, "SELECT count(*) FROM peers WHERE name = 'claude-real'") == [(0,)]


def broker_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def log_lines(home: Path) -> int:
    path = home / paths.LOG_NAME
    return len(path.read_text(errors="replace").splitlines()) if path.exists() else 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the broker's CPU time from /proc")
@pytest.mark.parametrize(
    ("first", "second", "winner"),
    [
        # a tie: incumbent
        (("--host-session-id", "dup-session"), ("--host-session-id", "dup-session"), "first"),
        (("--host-session-id", "dup-session"), ("--claude-env",), "first"),  # a weaker source never takes it
        (("--claude-env",), ("--host-session-id", "dup-session"), "second"),  # a stronger one does, once
    ],
    ids=["tie", "weaker-second", "stronger-second"],
)
async def test_two_servers_for_one_host_session_do_not_evict_each_other(
    broker, env, home, first, second, winner
):
    def server_args(spec: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
        if spec == ("--claude-env",):
            return ("--project", "/w/dup"), {"CLAUDE_CODE_SESSION_ID": "dup-session"}
        return ("--project", "/w/dup", *spec), {}

    (args_a, env_a), (args_b, env_b) = server_args(first), server_args(second)
    with trio.fail_after(120):
        async with mcp_session(env, *args_a, extra_env=env_a) as a:
            assert (await call(a, "whoami"))["hostSessionId"] == "dup-session"
            async with mcp_session(env, *args_b, extra_env=env_b) as b:
                loser, holder = (b, a) if winner == "first" else (a, b)
                if winner == "second":
                    assert (await call(b, "whoami"))["hostSessionId"] == "dup-session"

                async def refused():
                    result = await loser.call_tool("whoami", {})
                    return result.is_error and "already connected" in result.content[0].text

                await wait_for(refused, timeout=30, what="the losing server refused")
                await load_dashboard(broker)  # its one-time import is not what this window watches
                cpu_start, lines_start = broker_cpu_seconds(broker.pid), log_lines(home)
                await trio.sleep(10)  # an observation window, not a wait for something
                cpu_used, lines_added = (
                    broker_cpu_seconds(broker.pid) - cpu_start,
                    log_lines(home) - lines_start,
                )
                assert lines_added <= 3, (home / paths.LOG_NAME).read_text()[-2000:]
                assert cpu_used < 0.5  # an eviction loop burns about a quarter of a core
                said = (
                    (home / paths.LOG_NAME).read_text(errors="replace").count("refused a second connection")
                )
                assert said == 1  # why, once
                assert "already connected" in await call_error(loser, "whoami")
                holding = await call(holder, "whoami")
                live = [p for p in await call(holder, "peers") if p["hostSessionId"] == "dup-session"]
                assert [(p["id"], p["connected"]) for p in live] == [(holding["id"], True)]


def test_a_uuid_name_is_refused_with_a_clear_error(broker, env):
    name = str(uuid.uuid4())
    done = subprocess.run(
        [*CLI, "mcp", "--name", name], env=env, input="", capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--name" in done.stderr and "uuid" in done.stderr
    assert "Traceback" not in done.stderr


async def test_another_sessions_address_as_name_is_refused(broker, env, home):
    with trio.fail_after(90):
        async with mcp_session(
            env, "--agent", "codex", "--project", "/w/owner", "--host-session-id", "owner-hsid"
        ) as s:
            me = await call(s, "whoami")
            for taken in (me["id"], "owner-hsid"):
                done = await trio.to_thread.run_sync(
                    lambda taken=taken: subprocess.run(
                        [*CLI, "mcp", "--name", taken, "--project", "/w/thief"],
                        env=env, input="", capture_output=True, text=True, timeout=60,
                    )
                )
                assert done.returncode == 2, done.stderr
                reason = "a uuid" if taken == me["id"] else "another session's id or host session id"
                assert "name" in done.stderr and reason in done.stderr
                assert "Traceback" not in done.stderr
            assert rows(home, "SELECT count(*) FROM peers WHERE project = '/w/thief'") == [(0,)]
            await call(s, "send", to="owner-hsid", text="still reaches the owner")
            assert [m["text"] for m in await call(s, "inbox", wait_seconds=10)] == ["still reaches the owner"]


def test_names_never_look_like_session_ids():
    from agent_bridge.common import domain

    for bad in (str(uuid.uuid4()), str(uuid.uuid4()).upper(), uuid.uuid4().hex):
        with pytest.raises(domain.InputError, match="uuid"):
            domain.check_session_name(bad)
    assert domain.check_session_name("reviewer-2") == "reviewer-2"


async def test_only_the_secret_resumes_a_session_and_it_is_never_shown(broker, env, home):
    from agent_bridge.ipc.client import open_bridge_client

    socket_path = paths.read_broker_json(home)["socket"]  # type: ignore[index]
    hello = {"agent": "codex", "project": "/w/secret"}
    with trio.fail_after(60):
        async with open_bridge_client(socket_path, hello, keepalive=False) as (first, _):
            me, secret = first.hello["session"], first.hello["secret"]  # type: ignore[index]
            await first.request("whoami")  # in use: kept when it leaves
            shown = json.dumps(await first.request("peers"))
        thief = {
            **hello,
            "resume": {"id": me["id"], "secret": secret[:-1] + ("A" if secret[-1] != "A" else "B")},
        }
        async with open_bridge_client(socket_path, thief, keepalive=False) as (other, _):
            assert other.hello["session"]["id"] != me["id"]  # type: ignore[index]
        async with open_bridge_client(
            socket_path, {**hello, "resume": {"id": me["id"], "secret": secret}}
        ) as (
            again,
            _,
        ):
            assert again.hello["session"] == me  # type: ignore[index]
    assert secret not in shown
    assert secret not in (home / paths.LOG_NAME).read_text(errors="replace")
    for name in ("bridge.db", "bridge.db-wal"):
        if (home / name).exists():
            assert secret.encode() not in (home / name).read_bytes()
    async with httpx.AsyncClient() as client:
        url = (home / "dashboard.url").read_text().strip()
        base, _, token = url.partition("/?t=")
        body = (await client.get(f"{base}/api/sessions", headers={"Cookie": f"ab_ui={token}"})).text
    assert me["id"] in body and secret not in body


async def test_a_session_that_has_not_called_a_tool_yet_is_named_and_gets_its_notice(broker, env, home):
    """A bare MCP host (no host session id) that has only initialized is a connected session in
    scope: `deliveredTo` names it, and its first tool call shows it the notice, once."""
    with trio.fail_after(120):
        async with mcp_session(env, "--agent", "codex", "--project", "/w/quiet") as author:
            await call(author, "whoami")
            async with raw_mcp(env, "--agent", "claude", "--project", "/w/quiet") as quiet:

                async def listed():
                    return any(
                        p["name"] == "claude-quiet" and p["connected"] for p in await call(author, "peers")
                    )

                await wait_for(listed, what="the quiet session connected")
                decided = await call(author, "decide", topic="cache", text="Redis", scope="all")
                assert decided["deliveredTo"] == ["claude-quiet", "codex-quiet"]
                first = await quiet.inbox_until(1)
                assert [m["decision"]["id"] for m in first] == [decided["decision"]["id"]]
                assert await quiet.tool("inbox", wait_seconds=1) == []

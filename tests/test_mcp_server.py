"""The stdio MCP server as a host sees it (SPEC §5, §3): tools, auto-start, stdin close,
carried-over messages, Codex `_meta`, log notifications."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import apsw
import pytest
import trio

from agent_bridge.broker.mcp.observe import codex_thread_id
from agent_bridge.common import paths
from tests.conftest import call, mcp_session, run_cli, wait_for, wait_until
from tests.test_store import build_v2

pytestmark = pytest.mark.slow


async def test_tools_and_their_descriptions(broker, env):
    with trio.fail_after(60):
        async with mcp_session(env, "--project", "/w/t") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == {
                "decide", "decisions", "whoami", "peers", "send", "sent", "inbox", "ask_owner", "delegate",
                "job",
            }
            assert "Research the owner's choice before recording it" in tools["decide"].description
            assert "check `decisions` first" in tools["ask_owner"].description
            required_args = {"decide": {"topic", "text"}, "send": {"to", "text"}, "inbox": set(),
                             # `question`, or `withdraw` alone (SPEC §5): the broker refuses neither and both
                             "ask_owner": set(), "delegate": {"agent", "task"}, "job": {"id"}}
            for name, required in required_args.items():
                assert set(tools[name].input_schema.get("required", [])) == required


async def test_first_servers_start_one_broker_race_free(env, home):
    """Several MCP servers starting at once with no broker: exactly one broker comes up and
    every session connects to it."""
    try:
        with trio.fail_after(120):
            sessions: list[Any] = []
            all_open, done = trio.Event(), trio.Event()

            async def hold_one(i: int) -> None:
                async with mcp_session(env, "--project", f"/w/race{i}") as s:
                    sessions.append(s)
                    if len(sessions) == 4:
                        all_open.set()
                    await done.wait()

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(hold_one, i)
                await all_open.wait()
                names = {(await call(s, "whoami"))["name"] for s in sessions}
                assert names == {f"claude-race{i}" for i in range(4)}
                connected = {p["name"] for p in await call(sessions[0], "peers") if p["connected"]}
                assert connected == names  # all on the same broker
                record = paths.read_broker_json(home)
                assert paths.pid_alive(record["pid"])
                log = (home / "broker.log").read_text()
                assert log.count("broker ready") == 1
                done.set()
    finally:
        run_cli(env, "down")


def test_server_exits_when_the_host_closes_stdin(broker, env):
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_bridge", "mcp", "--project", "/w/stdin"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    wait_until(lambda: broker.status()["sessions"] == 1, what="session connected")
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    wait_until(lambda: broker.status()["sessions"] == 0, what="session gone")


async def test_unacknowledged_v2_messages_reach_the_returning_session(env, home):
    from tests.conftest import BrokerProcess

    home.mkdir(parents=True)
    build_v2(home / "bridge.db")  # p2 (host-1) has unacknowledged m1 and m3
    broker = BrokerProcess(env, home).start()
    try:
        with trio.fail_after(60):
            async with mcp_session(
                env, "--agent", "codex", "--project", "/w/app", "--host-session-id", "host-1"
            ) as s:
                me = await call(s, "whoami")
                assert me["id"] == "p2"

                async def two():
                    return len(await call(s, "inbox", peek=True, wait_seconds=1)) == 2

                await wait_for(two, what="carried-over messages")
                got = await call(s, "inbox")
                assert [(m["id"], m["text"], m["hop"]) for m in got] == [
                    ("m1", "hello", 1),
                    ("m3", "v2 message", 1),
                ]
                assert got[0]["from"] == {"id": "p1", "name": "claude-app", "agent": "claude"}
        conn = apsw.Connection(str(home / "bridge.db"), flags=apsw.SQLITE_OPEN_READONLY)
        assert conn.execute("SELECT acked_at IS NOT NULL FROM messages WHERE id = 'm1'").fetchone()[0] == 1
        conn.close()
    finally:
        broker.kill()


async def test_codex_meta_names_the_thread(broker, env):
    with trio.fail_after(60):
        async with mcp_session(env, "--agent", "codex", "--project", "/w/meta") as s:
            assert (await call(s, "whoami"))["hostSessionId"] is None
            meta = {"x-codex-turn-metadata": {"session_id": "codex-thread-42", "turn_id": "t1"}}
            result = await s.call_tool("whoami", {}, meta=meta)
            assert not result.is_error

            async def learned():
                return (await call(s, "whoami"))["hostSessionId"] == "codex-thread-42"

            await wait_for(learned, what="identity from _meta")


def test_codex_thread_id_shapes():
    assert codex_thread_id({"x-codex-turn-metadata": {"thread_id": "abc"}}) == "abc"
    assert codex_thread_id({"x-codex-turn-metadata": json.dumps({"session_id": "s"})}) == "s"
    assert codex_thread_id({"x-codex-turn-metadata": "not json"}) is None
    assert codex_thread_id({"other": 1}) is None
    assert codex_thread_id(None) is None


async def test_every_arrival_is_also_a_log_notification(broker, env):
    logged: list[Any] = []

    async def on_log(params: Any) -> None:
        logged.append(params)

    with trio.fail_after(60):
        async with mcp_session(env, "--agent", "codex", "--project", "/w/log") as a:
            async with mcp_session(env, "--project", "/w/log", logging_callback=on_log):
                await call(a, "send", to="claude-log", text="are you there?")
                await wait_for(
                    _async(lambda: any("are you there?" in str(p.data) for p in logged)), what="log"
                )
                assert "codex-log" in str(logged[-1].data) and "not from the user" in str(logged[-1].data)


def _async(predicate):
    async def inner():
        return predicate()

    return inner

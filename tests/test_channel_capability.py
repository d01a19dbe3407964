"""A channel notification counts as showing a message only to a host that declared the
`claude/channel` capability in its own `initialize`; the client's name proves nothing (Claude
Code 2.1.197 calls itself `claude-code`, declares only `roots` and `elicitation`, and drops the
notification)."""

from __future__ import annotations

import sys
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conftest import call, mcp_session, wait_for

pytestmark = pytest.mark.slow


async def test_a_host_named_claude_code_that_declared_nothing_still_gets_the_message(broker, env):
    logged: list[Any] = []

    async def on_log(params: Any) -> None:
        logged.append(params)

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agent_bridge", "mcp", "--agent", "claude", "--project", "/w/named"],
        env=env,
    )
    with trio.fail_after(90):
        async with stdio_client(params) as (read, write):
            claude_like = types.Implementation(name="claude-code", version="2.1.197")
            async with ClientSession(
                read, write, client_info=claude_like, logging_callback=on_log
            ) as receiver:
                await receiver.initialize()
                async with mcp_session(env, "--agent", "codex", "--project", "/w/sender") as sender:
                    await call(sender, "send", to="claude-named", text="only the inbox can show this")

                async def arrived() -> bool:
                    return any("only the inbox can show this" in str(p.data) for p in logged)

                await wait_for(arrived, what="the arrival's log notification")
                shown = await call(receiver, "inbox")
    assert [m["text"] for m in shown] == ["only the inbox can show this"]


async def test_a_waiting_message_is_announced_once_not_at_every_tool_call(broker, env):
    """The arrival notice is a wake-up: a message still waiting (peeked, not yet read) is not
    announced again by each later tool call of the same host."""
    logged: list[Any] = []

    async def on_log(params: Any) -> None:
        logged.append(str(params.data))

    with trio.fail_after(90):
        async with mcp_session(
            env, "--agent", "claude", "--project", "/w/once", logging_callback=on_log
        ) as receiver:
            await call(receiver, "whoami")
            async with mcp_session(env, "--agent", "codex", "--project", "/w/once-sender") as sender:
                await call(sender, "send", to="claude-once", text="announce me once")

            async def arrived() -> bool:
                return any("announce me once" in line for line in logged)

            await wait_for(arrived, what="the arrival's log notification")
            assert [m["text"] for m in await call(receiver, "inbox", peek=True)] == ["announce me once"]
            for _ in range(3):
                await call(receiver, "whoami")
            assert sum("announce me once" in line for line in logged) == 1, logged

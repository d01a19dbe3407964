"""What a session sees of its own acts and of loose arguments (issue 25, SPEC §3 Framing, §4.1,
§5): its own decision's notice and a message to itself are framed as its own, not as another
session's; an optional argument given as JSON null counts as absent; a `{"sessions": [...]}`
scope naming unknown addresses gets a second text block naming them, the first block staying
exactly the seed's object. Real broker, real `agent-bridge mcp` processes, the official client."""

from __future__ import annotations

import json

import pytest
import trio

from tests.conftest import call, mcp_session, wait_for

pytestmark = pytest.mark.slow


async def test_a_sessions_own_notice_and_message_are_framed_as_its_own(broker, env):
    logged: list[str] = []

    async def on_log(params) -> None:
        logged.append(str(params.data))

    with trio.fail_after(120):
        async with (
            mcp_session(env, "--agent", "claude", "--project", "/w/own", logging_callback=on_log) as a,
            mcp_session(env, "--agent", "codex", "--project", "/w/own") as b,
        ):
            me = await call(a, "whoami")
            other = await call(b, "whoami")
            made = await call(a, "decide", topic="db", text="PostgreSQL 16", scope="all")
            # the author still gets it
            assert sorted(made["deliveredTo"]) == sorted([me["name"], other["name"]])
            await call(a, "send", to=me["name"], text="note to self: rebase")
            await call(b, "send", to=me["name"], text="from codex")

            async def three() -> bool:
                return len([ln for ln in logged if "[agent-bridge]" in ln]) >= 3

            await wait_for(three, what="three framed log lines")
            own_notice = next(ln for ln in logged if "PostgreSQL 16" in ln)
            assert "of your own" in own_notice and "another agent session" not in own_notice, own_notice
            to_self = next(ln for ln in logged if "note to self" in ln)
            assert "a message you sent yourself" in to_self and "another agent session" not in to_self, (
                to_self
            )
            foreign = next(ln for ln in logged if "from codex" in ln)
            assert f"another agent session, {other['name']} (codex)" in foreign  # others' stay as they were

            result = await a.call_tool("inbox", {"wait_seconds": 5})
            items = json.loads(result.content[0].text)
            assert {m["text"] for m in items} >= {"note to self: rebase", "from codex"}
            assert "is your own" in result.content[1].text
            # the other session gets the decision framed as relayed from another session
            notice = [m for m in await call(b, "inbox", wait_seconds=5) if m["kind"] == "decision"]
            assert len(notice) == 1 and notice[0]["from"]["id"] == me["id"]


async def test_optional_arguments_given_as_null_count_as_absent(broker, env):
    with trio.fail_after(120):
        async with mcp_session(env, "--agent", "claude", "--project", "/w/null") as a:
            me = await call(a, "whoami")
            sent = await call(a, "send", to=me["name"], text="hello", reply_to=None)
            assert sent["message"]["replyTo"] is None and sent["message"]["hop"] == 1
            made = await call(a, "decide", topic="ci", text="nox", scope=None, source_message_id=None)
            assert made["decision"]["scope"] == {"project": "/w/null"}  # null scope: the default
            assert [d["topic"] for d in await call(a, "decisions", query=None, scope=None, history=None)] == [
                "ci"
            ]
            assert await call(a, "peers", project=None)
            got = await call(a, "inbox", wait_seconds=None, peek=None)  # peek null: not a peek
            assert any(m["text"] == "hello" for m in got)
            # the same through the MCP SDK's own path (a call the fast path leaves to it: a protocol
            # `_meta` key)
            sdk_only = {"io.modelcontextprotocol/related-task": {"taskId": "t"}}
            via_sdk = await a.call_tool(
                "send", {"to": me["name"], "text": "again", "reply_to": None}, meta=sdk_only
            )
            assert not via_sdk.is_error, via_sdk.content[0].text
            waited = await a.call_tool("inbox", {"wait_seconds": None, "peek": True}, meta=sdk_only)
            assert not waited.is_error and "again" in waited.content[0].text
            # a required argument given as null is still refused, in one line
            refused = await a.call_tool("send", {"to": None, "text": "x"})
            assert (
                refused.is_error and "to:" in refused.content[0].text and "\n" not in refused.content[0].text
            )


async def test_unknown_session_addresses_are_named_in_a_second_block(broker, env):
    with trio.fail_after(120):
        async with mcp_session(env, "--agent", "claude", "--project", "/w/ghost") as a:
            me = await call(a, "whoami")
            result = await a.call_tool("decide", {"topic": "t", "text": "x",
                                                  "scope": {"sessions": ["ghost", me["name"], "spook"]}})
            assert not result.is_error
            first, second = result.content
            decided = json.loads(first.text)
            assert set(decided) == {"decision", "deliveredTo"} and decided["deliveredTo"] == [me["name"]]
            assert '"ghost"' in second.text and '"spook"' in second.text and me["name"] not in second.text
            known = await a.call_tool(
                "decide", {"topic": "t", "text": "y", "scope": {"sessions": [me["id"]]}}
            )
            assert len(known.content) == 1  # every address known: the seed's one block
            assert (
                len((await a.call_tool("decide", {"topic": "u", "text": "z", "scope": "all"})).content) == 1
            )

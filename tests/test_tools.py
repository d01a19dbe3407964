"""The tool table (agent_bridge.common.tools) is the one place a tool is defined: the MCP server's
tool list, its argument checks, the protocol's tool ops, the relay's retry rule and advice, the
shipped static answers and the documented tool list all agree with it."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from agent_bridge.broker.mcp import calls, server
from agent_bridge.common import tools
from agent_bridge.ipc import protocol
from agent_bridge.relay import main as relay

REPO = Path(__file__).resolve().parent.parent
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def _listed() -> list[dict]:
    answers = trio.run(server.serve_lines, server.build_server(None), "other",  # type: ignore[arg-type]
                       [INIT, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}], 2)
    return answers[1]["result"]["tools"]


def test_the_server_lists_exactly_the_table():
    listed = _listed()
    assert [t["name"] for t in listed] == list(tools.TOOLS)
    for tool in listed:
        entry = tools.TOOLS[tool["name"]]
        assert tool == {"name": entry.name, "description": entry.description, "inputSchema": entry.schema}


def test_the_shipped_static_answers_list_the_table():
    static = json.loads(relay.STATIC.read_text(encoding="utf-8"))
    assert static["tools/list"]["tools"] == _listed()


def test_every_tool_has_a_body_and_its_op_in_the_protocol():
    assert set(calls.TOOL_BODIES) == set(tools.TOOLS)
    for tool in tools.TOOLS.values():
        if tool.op is None:
            assert tool.body, f"{tool.name}: served without an op, so it needs its own body"
            continue
        op = protocol.OPS[tool.op]
        assert op.session and op.idempotent == tool.idempotent and op.control == tool.cli, tool.name


def test_the_relay_resends_only_idempotent_tools_and_advises_on_the_others():
    for tool in tools.TOOLS.values():
        assert tools.idempotent(tool.name) == tool.idempotent
        assert tool.idempotent or tool.unsure, f"{tool.name}: say what to do when it may have been done"
    assert tools.idempotent("no-such-tool")  # refused by the broker: changes nothing
    assert tools.unsure_advice("send") == tools.TOOLS["send"].unsure


def test_a_call_that_carries_its_retry_key_is_resent():
    """A `send` with a message_id is answered with what it stored the first time: the relay
    sends it again to the next broker; without one (or with null) it may not."""
    mid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert tools.idempotent("send", {"to": "x", "text": "y", "message_id": mid})
    assert not tools.idempotent("send", {"to": "x", "text": "y"})
    assert not tools.idempotent("send", {"to": "x", "text": "y", "message_id": None})
    assert not tools.idempotent("send", "not an object")
    assert not tools.idempotent("decide", {"topic": "t", "text": "x", "message_id": "z"})  # no retry key
    for tool in tools.TOOLS.values():
        assert not tool.retry_key or tool.retry_key in tool.schema["properties"], tool.name


def test_send_and_sent_tell_the_agent_to_pass_a_message_id_and_to_look_before_resending():
    send, sent = tools.TOOLS["send"], tools.TOOLS["sent"]
    assert "message_id" in send.description and "`sent`" in send.description and "resend" in send.description
    assert "`sent`" in send.unsure and "message_id" in send.unsure
    assert sent.schema["properties"]["wait_seconds"]["maximum"] == 50
    assert sent.schema["properties"]["ids"]["maxItems"] == 100


def test_every_schema_names_its_arguments_types_and_limits():
    """SPEC §5: arguments are judged by the advertised schema, so each names its type (scope:
    any JSON value, described), and text limits and the wait range are in it."""
    for tool in tools.TOOLS.values():
        assert tool.schema["type"] == "object"
        assert set(tool.schema.get("required", [])) <= set(tool.schema["properties"])
        for name, prop in tool.schema["properties"].items():
            assert "type" in prop or "description" in prop, (tool.name, name)
    assert tools.TOOLS["decide"].schema["properties"]["text"]["maxLength"] == 4000
    assert tools.TOOLS["send"].schema["properties"]["text"]["maxLength"] == 16_000
    wait = tools.TOOLS["inbox"].schema["properties"]["wait_seconds"]
    assert (wait["minimum"], wait["maximum"]) == (0, tools.INBOX_WAIT_MAX)
    ask, decide = tools.TOOLS["ask_owner"].schema["properties"], tools.TOOLS["decide"].schema["properties"]
    assert ask["question"]["maxLength"] == 1000  # SPEC §4.6
    assert (ask["options"]["maxItems"], ask["options"]["items"]) == (10, {"type": "string", "maxLength": 200})
    assert (ask["topic"], ask["scope"]) == (decide["topic"], decide["scope"])
    # `question` or `withdraw` (SPEC §5): a withdrawal needs no question, so nothing is required
    assert "required" not in tools.TOOLS["ask_owner"].schema and "withdraw" in ask


def test_ask_owner_says_to_look_at_decisions_and_ask_only_what_the_owner_must_decide():
    description = tools.TOOLS["ask_owner"].description
    assert "`decisions` first" in description and "only what they must decide" in description


def test_the_docs_list_the_table():
    documented = (REPO / "docs" / "mcp-tools.md").read_text(encoding="utf-8")
    for tool in tools.TOOLS.values():
        assert f"### `{tool.name}`\n\n{tool.description}\n" in documented, tool.name

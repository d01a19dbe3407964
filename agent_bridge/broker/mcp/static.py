"""What the relay answers with no broker (agent_bridge/relay/mcp_static.json), produced by this
server through the SDK: `python -m agent_bridge.broker.mcp.static` writes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import trio
from mcp.server.mcpserver.exceptions import ToolError

from agent_bridge import __version__
from agent_bridge.broker.mcp.bridge import Bridge
from agent_bridge.broker.mcp.calls import INBOX_FRAMING
from agent_bridge.broker.mcp.fast import (
    ToolCall,
)
from agent_bridge.broker.mcp.server import build_server, serve_lines
from agent_bridge.common import ledger, tools
from agent_bridge.common.tools import Tool

STATIC_PATH = Path(__file__).resolve().parent.parent.parent / "relay" / "mcp_static.json"
UNKNOWN_VERSION = "unknown"  # the key of the answer to a protocol version the SDK does not know
TOOL_MARK, REASON_MARK = "agent_bridge_tool", "<the reason>"  # filled in by the relay


def static_answers() -> dict[str, Any]:
    """The answers `agent-bridge mcp` gives with no broker, produced by this server through the
    SDK: `initialize` per agent kind (claude declares channels) and requested protocol version,
    `tools/list` (and the empty prompt and resource lists, for relay_quick), the shape of a tool
    error, and an `inbox` result. `tests/test_relay.py` checks that the shipped file is this."""
    return trio.run(_static_answers)


async def _static_answers() -> dict[str, Any]:
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    def initialize(rid: int, version: str) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "agent-bridge", "version": __version__},
            },
        }

    answers: dict[str, Any] = {}
    for agent in ("claude", "other"):
        per_version = answers.setdefault(agent, {})
        for version in (*HANDSHAKE_PROTOCOL_VERSIONS, UNKNOWN_VERSION):
            (answer,) = await serve_lines(
                build_server(cast(Bridge, None)), agent, [initialize(1, version)], 1
            )
            per_version[version] = {k: v for k, v in answer.items() if k in ("result", "error")}
    listed = await serve_lines(build_server(cast(Bridge, None)), "other", [
        initialize(1, HANDSHAKE_PROTOCOL_VERSIONS[-1]), {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ], 2)
    # The other lists a host asks for right after `tools/list` (Claude Code: prompts and
    # resources), always empty here: relay_quick answers them for a job's host.
    others = ("prompts/list", "resources/list", "resources/templates/list")
    other_lists = await serve_lines(build_server(cast(Bridge, None)), "other", [
        initialize(1, HANDSHAKE_PROTOCOL_VERSIONS[-1]),
        *({"jsonrpc": "2.0", "id": 2 + i, "method": method} for i, method in enumerate(others)),
    ], 1 + len(others))
    # The shapes of a failed call and of an `inbox` result, from probe tools served alike.
    probes = {
        TOOL_MARK: Tool(TOOL_MARK, None, "", {"type": "object", "properties": {}}, idempotent=True),
        TOOL_MARK + "_blocks": Tool(
            TOOL_MARK + "_blocks", None, "", {"type": "object", "properties": {}}, True
        ),
    }

    async def fail(bridge: Bridge, call: ToolCall | None) -> list[str]:
        raise ToolError(REASON_MARK)

    async def blocks(bridge: Bridge, call: ToolCall | None) -> list[str]:
        return [REASON_MARK, INBOX_FRAMING]

    results = []
    for name in probes:
        answered = await serve_lines(
            build_server(cast(Bridge, None), probes, {TOOL_MARK: fail, TOOL_MARK + "_blocks": blocks}),
            "other",
            [
                initialize(1, HANDSHAKE_PROTOCOL_VERSIONS[-1]),
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": name, "arguments": {}},
                },
            ],
            2,
        )
        results.append(answered[1]["result"])
    failed, shown = results
    return {
        "generatedBy": "python -m agent_bridge.broker.mcp.static",
        "initialize": answers,
        "tools/list": listed[1]["result"],
        "lists": {others[answer["id"] - 2]: answer["result"] for answer in other_lists if answer["id"] >= 2},
        "toolError": {"marks": {"tool": TOOL_MARK, "reason": REASON_MARK}, "result": failed},
        # Read by relays older than agent_bridge.common.tools, still running across an upgrade.
        "idempotentTools": {name: tool.idempotent for name, tool in tools.TOOLS.items()},
        # An `inbox` result the relay writes itself (messages it held when the broker went away).
        "inboxResult": {"marks": {"messages": REASON_MARK}, "result": shown},
        "inboxIdsMax": ledger.IDS_MAX,
    }



def static_text() -> str:
    return json.dumps(static_answers(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    STATIC_PATH.write_text(static_text(), encoding="utf-8")
    print(f"wrote {STATIC_PATH}")

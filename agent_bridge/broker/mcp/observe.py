"""What a tool call tells the broker about its session: the host's MCP session handle, whether
the host declared it takes channel notifications, a Codex thread id."""

from __future__ import annotations

import logging
from typing import Any

from agent_bridge.broker.mcp import sdk as mcp_sdk
from agent_bridge.broker.mcp.bridge import CHANNEL_CAPABILITY, Bridge
from agent_bridge.broker.mcp.fast import (
    ToolCall,
)
from agent_bridge.common import jsonlimit
from agent_bridge.ipc.protocol import RemoteError

log = logging.getLogger("agent_bridge.mcp")


async def capture(bridge: Bridge, session: Any) -> None:
    if session is None or bridge.mcp_session is session:
        return
    # The SDK may hand each request its own session object for the one host connection: keep
    # the latest handle, but announce what arrived before the host initialized only once.
    first = bridge.mcp_session is None
    bridge.mcp_session = session
    # A connection of the 2026 protocol gets no channel messages (the host drops them there,
    # whatever its envelope declares): only a handshake-era host's declaration counts.
    bridge.channel = mcp_sdk.handshake_era(session) and declares_channel(session.client_capabilities)
    if not first:
        return
    queued = bridge.showing.queued()
    try:
        await bridge.out.send_many(bridge.arrival_logs(queued))
    except mcp_sdk.HOST_GONE as exc:  # a courtesy: the relay's end is the session's to handle
        log.debug("log notifications not sent: %s", exc)
    for message in queued:
        await bridge._announce(message)
    await bridge.flush_acks()


def declares_channel(capabilities: Any) -> bool:
    """A channel notification counts as shown only to a host that declared, in its own
    `initialize`, that it takes them. Claude Code 2.1 declares only `roots` and `elicitation`
    unless channels are switched on, and then drops the notification: never infer the
    capability from the client's name."""
    experimental = getattr(capabilities, "experimental", None) or {}
    return CHANNEL_CAPABILITY in experimental


async def observe(bridge: Bridge, call: ToolCall) -> None:
    """Per tool call: remember the MCP session; learn a Codex thread id from `_meta`."""
    bridge.used = True
    await bridge.report_use()
    await capture(bridge, call.session)
    thread = codex_thread_id(call.meta)
    if thread and thread != bridge.learned_host_session:
        bridge.learned_host_session = thread
        try:
            await bridge.call("learn_identity", hostSessionId=thread, source="codex-meta")
        except RemoteError as exc:
            log.warning("could not learn the host session id from a tool call: %s", exc)


def codex_thread_id(meta: Any) -> str | None:
    """The session or thread id Codex puts in a tool call's `_meta["x-codex-turn-metadata"]`."""
    if meta is None:
        return None
    data = meta if isinstance(meta, dict) else getattr(meta, "model_extra", None) or {}
    if not isinstance(data, dict):
        return None
    turn = data.get("x-codex-turn-metadata")
    if isinstance(turn, str):
        try:
            turn = jsonlimit.loads(turn)  # the host's text: its depth is bounded like a line's
        except ValueError:
            return None
    if not isinstance(turn, dict):
        return None
    for key in ("session_id", "sessionId", "thread_id", "threadId", "conversation_id", "conversationId"):
        value = turn.get(key)
        if isinstance(value, str) and value.strip() and len(value) <= 200:
            return value.strip()
    return None

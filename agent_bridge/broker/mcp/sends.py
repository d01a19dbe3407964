"""A session's plain `send` calls, served from the host's lines without a task each.

A host's parallel tool calls come one line after another through the relay, and the sends among
them share one commit (broker.ops.messages.send_batch). Served like the other calls, each in a
task of its own (broker.mcp.fast), they met in a group through the scheduler: per send a task, a
cancel scope and an event, per group a turn of the scheduler. Through two relays with 16 sends
in flight that cost the broker's loop about a quarter of its work per message
(docs/performance.md, stop 54). Here `FastCalls.take` queues each plain `send` call (`add`),
and the session's one task takes everything queued as one batch: each call observed as any tool
call is, the sends checked and committed together, each answered with its own result or error,
all the answers in one write.

Cancellation, as the SDK and the other calls have it (SPEC §3): a `notifications/cancelled` for
a call still queued takes it out of the queue, so nothing of it is stored and it is never
answered. A call whose batch is under way is stored with the others or not at all (its commit
runs to its end, as a send cancelled at its commit always did), and its answer is held back if
the cancel is read before the answer is made; one read later crossed the answer, which the host
ignores. The host's retry with the same message_id finds what was stored.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from mcp.server.mcpserver.exceptions import ToolError

from agent_bridge.broker.mcp.bridge import Bridge
from agent_bridge.broker.mcp.fast import JSONText, ToolCall, error_text, result_line, text_json
from agent_bridge.broker.mcp.observe import observe
from agent_bridge.broker.ops.messages import SEND_BATCH, SendResult, send_batch
from agent_bridge.broker.serving import STORAGE_ERRORS, storage_failure
from agent_bridge.common.domain import InputError

log = logging.getLogger("agent_bridge.mcp")

TOOL = "send"  # the tool served here: its body is the op of the same name (common.tools)


class QueuedSend:
    """One queued `send` call. FastCalls keeps it where it keeps a running call's cancel scope,
    and a host's cancel calls `cancel()`."""

    __slots__ = ("arguments", "call", "cancelled", "key", "owner")

    def __init__(self, owner: SendCalls, key: str, arguments: dict[str, Any], call: ToolCall) -> None:
        self.owner, self.key, self.arguments, self.call = owner, key, arguments, call
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.owner.withdraw(self)


class SendCalls:
    """One session's queued `send` calls and the task that serves them (see the module)."""

    def __init__(self, bridge: Bridge, running: dict[str, Any]) -> None:
        self.bridge = bridge
        self.running = running  # FastCalls.running: request id (as JSON) -> what a cancel stops
        self.queued: list[QueuedSend] = []
        self._more = trio.Event()  # set when a call is queued

    def add(self, key: str, arguments: dict[str, Any], call: ToolCall) -> QueuedSend:
        """Queue a plain `send` call (FastCalls.take: its arguments are what the tool's schema
        asks for); what a cancel of it stops."""
        entry = QueuedSend(self, key, arguments, call)
        self.queued.append(entry)
        self._more.set()
        return entry

    def withdraw(self, entry: QueuedSend) -> None:
        """The host cancelled a call: still queued, it leaves the queue, stored never."""
        if entry in self.queued:
            self.queued.remove(entry)
            del self.running[entry.key]

    async def run(self) -> None:
        """Forever: what is queued, SEND_BATCH calls at a time. Lives in the session's nursery."""
        while True:
            while not self.queued:
                await self._more.wait()
                self._more = trio.Event()
            batch, self.queued = self.queued[:SEND_BATCH], self.queued[SEND_BATCH:]
            with trio.CancelScope(shield=True):  # stored with the others or not at all
                answered = await self._serve(batch)
            for entry in batch:
                del self.running[entry.key]
            answers = [answer for entry, answer in zip(batch, answered, strict=True)
                       if not entry.cancelled]  # a cancelled call is never answered
            if answers and self.bridge.pipe is not None:
                try:
                    await self.bridge.pipe.send_responses(answers)
                except BrokenPipeError:
                    pass  # the relay went away: the session ends with its connection

    async def _serve(self, batch: list[QueuedSend]) -> list[tuple[int | str, str]]:
        """Each call's request id and answer line, in order: what the SDK's tool layer writes for
        the `send` op's result or error (a storage error's words as everywhere, none for a bug)."""
        bridge = self.bridge
        results: list[Any]
        try:
            for entry in batch:
                await observe(bridge, entry.call)
            await bridge.broker.identity.on_request(bridge.session)  # a tool call: as Broker.handle
            results = await send_batch(bridge.broker, bridge.session, [entry.arguments for entry in batch])
        except STORAGE_ERRORS as exc:
            results = [InputError(storage_failure(TOOL, exc))] * len(batch)
        except Exception as exc:  # noqa: BLE001 - a bug: logged, and the host learns nothing of it
            log.exception("tool %r raised an unexpected exception", TOOL)
            results = [exc] * len(batch)
        answered: list[tuple[int | str, str]] = []
        for entry, result in zip(batch, results, strict=True):
            rid = entry.call.request_id
            assert rid is not None  # FastCalls takes only requests with an id
            if isinstance(result, InputError):  # the op's error is the tool's (calls._op)
                result = ToolError(str(result))
            if isinstance(result, Exception):
                answered.append((rid, result_line(rid, [error_text(TOOL, result)], is_error=True)))
            else:
                text = (JSONText(result.text(text_json, spaced=True)) if isinstance(result, SendResult)
                        else text_json(result))
                answered.append((rid, result_line(rid, [text], is_error=False)))
        return answered

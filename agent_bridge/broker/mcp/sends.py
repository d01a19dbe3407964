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

Order, whichever way a call is served: the session's sends are stored in the order their lines
came. A `send` call the fast path leaves to the SDK (before the SDK has seen the host's
`initialized`, a request of the 2026 protocol, anything unusual in it) keeps a place in the queue
where its line came (`reserve`, from `FastCalls.take`). The SDK serves each request in a task
of its own, and the scheduler runs tasks woken together in any order: so the SDK's call fills
its place (`from_sdk`) and waits for its result there. A place the SDK answers without calling
the tool (an argument it refuses) is let go when that answer is written (`answered`), and a
host's cancel takes it out as it takes out a queued call. A place not yet filled holds up the
calls after it, never the calls before it.
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
from agent_bridge.core import showing

log = logging.getLogger("agent_bridge.mcp")

TOOL = "send"  # the tool served here: its body is the op of the same name (common.tools)


PLACES_MAX = 256  # places of cancelled calls the SDK never came for, remembered at most


class QueuedSend:
    """One queued `send` call. FastCalls keeps it where it keeps a running call's cancel scope,
    and a host's cancel calls `cancel()`. A call the SDK serves (`done` is an event) waits for
    its `outcome` instead of being answered from here; its place may be kept before the SDK
    calls the tool (`arguments` and `call` None until then)."""

    __slots__ = ("arguments", "call", "cancelled", "done", "key", "outcome", "owner")

    def __init__(self, owner: SendCalls, key: str, arguments: dict[str, Any] | None, call: ToolCall | None,
                 done: trio.Event | None = None) -> None:
        self.owner, self.key, self.arguments, self.call = owner, key, arguments, call
        self.cancelled = False
        self.done = done  # set once `outcome` holds the result's text blocks, or the error to raise
        self.outcome: list[str] | BaseException | None = None

    def cancel(self) -> None:
        self.cancelled = True
        self.owner.withdraw(self)


class SendCalls:
    """One session's queued `send` calls and the task that serves them (see the module)."""

    def __init__(self, bridge: Bridge, running: dict[str, Any]) -> None:
        self.bridge = bridge
        self.running = running  # FastCalls.running: request id (as JSON) -> what a cancel stops
        self.queued: list[QueuedSend] = []
        self._more = trio.Event()  # set when a call is queued, a place filled or let go
        # request id (as JSON) -> the place kept for a call handed to the SDK (`reserve`), never
        # filled while here: the SDK's call of the tool takes it out to fill it (`from_sdk`), its
        # answer without one lets it go (`answered`), a cancelled one stays for `from_sdk` to see
        self.places: dict[str, QueuedSend] = {}

    def add(self, key: str, arguments: dict[str, Any], call: ToolCall) -> QueuedSend:
        """Queue a plain `send` call (FastCalls.take: its arguments are what the tool's schema
        asks for); what a cancel of it stops."""
        entry = QueuedSend(self, key, arguments, call)
        self.queued.append(entry)
        self._more.set()
        return entry

    def reserve(self, key: str) -> QueuedSend:
        """Keep a place for a `send` call whose line goes to the SDK (FastCalls.take), where its
        line came; what a cancel of it stops."""
        entry = QueuedSend(self, key, None, None, trio.Event())
        self.queued.append(entry)
        self.places[key] = entry
        if len(self.places) > PLACES_MAX:  # cancelled before the SDK came for them, if ever
            for old in [k for k, e in self.places.items() if e.cancelled][: len(self.places) - PLACES_MAX]:
                del self.places[old]
        return entry

    async def from_sdk(self, call: ToolCall, arguments: dict[str, Any]) -> list[str]:
        """A `send` call the SDK serves (broker.mcp.calls): stored in its place among the
        session's sends, its result's text blocks returned (the op's error raised)."""
        key = showing.key(call.request_id)
        entry = self.places.pop(key, None)
        if entry is not None and entry.cancelled:
            raise ToolError("send: cancelled by the host before it was stored")  # never answered to it
        if entry is None:  # no place kept for it (a line taken apart nowhere): in line from now on
            entry = QueuedSend(self, key, arguments, call, trio.Event())
            self.queued.append(entry)
        else:
            entry.arguments, entry.call = arguments, call
        self._more.set()
        try:
            await entry.done.wait()  # type: ignore[union-attr]  # made with an event above
        except BaseException:  # the SDK cancelled it (the host's cancel): still queued, it is stored never
            self.withdraw(entry)
            raise
        if isinstance(entry.outcome, BaseException):
            raise entry.outcome
        assert entry.outcome is not None
        return entry.outcome

    def answered(self, key: str) -> None:
        """The SDK wrote its answer to request `key`: a place it never filled is let go (an
        argument refused before the tool was called; nothing was stored)."""
        entry = self.places.pop(key, None)
        if entry is not None:
            self.withdraw(entry)

    def listening(self) -> bool:
        """Whether a place waits for the SDK (RelayPipe reads the SDK's answers' ids only then)."""
        return bool(self.places)

    def withdraw(self, entry: QueuedSend) -> None:
        """The host cancelled a call: still queued, it leaves the queue, stored never (the
        SDK's call of it, if it waits, fails; the host ignores what answers a cancelled call)."""
        if entry in self.queued:
            self.queued.remove(entry)
            if self.running.get(entry.key) is entry:
                del self.running[entry.key]
            self._more.set()  # it may have held up the calls after it
            if entry.done is not None and not entry.done.is_set():
                entry.outcome = ToolError("send: cancelled by the host before it was stored")
                entry.done.set()

    async def run(self) -> None:
        """Forever: what is queued, SEND_BATCH calls at a time, up to a place not yet filled.
        Lives in the session's nursery."""
        while True:
            while not self.queued or self.queued[0].arguments is None:
                await self._more.wait()
                self._more = trio.Event()
            ready = next((i for i, e in enumerate(self.queued[:SEND_BATCH]) if e.arguments is None),
                         min(len(self.queued), SEND_BATCH))
            batch, self.queued = self.queued[:ready], self.queued[ready:]
            with trio.CancelScope(shield=True):  # stored with the others or not at all
                outcomes = await self._serve(batch)
            answers = []
            for entry, outcome in zip(batch, outcomes, strict=True):
                if self.running.get(entry.key) is entry:
                    del self.running[entry.key]
                if entry.done is not None:  # the SDK's call: it writes the answer
                    entry.outcome = outcome if isinstance(outcome, BaseException) else [outcome]
                    entry.done.set()
                elif not entry.cancelled:  # a cancelled call is never answered
                    assert entry.call is not None and entry.call.request_id is not None
                    answers.append((entry.call.request_id, _answer(entry.call, outcome)))
            if answers and self.bridge.pipe is not None:
                try:
                    await self.bridge.pipe.send_responses(answers)
                except BrokenPipeError:
                    pass  # the relay went away: the session ends with its connection

    async def _serve(self, batch: list[QueuedSend]) -> list[str | Exception]:
        """Each call's result text, or its error, in order: the `send` op's result, or its error
        as the tool's (a storage error's words as everywhere, a bug logged)."""
        bridge = self.bridge
        results: list[Any]
        try:
            for entry in batch:
                await observe(bridge, entry.call)  # type: ignore[arg-type]  # filled: in a batch
            await bridge.broker.identity.on_request(bridge.session)  # a tool call: as Broker.handle
            results = await send_batch(  # filled: in a batch
                bridge.broker, bridge.session, [entry.arguments or {} for entry in batch])
        except STORAGE_ERRORS as exc:
            results = [InputError(storage_failure(TOOL, exc))] * len(batch)
        except Exception as exc:  # noqa: BLE001 - a bug: logged, and the host learns nothing of it
            log.exception("tool %r raised an unexpected exception", TOOL)
            results = [exc] * len(batch)
        outcomes: list[str | Exception] = []
        for result in results:
            if isinstance(result, InputError):  # the op's error is the tool's (calls._op)
                outcomes.append(ToolError(str(result)))
            elif isinstance(result, Exception):
                outcomes.append(result)
            else:
                outcomes.append(JSONText(result.text(text_json, spaced=True))
                                if isinstance(result, SendResult) else text_json(result))
        return outcomes


def _answer(call: ToolCall, outcome: str | Exception) -> str:
    """What the SDK's tool layer writes for the `send` op's result or error (none for a bug)."""
    assert call.request_id is not None
    if isinstance(outcome, Exception):
        return result_line(call.request_id, [error_text(TOOL, outcome)], is_error=True, stamp=call.stamp)
    return result_line(call.request_id, [outcome], is_error=False, stamp=call.stamp)

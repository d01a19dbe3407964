"""The host's requests while no broker answers: what needs no broker is answered from the
generated data (relay.answers); `inbox` from what the broker's inbox held for this session
when it went away; the rest waits for a broker, up to CALL_TIMEOUT, then gets the reason there
is none (`expire_waiting`, a thread of its own, woken only when that reason or a deadline
changes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from agent_bridge.common.faults import Fault
from agent_bridge.core import showing
from agent_bridge.ipc.frames import RelayFrame, line_frames
from agent_bridge.relay.answers import Static, answer
from agent_bridge.relay.host_io import ShowingWrite
from agent_bridge.relay.keeper import Keeper
from agent_bridge.relay.link import Link
from agent_bridge.relay.replay import Replay
from agent_bridge.relay.requests import Request, Requests
from agent_bridge.relay.shown import Shown

IDLE_WAKE = 3600.0  # seconds the expiring thread sleeps when nothing waits (woken when one does)
DISCOVER = "server/discover"


class Serving(Protocol):
    """What answering alone needs of the relay."""

    cond: threading.Condition
    deadlines: threading.Condition
    link: Link | None
    session_id: str | None
    keeper: Keeper
    replay: Replay
    requests: Requests
    shown: Shown
    wanted: threading.Event  # set once the host asked what only a broker answers

    showing_write: ShowingWrite  # from writing a line that shows messages to noting it
    fault: Fault  # test-only (common.faults)

    def write_out(self, line: str) -> None: ...

    def send(self, link: Link, frames: Sequence[RelayFrame], queue: bool = False) -> None: ...

    def answer_unreachable(self, requests: list[Request], reason: str) -> None: ...


class Alone:
    def __init__(self, relay: Serving, agent: str = "") -> None:
        self.relay = relay
        self.static = Static(agent)

    def serve(self, request: Request, message: dict[str, Any]) -> None:
        """A request that found no broker (`message`: its JSON object)."""
        relay, rid = self.relay, message["id"]
        if request.method == "initialize":
            found = self.static.initialize(message.get("params"))
            with relay.cond:  # a broker joining from now on is handed this initialize (Replay.lines)
                alone = relay.link is None
                if alone:
                    relay.replay.answered("initialize", "result" in found)
            if alone:
                relay.write_out(answer(rid, result=found.get("result"), error=found.get("error")))
                return
            # one joined since the relay looked, without this initialize: forwarded below
        elif request.method == "tools/list":
            relay.write_out(answer(rid, result=self.static.tools_list()))
            return
        elif request.method in ("ping", "logging/setLevel"):  # a level is replayed to the broker later
            relay.write_out(answer(rid, result={}))
            return
        elif request.method == DISCOVER:
            # MCP 2026-07-28's probe (Claude Code 2.1.332 sends it first, also from `claude mcp
            # list`): with no broker the relay speaks the protocol of its `initialize`, which the
            # host then sends (seen), so a health check needs no broker.
            relay.write_out(answer(rid, error={"code": -32601, "message": "Method not found",
                                               "data": DISCOVER}))
            return
        relay.wanted.set()  # only a broker answers this: start one now if none runs
        if request.tool == "inbox" and self.inbox(rid, message.get("params")):
            return
        reason = ""
        with relay.cond:
            link = relay.link
            if link is not None:  # a broker answered meanwhile
                relay.requests.forward(request)
            elif request.method == "tools/call" and relay.keeper.known:
                reason = relay.keeper.unreachable()  # no use waiting
            else:
                relay.requests.wait(request, time.monotonic())
                relay.cond.notify_all()
                relay.deadlines.notify_all()
                return
        if link is not None:
            relay.send(link, line_frames(request.line))
        else:
            relay.write_out(self.static.tool_error(rid, request.tool or "", reason))

    def inbox(self, rid: Any, params: Any) -> bool:
        """`inbox` with no broker, from the messages the broker's inbox held for this session
        when it went away: offered (in the ledger) before the write, acknowledged (in the
        ledger) after it, as the broker would. False (the call waits for a broker instead) when
        nothing is held or the arguments are not plainly valid: the broker judges those."""
        arguments = params.get("arguments") if isinstance(params, dict) else None
        arguments = {} if arguments is None else arguments
        if not isinstance(arguments, dict) or set(arguments) - {"wait_seconds", "peek"}:
            return False
        peek = arguments.get("peek", False)
        wait = arguments.get("wait_seconds", 0)
        if not isinstance(peek, bool) or isinstance(wait, bool) or not isinstance(wait, (int, float)):
            return False
        relay, shown = self.relay, self.relay.shown
        by = showing.key(rid)
        with relay.cond:
            if relay.link is not None or not shown.showing.has_queued():
                return False
            messages = shown.showing.queued(self.static.inbox_ids_max)
            ids = [str(m["id"]) for m in messages]
            if not peek:
                messages = shown.showing.offer(by, ids)
                shown.save(relay.session_id)  # offered before the write: shown again, they are repeats
        with relay.showing_write.around():
            relay.write_out(self.static.inbox_result(rid, messages))
            relay.fault("relay:after-write")
            if not peek:
                with relay.cond:
                    shown.showing.on_its_way(by)
                    shown.showing.written(by, ids, time.monotonic())
                    shown.save(relay.session_id)
                    if relay.link is not None:  # a broker answered meanwhile, after its hello
                        relay.send(relay.link, shown.hand_over_acks(time.monotonic()))
        return True

    def expire_waiting(self) -> None:
        """Forever: requests that waited CALL_TIMEOUT for a broker, or whose wait has a known
        end now (the broker cannot start, or will not take this session), answered with the
        reason."""
        relay = self.relay
        while True:
            with relay.cond:
                now = time.monotonic()
                due = relay.requests.due(now, relay.keeper.known)
                reason = relay.keeper.unreachable()
                if not due:
                    wake = relay.requests.next_deadline()
                    relay.deadlines.wait(max(0.0, (now + IDLE_WAKE if wake is None else wake) - now))
                    continue
            relay.answer_unreachable(due, reason)

"""One agent session's side of the broker's MCP server: the `Bridge` the tool calls and the
relay's frames work on (what was offered, written, shown and acknowledged, through the showing
machine), the session's link for the delivery task, and the in-process client of the op handlers.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from agent_bridge.broker.mcp import sdk as mcp_sdk
from agent_bridge.broker.mcp.fast import (
    log_line,
)
from agent_bridge.broker.mcp.outbox import Outbox
from agent_bridge.broker.serving import STORAGE_ERRORS, storage_failure
from agent_bridge.broker.sessions.session import Session
from agent_bridge.broker.state import Broker
from agent_bridge.common import domain, ledger
from agent_bridge.common.domain import InputError
from agent_bridge.common.rows import Message, MessageJSON
from agent_bridge.core import showing
from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import (
    Acked,
    Held,
    Identity,
    Notice,
    Offered,
    line_frames,
    push_frame,
)
from agent_bridge.ipc.protocol import RemoteError
from agent_bridge.ipc.stream import FramedStream
from agent_bridge.store.ids import now_ms

CHANNEL_CAPABILITY = "claude/channel"
CANCEL_GRACE = 0.25  # seconds a written inbox result waits for a host cancel that crossed it, before its ack
READ_FIRST_TURNS = 20  # turns of the scheduler given to the relay's reader before results come due
# seconds between two recordings of a session's acknowledgements, at most one of them waiting
ACK_BATCH = 0.05
ACK_FLUSH_AT_EXIT = 2.0  # seconds to record the last acknowledgements when the host leaves
DELIVERY_FIRST = 5.0  # seconds the host's lines wait for the session's backlog to be in its inbox
LINES_BUFFER = 16  # host lines read ahead of the MCP server: a relay that outruns it waits
# RFC 5424, as MCP
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
REPEAT_NOTE = "(Offered before, possibly already shown to you: a repeat.) "

log = logging.getLogger("agent_bridge.mcp")


class LocalClient:
    """The broker's op handlers, called in-process as this session; errors as the bridge
    protocol would answer them."""

    def __init__(self, broker: Broker, session: Session) -> None:
        self.broker = broker
        self.session = session

    async def request(self, op: str, **args: Any) -> Any:
        try:
            return await self.broker.handle(self.session, op, args)
        except InputError as exc:
            raise RemoteError("bad_request", str(exc)) from None
        except STORAGE_ERRORS as exc:
            raise RemoteError("unavailable", storage_failure(op, exc)) from None


class SessionLink:
    """What the broker's session machinery holds as this session's connection (`Session.conn`):
    the delivery task's pushes go into the bridge's inbox instead of onto the wire, and closing
    it (a connection that replaces this one) ends the relay's connection."""

    def __init__(self, relay: FramedStream) -> None:
        self.relay = relay
        self.bridge: Bridge | None = None
        self.delivered = trio.Event()  # the delivery task's first read is in the inbox

    @property
    def closed(self) -> bool:
        return self.relay.closed

    async def push_notice(self, notice: Notice) -> None:
        if self.bridge is not None:
            await self.bridge.on_notice(notice)

    async def push_messages(self, messages: list[Message]) -> None:
        """The delivery task's batch (empty when nothing is due): every message is in the
        inbox before the first is announced, so no `inbox` call sees half a batch."""
        if self.bridge is not None:
            await self.bridge.on_messages([MessageJSON(m) for m in messages])
        self.delivered.set()

    async def aclose(self) -> None:
        await self.relay.aclose()


class Bridge:
    """One session's MCP state in the broker: what it shows the host, through its showing
    machine (agent_bridge.core.showing), which this class drives and carries out."""

    def __init__(self, broker: Broker, session: Session, relay: FramedStream) -> None:
        self.client = LocalClient(broker, session)
        self.broker, self.session = broker, session
        self.relay = relay  # read by the RelayReader
        self.out = Outbox(relay)  # every frame to the relay: those of one turn in one write
        self.hop_limit = broker.settings.hop_limit
        # Every pushed message's state (queued, offered, on its way, settling, written,
        # recording, acknowledged), keyed by the request or notification that shows it: the
        # session's own machine, which the broker's Stop check and persist_offers read.
        self.showing = session.showing
        self.arrived = trio.Event()  # set (and replaced) whenever a message is queued
        self.learned_host_session: str | None = None
        self.mcp_session: Any = None  # the MCP ServerSession, once the host initialized
        self.used = False  # the host called a tool: a real session, not a health check
        self.use_reported = False
        self.channel = False  # the host takes notifications/claude/channel
        self.pipe: mcp_sdk.RelayPipe | None = None  # the host's end of stdout, through the relay
        self.sends: Any = None  # broker.mcp.sends.SendCalls: the session's `send` calls, in order
        self.fast: Any = None  # broker.mcp.fast.FastCalls: the calls served beside the SDK
        self.acks_due = trio.Event()
        self.notifications = 0  # channel notifications sent: each is its own key in `showing`
        self._flushing = trio.Lock()
        self.log_level = "info"  # the host's logging/setLevel: arrivals are logged at info

    async def call(self, op: str, **args: Any) -> Any:
        return await self.client.request(op, **args)

    async def report_use(self) -> None:
        """Tell the broker, once, that the host called a tool (any tool, `inbox` too, which is
        served from memory): a connection that never does is a health check and leaves no
        session behind (broker.sessions.identity)."""
        if not self.used or self.use_reported:
            return
        self.use_reported = True
        try:
            await self.client.request("whoami")
        except RemoteError:
            self.use_reported = False  # said again at the next call

    def queued_more(self) -> None:
        self.arrived.set()
        self.arrived = trio.Event()

    async def on_messages(self, messages: list[dict[str, Any]]) -> None:
        """The delivery task's messages. A message kept in the inbox is also held by the relay,
        which shows it from there if this broker goes away before the agent reads it. The
        "held" pushes and the arrivals' log lines go in one write: one wake-up of the relay."""
        added = [m for m in messages if self.showing.arrive(m)]
        if added:
            self.queued_more()
            await self.out.send_many([push_frame(Held(m)) for m in added] + self.arrival_logs(added))
            for message in added:
                await self._announce(message)
        if self.showing.due():  # a replay of one shown here: its acknowledgement was lost
            self.acks_due.set()

    async def on_notice(self, notice: Notice) -> None:
        await NOTICE_HANDLERS[type(notice)](self, notice)

    async def acked_elsewhere(self, notice: Acked) -> None:
        self.showing.elsewhere(notice.ids)
        await self.out.send(push_frame(notice))  # the relay holds them no longer

    async def offered_elsewhere(self, notice: Offered) -> None:
        # the Stop hook is showing these: shown again here, they are repeats
        self.showing.offered_elsewhere(notice.ids)

    async def new_identity(self, notice: Identity) -> None:
        await self.out.send(push_frame(notice))  # the relay resumes (and keeps its ledger as) this session

    def logs_arrivals(self) -> bool:
        """Whether arrivals get a log notification: the host initialized, asked for info or
        more, and speaks a protocol that takes one outside a request."""
        session = self.mcp_session
        return (session is not None and LOG_LEVELS.index(self.log_level) <= LOG_LEVELS.index("info")
                and mcp_sdk.logs_between_requests(session))

    def arrival_logs(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The frames of the log lines announcing `messages` to the host through the relay, as
        a courtesy (they show nothing); none when it does not take them."""
        if self.pipe is None or not self.logs_arrivals():
            return []
        return [push_frame(frame) for message in messages
                for frame in line_frames(log_line("info", "agent-bridge", render_for_agent(message)))]

    async def _announce(self, message: dict[str, Any]) -> None:
        """Tell the host a message arrived: a channel event for an active one to a host that
        takes them, which shows it (acknowledged once written); a log notification as a
        courtesy for every arrival, which shows nothing (sent with the "held" pushes, through a
        relay: on_messages)."""
        session = self.mcp_session
        if session is None:
            return
        if self.pipe is not None:  # through a relay: the log line went with the "held" push
            if self.channel and message.get("kind") != "decision" and domain.is_active(
                int(message.get("hop", 0)), self.hop_limit
            ):
                await self._channel(str(message["id"]), render_for_agent(message))
            return
        if not self.logs_arrivals():
            return
        text = render_for_agent(message)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await session.send_log_message("info", text, logger="agent-bridge")
        except mcp_sdk.HOST_GONE as exc:
            log.debug("log notification not sent: %s", exc)
        except Exception:  # noqa: BLE001 - a courtesy: never worth the session, but never silent
            log.exception("log notification failed")

    async def _channel(self, mid: str, text: str) -> None:
        """Show one message as a channel notification: offered, on its way, acknowledged once
        the relay reports it written (there is no request a host could cancel)."""
        assert self.pipe is not None
        self.notifications += 1
        by = f"notification {self.notifications}"
        shown = self.offer(by, [mid])
        if not shown:
            return  # shown or being shown already
        meta = {"source": "agent-bridge", "from": str(shown[0]["from"].get("name")), "message_id": mid,
                "hop": str(shown[0].get("hop"))}
        if shown[0].get("repeat"):
            meta["repeat"] = "true"
        self.showing.on_its_way(by)
        try:
            await self.pipe.send_message(
                "notifications/claude/channel",
                {"content": REPEAT_NOTE + text if shown[0].get("repeat") else text, "meta": meta},
                ids=[mid], written=lambda: self.written(by, [mid], grace=0.0),
            )
        except BrokenPipeError as exc:  # the relay went away; the message stays queued
            self.showing.withdraw(by)
            log.info("channel notification failed: %s", exc)

    def offer(self, by: str, ids: list[str]) -> list[dict[str, Any]]:
        """Offer these queued messages in the answer `by`, before it is written to the host;
        returns them as offered (repeats marked). The session's machine holds the offer: the
        broker's Stop check skips them, and if the connection ends before their acknowledgement
        is recorded, they are written to the store as offered (Broker.persist_offers), so a
        later session shows them marked."""
        return self.showing.offer(by, ids)

    def written(self, by: str, ids: list[str], grace: float) -> None:
        """The bytes of answer `by` are in the host's pipe (the relay reported it): shown, and
        acknowledged once `grace` has passed without a host cancel for it. Called from the
        relay's "written" report, so it only queues; `ack_loop` records."""
        self.showing.written(by, ids, trio.current_time(), grace)
        self.acks_due.set()

    def shown_by_relay(self, ids: list[str]) -> None:
        """The relay showed these itself while no broker answered: acknowledge them."""
        self.showing.shown_directly(None, ids, reported=False)
        self.acks_due.set()

    async def offered_by_relay(self, ids: list[str]) -> None:
        """The relay offered these itself while no broker answered (or a cancel took back what
        it wrote): shown again, they are repeats. Recorded in the store at once, as a ledger's
        offers are: the relay keeps them no longer."""
        self.showing.offered_elsewhere(ids)
        try:
            await self.broker.db.offer(self.session.id, ids, now_ms())
        except STORAGE_ERRORS as exc:
            log.warning("could not record a relay's offers: %s", exc)

    async def cancelled(self, rid: Any) -> None:
        """The host cancelled request `rid` (read in order with the relay's frames). Not
        written yet: it never will be (the SDK and mcp_fast drop it), so nothing counts as
        shown; a request still running offers nothing. Written already, or maybe (on its way to
        the relay): the host ignores that answer, so its messages are offered again, first in
        line, as repeats, and never acknowledged for it."""
        by = showing.key(rid)
        if self.pipe is not None and self.pipe.forget(rid):
            self.showing.on_its_way(by)  # with the relay: written, as far as anyone knows
        withdrawn, again = self.showing.cancel(by)  # the broker's Stop check may show them now
        if not withdrawn and not again:
            return
        self.queued_more()
        if again:
            await self.out.send_many([push_frame(Held(m, again=True)) for m in again])

    async def read_first(self) -> None:
        """Before written results come due, what the relay has sent already is read: a host
        cancel that crossed one of them may be there, held up while this broker was busy or
        paused (the host sent it in time; CANCEL_GRACE runs on this broker's clock)."""
        for _ in range(READ_FIRST_TURNS):
            if self.showing.settling_due() is None or not self.relay.has_input():
                return
            await trio.lowlevel.cancel_shielded_checkpoint()  # the relay's reader takes it

    async def ack_loop(self) -> None:
        while True:
            await self.read_first()
            if await self.flush_acks():
                # What comes due meanwhile goes into the next transaction: a busy session's
                # acknowledgements are recorded a few at a time, not one commit per result.
                await trio.sleep(ACK_BATCH)
                continue
            next_due = self.showing.settling_due()
            with trio.move_on_at(math.inf if next_due is None else next_due):
                await self.acks_due.wait()
            self.acks_due = trio.Event()

    async def flush_acks(self) -> bool:
        """Record the acknowledgements due; what the store cannot take now is tried again.
        True when there were any."""
        async with self._flushing:
            acks = self.showing.take_acks(trio.current_time())
            if not acks:
                return False
            try:
                for i in range(0, len(acks), ledger.IDS_MAX):
                    await self.client.request("ack", ids=acks[i:i + ledger.IDS_MAX])
            except RemoteError as exc:
                log.warning("acknowledgements kept for a later try: %s", exc)
                self.showing.not_recorded(acks)
                return False
            except BaseException:
                self.showing.not_recorded(acks)
                raise
            self.showing.recorded(acks)
        if not self.out.closed:
            try:  # recorded: the relay need not hand them to a next broker
                await self.out.send(push_frame(Acked(acks)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, protocol.ProtocolError):
                pass
        return True


# How a session's MCP side carries out a notice another request queued for it (Session.notify).
NOTICE_HANDLERS: dict[type, Callable[[Bridge, Any], Awaitable[None]]] = {
    Acked: Bridge.acked_elsewhere,
    Offered: Bridge.offered_elsewhere,
    Identity: Bridge.new_identity,
}


def render_for_agent(message: dict[str, Any]) -> str:
    sender = message.get("from") or {}
    return domain.frame_message(
        str(sender.get("name")),
        str(sender.get("agent")),
        str(message.get("text")),
        kind=str(message.get("kind")),
        own=domain.sent_to_self(message),
    )

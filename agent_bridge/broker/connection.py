"""A bridge-protocol session's connection (`hello`: the demo, the benchmarks' broker-only
path, tests): its requests, answered in order, beside its delivery task."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from agent_bridge.broker.delivery import deliver
from agent_bridge.broker.ops.messages import SEND_BATCH, SendResult, op_offer, send_batch
from agent_bridge.broker.serving import (
    STORAGE_ERRORS,
    answer,
    attach_session,
    close_when_silent,
    send_quietly,
    unavailable,
)
from agent_bridge.broker.sessions.session import Session
from agent_bridge.broker.state import Broker
from agent_bridge.common.domain import InputError
from agent_bridge.common.rows import Message
from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import Notice, delivery_bytes, push_frame
from agent_bridge.ipc.stream import FramedStream

log = logging.getLogger("agent_bridge.connection")

class WireLink:
    """A bridge-protocol session's `Link`: pushes go onto the wire as frames."""

    def __init__(self, conn: FramedStream) -> None:
        self.conn = conn

    @property
    def closed(self) -> bool:
        return self.conn.closed

    async def push_messages(self, messages: list[Message]) -> None:
        if messages:
            await self.conn.send_encoded(b"".join([delivery_bytes(m) for m in messages]))

    async def push_notice(self, notice: Notice) -> None:
        await self.conn.send(push_frame(notice))

    async def aclose(self) -> None:
        await self.conn.aclose()


async def serve_session(broker: Broker, conn: FramedStream, request_id: int, args: dict[str, Any]) -> None:
    session = await attach_session(broker, conn, request_id, args, to=WireLink(conn))
    if session is None:
        return
    try:
        # The secret lets this MCP server resume exactly this session later (broker.sessions.identity).
        hello = {"session": session.public(), "hopLimit": broker.settings.hop_limit, "secret": session.secret}
        await conn.send(protocol.ok(request_id, hello))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(deliver, broker, session)
            nursery.start_soon(close_when_silent, conn, session.name)
            await Requests(broker, session, conn).serve()
            nursery.cancel_scope.cancel()
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away, maybe while its delivery task was pushing: a group, hence except*
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await _take_last_offers(broker, session, conn)
                await broker.persist_offers(session)
            except STORAGE_ERRORS as exc:  # kept in memory; the next connection's pushes are still marked
                log.warning("could not record the offers of %s: %s", session.name, exc)
        await broker.detach(session)


LAST_FRAMES_TIMEOUT = 1.0  # seconds spent reading what a client sent just before its connection failed
# At a broker shutdown the client is alive and silent: waiting the full second for frames that
# will not come would add it to every stop. What it already sent arrives within this.
LAST_FRAMES_AT_STOP = 0.05


async def _take_last_offers(broker: Broker, session: Session, conn: FramedStream) -> None:
    """An MCP server posts an offer before it writes messages to its host. If it died right
    after, its connection may fail (a push to it) before the offer was read: read what it
    sent and apply the offers, so those messages are marked as repeats when shown again.
    The rest is dropped: nobody waits for those answers."""
    with trio.move_on_after(LAST_FRAMES_AT_STOP if broker.stop.is_set() else LAST_FRAMES_TIMEOUT):
        while True:
            try:
                frame = await conn.receive()
                if frame is None:
                    return
                _, op, args = protocol.parse_request(frame)
                if op == "offer":
                    await op_offer(broker, session, args)
            except (protocol.ProtocolError, InputError, trio.BrokenResourceError, trio.ClosedResourceError):
                return


class Requests:
    """A session connection's requests, carried out and answered in the order they came: each
    op by its handler in BY_OP, any other by `answer_one`."""

    def __init__(self, broker: Broker, session: Session, conn: FramedStream) -> None:
        self.broker, self.session, self.conn = broker, session, conn
        self.held: list[dict[str, Any]] = []  # answers to offers, sent with the next answer

    async def serve(self) -> None:
        conn = self.conn
        while True:
            if self.held and conn.peek() is None:
                await self.flush()
            try:
                frame = await conn.receive()
                if frame is None:
                    return
                request = protocol.parse_request(frame)
            # answered here: raised, it would leave the nursery as a group
            except protocol.ProtocolError as exc:
                await send_quietly(conn, protocol.error(None, "protocol", str(exc)))
                return
            except protocol.BadArguments as exc:  # this request only: the connection goes on
                self.held.append(protocol.error(exc.request_id, "bad_request", str(exc)))
                await self.flush()
                continue
            await BY_OP.get(request.op, Requests.answer_one)(self, request)

    async def flush(self) -> None:
        """The answers held back, in one write."""
        if self.held:
            await self.conn.send_many(self.held)
            self.held.clear()

    async def offer(self, request: protocol.Request) -> None:
        """Answered from memory. With more already read behind it (an MCP server's ack), the
        answer is held and leaves in one write with the answers held before the next one.
        Answers stay in request order."""
        if self.conn.peek() is None:
            await self.answer_one(request)
            return
        self.held.append(await answer(self.broker, self.session, *request))

    async def send(self, request: protocol.Request) -> None:
        """With the sends right behind it: one commit (_answer_sends)."""
        await self.flush()
        await _answer_sends(
            self.broker, self.session, self.conn, [(request.id, request.args), *_more_sends(self.conn)]
        )

    async def ack(self, request: protocol.Request) -> None:
        """Recorded once the tasks already woken with it have run: another session's sends that
        came in together are committed and answered first. A sender with sends in flight waits
        for their answers (its window); nobody waits on an acknowledgement's answer, and its
        commit (a few hundred µs for a batch) ahead of theirs made each of them wait for it.
        Through the broker alone with 16 sends in flight, 8 alternated pairs: 2.6-14 % more
        messages a second in 7 (docs/performance.md, stop 71). One yield, never a wait: the
        acknowledgement runs in the scheduler's next pass, in this connection's order."""
        await trio.lowlevel.cancel_shielded_checkpoint()
        await self.answer_one(request)

    async def answer_one(self, request: protocol.Request) -> None:
        await self.flush()
        if request.op not in protocol.SESSION_OPS:
            await self.conn.send(
                protocol.error(
                    request.id, "bad_request", f"{request.op}: not available on a session connection"
                )
            )
            return
        await self.conn.send(await answer(self.broker, self.session, *request))


# The requests a session connection carries out otherwise than one at a time (Requests.serve).
BY_OP: dict[str, Callable[[Requests, protocol.Request], Awaitable[None]]] = {
    "ack": Requests.ack,
    "offer": Requests.offer,
    "send": Requests.send,
}


def _more_sends(conn: FramedStream) -> list[tuple[int, dict[str, Any]]]:
    """The sends that arrived right behind one (a pipelining client): taken while the next
    ready frame is a well-formed send, up to SEND_BATCH; anything else waits its turn."""
    more: list[tuple[int, dict[str, Any]]] = []
    while len(more) < SEND_BATCH - 1 and (frame := conn.peek()) is not None:
        try:
            request_id, op, args = protocol.parse_request(frame)
        except (protocol.ProtocolError, protocol.BadArguments):
            break  # answered in turn by the receive loop
        if op != "send":
            break
        conn.receive_nowait()
        more.append((request_id, args))
    return more


async def _answer_sends(
    broker: Broker, session: Session, conn: FramedStream, sends: list[tuple[int, dict[str, Any]]]
) -> None:
    try:
        results = await send_batch(broker, session, [args for _, args in sends])
    except STORAGE_ERRORS as exc:
        await conn.send_many([unavailable(request_id, "send", exc) for request_id, _ in sends])
        return
    answers = b"".join([
        protocol.encode(protocol.error(request_id, "bad_request", str(r)))
        if isinstance(r, InputError)
        else protocol.encode_ok(request_id, r.text(protocol.encode_json))
        if isinstance(r, SendResult)
        else protocol.encode(protocol.ok(request_id, r))
        for (request_id, _), r in zip(sends, results, strict=True)
    ])
    if len(sends) == 1:  # one send, whose sender waits for it; a pipelining one is answered at once
        await _deliveries_first(broker, results)
    await conn.send_encoded(answers)


async def _deliveries_first(broker: Broker, results: list[dict[str, Any] | InputError]) -> None:
    """Let the delivery tasks a send woke push before its sender is answered: the message
    reaches its recipient one answer (and the sender's next request) sooner. Trio runs a batch
    of ready tasks in either order, so a second pass is needed half the time; a delivery task
    that started its round has replaced its wake-up event.

    Only for a batch of one send: a client with sends in flight is bound by how soon they are
    answered (its window), and these turns of the scheduler, in which the other connections'
    requests ran first, held its answers back: through the broker alone with 16 sends in
    flight, answering at once measured 6-16 % more messages a second, and one message at a
    time the same (docs/performance.md, stop 54)."""
    woken = [
        recipient
        for r in results
        if not isinstance(r, InputError)
        for m in r.get("messages") or [r["message"]]  # `*`: a message per recipient
        if (recipient := broker.sessions.get(m["to"]["id"])) is not None
    ]
    for _ in range(2):
        if not any(s.wake.is_set() for s in woken):
            return
        await trio.lowlevel.cancel_shielded_checkpoint()



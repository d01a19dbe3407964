"""One task per connection; one delivery task per connected session (SPEC §3 Delivery)."""

from __future__ import annotations

import logging
from typing import Any

import apsw
import trio

from agent_bridge.core.showing import QUEUED
from agent_bridge.daemon.broker import Broker
from agent_bridge.daemon.identity import Refused
from agent_bridge.daemon.sessions import Session
from agent_bridge.daemon.storage import StoreCalls
from agent_bridge.domain import InputError
from agent_bridge.ipc import protocol
from agent_bridge.ipc.stream import FramedStream
from agent_bridge.rows import Message, Queued
from agent_bridge.store.tap import DeliveryTap

log = logging.getLogger("agent_bridge.connection")

HELLO_TIMEOUT = 10.0  # a connection that says nothing this long is dropped
IDLE_TIMEOUT = 45.0  # MCP servers ping every 15 s; silence this long means a dead peer
DELIVERY_BATCH = 200
SEND_BATCH = 64  # sends of one session committed together at most
STORAGE_ERRORS = (OSError, apsw.Error)  # a full disk, an I/O error: the request fails, the broker stays


async def handle_connection(broker: Broker, stream: trio.abc.Stream) -> None:
    conn = FramedStream(stream)
    try:
        first = None
        with trio.move_on_after(HELLO_TIMEOUT):
            first = await conn.receive()
        if first is None:
            return
        try:
            request_id, op, args = protocol.parse_request(first)
        except protocol.BadArguments as exc:
            if first.get("op") in ("hello", "mcp"):  # no session without a valid hello
                await _send_quietly(conn, protocol.error(exc.request_id, "bad_request", str(exc)))
                return
            await conn.send(protocol.error(exc.request_id, "bad_request", str(exc)))
            following = await _next_control(conn)
            if following is None:
                return
            request_id, op, args = following
        if op == "hello":
            await _serve_session(broker, conn, request_id, args)
        elif op == "mcp":  # an `agent-bridge mcp` relay: the broker serves its host's MCP session
            from agent_bridge.daemon import mcp_host  # imports this module

            await mcp_host.serve_relay(broker, conn, request_id, args)
        else:
            await _serve_control(broker, conn, request_id, op, args)
    except protocol.ProtocolError as exc:
        await _send_quietly(conn, protocol.error(None, "protocol", str(exc)))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client left before its answer (a refused hello, a hook that timed out): not a failure
    finally:
        await conn.aclose()


async def _serve_control(broker: Broker, conn: FramedStream, request_id: int, op: str, args: dict[str, Any]) -> None:
    """Hooks and the CLI: one or a few requests, then the connection closes."""
    while True:
        if op not in protocol.CONTROL_OPS:
            await conn.send(protocol.error(request_id, "bad_request", f"{op}: send hello first"))
        else:
            await conn.send(await _answer(broker, None, request_id, op, args))
            if op == "shutdown":
                broker.stop.set()
                return
        following = await _next_control(conn)
        if following is None:
            return
        request_id, op, args = following


async def _next_control(conn: FramedStream) -> tuple[int, str, dict[str, Any]] | None:
    """The next control request; one with arguments that cannot be carried out is answered
    here and skipped. None once the client has closed."""
    while True:
        frame = await conn.receive()
        if frame is None:
            return None
        try:
            return protocol.parse_request(frame)
        except protocol.BadArguments as exc:
            await conn.send(protocol.error(exc.request_id, "bad_request", str(exc)))


async def attach_session(
    broker: Broker, conn: FramedStream, request_id: int, args: dict[str, Any], *, to: FramedStream | None = None
) -> Session | None:
    """A hello's session, attached as `to` (default: `conn` itself); None once a refusal has
    been answered on `conn` (bad input; another connection holds this host session id, so the
    client backs off; the store failing)."""
    try:
        await broker.ingest_ledgers()  # an earlier server's acknowledgements first: never replay those
        session = await broker.attach(conn if to is None else to, args)
        try:
            await broker.record_parked_offers(session.id)  # before its messages are pushed again
        except BaseException:
            await broker.detach(session)
            raise
        return session
    except InputError as exc:
        await conn.send(protocol.error(request_id, "bad_request", f"hello: {exc}"))
    except Refused as exc:
        await conn.send(protocol.error(request_id, "refused", f"hello: {exc}"))
    except STORAGE_ERRORS as exc:
        await conn.send(_unavailable(request_id, "hello", exc))
    return None


async def _serve_session(broker: Broker, conn: FramedStream, request_id: int, args: dict[str, Any]) -> None:
    session = await attach_session(broker, conn, request_id, args)
    if session is None:
        return
    try:
        # The secret lets this MCP server resume exactly this session later (daemon.identity).
        hello = {"session": session.public(), "hopLimit": broker.settings.hop_limit, "secret": session.secret}
        await conn.send(protocol.ok(request_id, hello))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(deliver, broker, session)
            nursery.start_soon(_close_when_silent, session)
            await _receive_requests(broker, session)
            nursery.cancel_scope.cancel()
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away, maybe while its delivery task was pushing: a group, hence except*
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await _take_last_offers(broker, session)
                await broker.persist_offers(session)
            except STORAGE_ERRORS as exc:  # kept in memory; the next connection's pushes are still marked
                log.warning("could not record the offers of %s: %s", session.name, exc)
        await broker.detach(session)


LAST_FRAMES_TIMEOUT = 1.0  # seconds spent reading what a client sent just before its connection failed
# At a broker shutdown the client is alive and silent: waiting the full second for frames that
# will not come would add it to every stop. What it already sent arrives within this.
LAST_FRAMES_AT_STOP = 0.05


async def _take_last_offers(broker: Broker, session: Session) -> None:
    """An MCP server posts an offer before it writes messages to its host. If it died right
    after, its connection may fail (a push to it) before the offer was read: read what it
    sent and apply the offers, so those messages are marked as repeats when shown again.
    The rest is dropped: nobody waits for those answers."""
    with trio.move_on_after(LAST_FRAMES_AT_STOP if broker.stop.is_set() else LAST_FRAMES_TIMEOUT):
        while True:
            try:
                frame = await session.conn.receive()
                if frame is None:
                    return
                _, op, args = protocol.parse_request(frame)
                if op == "offer":
                    await broker.op_offer(session, args)
            except (protocol.ProtocolError, InputError, trio.BrokenResourceError, trio.ClosedResourceError):
                return


async def _close_when_silent(session: Session) -> None:
    """Close the connection once nothing has come in for IDLE_TIMEOUT (a dead peer): its
    request loop then ends as at end of stream. A task beside that loop rather than a timeout
    around each of its reads, which cost more than the rest of reading a frame."""
    conn = session.conn
    while True:
        await trio.sleep_until(conn.last_read + IDLE_TIMEOUT)
        if trio.current_time() >= conn.last_read + IDLE_TIMEOUT:
            log.info("session %s silent for %ss; closing", session.name, IDLE_TIMEOUT)
            await conn.aclose()
            return


async def _receive_requests(broker: Broker, session: Session) -> None:
    conn = session.conn
    held: list[dict[str, Any]] = []  # answers to offers, sent with the next answer
    while True:
        if held and conn.peek() is None:
            await conn.send_many(held)
            held.clear()
        try:
            frame = await conn.receive()
            if frame is None:
                return
            request_id, op, args = protocol.parse_request(frame)
        except protocol.ProtocolError as exc:  # answered here: raised, it would leave the nursery as a group
            await _send_quietly(conn, protocol.error(None, "protocol", str(exc)))
            return
        except protocol.BadArguments as exc:  # this request only: the connection goes on
            await conn.send_many([*held, protocol.error(exc.request_id, "bad_request", str(exc))])
            held.clear()
            continue
        if op == "offer" and conn.peek() is not None:
            # Answered from memory; an MCP server's next request (its ack) is right behind:
            # both answers leave in one write. Answers stay in request order.
            held.append(await _answer(broker, session, request_id, op, args))
            continue
        if held:
            await conn.send_many(held)
            held.clear()
        if op not in protocol.SESSION_OPS:
            await conn.send(protocol.error(request_id, "bad_request", f"{op}: not available on a session connection"))
            continue
        if op == "send":
            await _answer_sends(broker, session, [(request_id, args), *_more_sends(conn)])
            continue
        await conn.send(await _answer(broker, session, request_id, op, args))


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


async def _answer_sends(broker: Broker, session: Session, sends: list[tuple[int, dict[str, Any]]]) -> None:
    try:
        results = await broker.send_batch(session, [args for _, args in sends])
    except STORAGE_ERRORS as exc:
        answers = [_unavailable(request_id, "send", exc) for request_id, _ in sends]
    else:
        answers = [
            protocol.error(request_id, "bad_request", str(r)) if isinstance(r, InputError) else protocol.ok(request_id, r)
            for (request_id, _), r in zip(sends, results, strict=True)
        ]
        await _deliveries_first(broker, results)
    await session.conn.send_many(answers)


async def _deliveries_first(broker: Broker, results: list[dict[str, Any] | InputError]) -> None:
    """Let the delivery tasks these sends woke push before the sender is answered: the message
    reaches its recipient one answer (and the sender's next request) sooner. Trio runs a batch
    of ready tasks in either order, so a second pass is needed half the time; a delivery task
    that started its round has replaced its wake-up event."""
    woken = [
        recipient
        for r in results
        if not isinstance(r, InputError) and (recipient := broker.sessions.get(r["message"]["to"]["id"])) is not None
    ]
    for _ in range(2):
        if not any(s.wake.is_set() for s in woken):
            return
        await trio.lowlevel.cancel_shielded_checkpoint()


async def _answer(broker: Broker, session: Session | None, request_id: int, op: str, args: dict[str, Any]) -> dict[str, Any]:
    try:
        return protocol.ok(request_id, await broker.handle(session, op, args))
    except InputError as exc:
        return protocol.error(request_id, "bad_request", str(exc))
    except STORAGE_ERRORS as exc:
        return _unavailable(request_id, op, exc)


def _unavailable(request_id: int, op: str, exc: BaseException) -> dict[str, Any]:
    log.error("%s failed: storage error: %s", op, exc)
    return protocol.error(request_id, "unavailable", f"{op} failed: storage error: {exc}")


class Backlog:
    """What a session's delivery task pushes next: its unacknowledged messages, read from a
    cursor (the last receipt pushed on this connection), or, once a read has reached the end,
    taken from the store's tap: what the store committed for this session since
    (store.tap.DeliveryTap). Nothing lives only in memory: a replay is a cursor reset, and
    a closed tap means reading from the cursor again."""

    def __init__(self, db: StoreCalls, limit: int = DELIVERY_BATCH) -> None:
        self.db = db
        self.limit = limit
        self.tap = DeliveryTap()
        self.cursor = 0  # seq of the last receipt pushed on this connection

    def restart(self) -> None:
        """Everything unacknowledged again, from the first receipt (a replay)."""
        self.cursor = 0
        self.tap.close()

    async def read(self, peer_id: str) -> tuple[list[Queued], bool]:
        """Unacknowledged receipts of record `peer_id`, and whether they reach the end."""
        taken = self.tap.take(peer_id)
        if taken is not None:
            return taken, True
        rows = await self.db.queued(peer_id, after_seq=self.cursor, limit=self.limit, tap=self.tap)
        return rows, len(rows) < self.limit

    def advance(self, batch: list[Queued]) -> list[Message]:
        """The messages of `batch` past the cursor, in order; the cursor moves past them."""
        out = []
        for seq, message in batch:
            if seq > self.cursor:
                self.cursor = seq
                out.append(message)
        return out

    def close(self) -> None:
        self.tap.close()  # the store drops it at the next send to this session


async def deliver(broker: Broker, session: Session) -> None:
    """Push the session's unacknowledged messages (Backlog), oldest first; sleep until poked."""
    backlog = Backlog(broker.db)
    try:
        while True:
            session.wake = trio.Event()
            await _send_notices(session)
            if session.replay:
                session.replay = False
                backlog.restart()
            peer_id = session.id
            batch, at_end = await backlog.read(peer_id)
            if session.replay or peer_id != session.id:
                continue  # the session became another record meanwhile: read again
            pushes = []
            for message in backlog.advance(batch):
                if session.showing.state(message.id) not in (None, QUEUED):
                    message = message._replace(repeat=True)  # offered before (a replay); no ack came
                pushes.append(protocol.push("message", message=message.to_json()))
            await _send_notices(session)  # an "acked" goes out before the messages it covers
            await session.conn.send_many(pushes)
            for _ in pushes:
                broker.fault("deliver:after-push")
            if at_end:
                await session.wake.wait()
    finally:
        backlog.close()


async def _send_notices(session: Session) -> None:
    """The identity and "acked" pushes other requests queued (Session.notify): sent here, by
    the session's own delivery task, so no request ever waits on this session's socket."""
    while session.notices:
        await session.conn.send(session.notices.popleft())


async def _send_quietly(conn: FramedStream, frame: dict[str, Any]) -> None:
    try:
        await conn.send(frame, timeout=1.0)
    except (trio.BrokenResourceError, trio.ClosedResourceError, protocol.ProtocolError):
        pass

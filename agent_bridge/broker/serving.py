"""What both kinds of session connection share (a bridge-protocol `hello` in broker.connection,
an MCP relay in broker.mcp.host): attaching the session, answering a request, the storage
errors a request may meet, and sends that may find the client gone."""

from __future__ import annotations

import logging
from typing import Any

import apsw
import trio

from agent_bridge.broker.ops import handlers  # noqa: F401  every op's handler, registered with the broker's table
from agent_bridge.broker.sessions.session import Link, Session
from agent_bridge.broker.state import Broker
from agent_bridge.common.domain import InputError
from agent_bridge.ipc import protocol
from agent_bridge.ipc.protocol import Refused
from agent_bridge.ipc.stream import FramedStream

log = logging.getLogger("agent_bridge.connection")

IDLE_TIMEOUT = 45.0  # MCP servers ping every 15 s; silence this long means a dead peer
STORAGE_ERRORS = (OSError, apsw.Error)  # a full disk, an I/O error: the request fails, the broker stays


async def attach_session(
    broker: Broker, conn: FramedStream, request_id: int, args: dict[str, Any], *, to: Link
) -> Session | None:
    """A hello's session, pushed to through `to`; None once a refusal has
    been answered on `conn` (bad input; another connection holds this host session id, so the
    client backs off; the store failing)."""
    try:
        await broker.ingest_ledgers()  # an earlier server's acknowledgements first: never replay those
        session = await broker.attach(to, args)
        try:
            await broker.record_parked_offers()  # before its messages are pushed again
        except BaseException:
            await broker.detach(session)
            raise
        return session
    except InputError as exc:
        await conn.send(protocol.error(request_id, "bad_request", f"hello: {exc}"))
    except Refused as exc:
        await conn.send(protocol.error(request_id, "refused", f"hello: {exc}"))
    except STORAGE_ERRORS as exc:
        await conn.send(unavailable(request_id, "hello", exc))
    return None


async def answer(
    broker: Broker, session: Session | None, request_id: int, op: str, args: dict[str, Any]
) -> dict[str, Any]:
    try:
        return protocol.ok(request_id, await broker.handle(session, op, args))
    except InputError as exc:
        return protocol.error(request_id, "bad_request", str(exc))
    except STORAGE_ERRORS as exc:
        return unavailable(request_id, op, exc)


def unavailable(request_id: int, op: str, exc: BaseException) -> dict[str, Any]:
    return protocol.error(request_id, "unavailable", storage_failure(op, exc))


def storage_failure(op: str, exc: BaseException) -> str:
    """What a request whose store failed (STORAGE_ERRORS) is told, logged: the same words on
    the wire, through a tool (broker.mcp) and in the broker's log."""
    log.error("%s failed: storage error: %s", op, exc)
    return f"{op} failed: storage error: {exc}"


async def send_quietly(conn: FramedStream, frame: dict[str, Any]) -> None:
    try:
        await conn.send(frame, timeout=1.0)
    except (trio.BrokenResourceError, trio.ClosedResourceError, protocol.ProtocolError):
        pass


async def close_when_silent(conn: FramedStream, name: str) -> None:
    """Close the connection once nothing has come in for IDLE_TIMEOUT (a dead peer): its reading
    loop then ends as at end of stream. A task beside that loop rather than a timeout around
    each of its reads, which cost more than the rest of reading a frame."""
    while True:
        await trio.sleep_until(conn.last_read + IDLE_TIMEOUT)
        if trio.current_time() >= conn.last_read + IDLE_TIMEOUT:
            log.info("session %s silent for %ss; closing", name, IDLE_TIMEOUT)
            await conn.aclose()
            return

"""One delivery task per connected session (SPEC §3 Delivery): its unacknowledged messages,
oldest first, pushed to the session's `Link` (the wire for a bridge-protocol client, the MCP
side's inbox for a relay), and the notices other requests queued for it."""

from __future__ import annotations

import trio

from agent_bridge.broker.sessions.session import Session
from agent_bridge.broker.state import Broker
from agent_bridge.broker.storage import StoreCalls
from agent_bridge.common.rows import Message, Queued
from agent_bridge.core.showing import QUEUED
from agent_bridge.store.tap import DeliveryTap

DELIVERY_BATCH = 200


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
            messages = [
                # a replay: offered before, no ack came
                m._replace(repeat=True) if session.showing.state(m.id) not in (None, QUEUED) else m
                for m in backlog.advance(batch)
            ]
            await _send_notices(session)  # an "acked" goes out before the messages it covers
            await session.conn.push_messages(messages)
            for _ in messages:
                broker.fault("deliver:after-push")
            if at_end:
                await session.wake.wait()
    finally:
        backlog.close()


async def _send_notices(session: Session) -> None:
    """The identity and "acked" pushes other requests queued (Session.notify): sent here, by
    the session's own delivery task, so no request ever waits on this session's socket."""
    while session.notices:
        await session.conn.push_notice(session.notices.popleft())



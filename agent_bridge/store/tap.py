"""The delivery tap: the store's thread hands a connected session's delivery task the messages
it has just committed for that session, so the task need not read them back."""

from __future__ import annotations

import threading
from collections import deque

from agent_bridge.common.rows import Message, Queued

TAP_LIMIT = 1000  # messages a tap holds before it closes and its session reads the database


class DeliveryTap:
    """The messages `send_messages` committed for one connected session since its delivery task
    last read its unacknowledged messages, in commit order, as (receipt seq, message) pairs.

    It spares that task reading back a row the store has just written. Only a shortcut: the
    database stays the truth. The store's thread opens it (at a read that reached the end of
    the session's messages) and appends to it; the delivery task drains it and closes it when
    it needs to read again. Anything else that changes the session's receipts (a decision's
    fan-out, a catch-up, absorbing another record) closes it, as does overflow: the delivery
    task then reads the database from its cursor, so nothing is skipped.

    Two threads use it (the store's and the event loop's), so every look and change holds its
    lock: `take` checks and drains in one step, never a check the other thread can overtake.
    """

    __slots__ = ("_lock", "_messages", "_open", "_peer_id")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: deque[Queued] = deque()
        self._open = False
        self._peer_id: str | None = None

    @property
    def peer_id(self) -> str | None:
        """The record this tap was last opened for (it may have closed since)."""
        with self._lock:
            return self._peer_id

    @property
    def open(self) -> bool:
        with self._lock:
            return self._open

    def take(self, peer_id: str) -> list[Queued] | None:
        """Everything collected for `peer_id`, drained; None if the tap is closed or collects
        for another record (then the database must be read)."""
        with self._lock:
            if not self._open or self._peer_id != peer_id:
                return None
            out = list(self._messages)
            self._messages.clear()
            return out

    def close(self) -> None:
        with self._lock:
            self._open = False
            self._messages.clear()

    def reopen(self, peer_id: str) -> None:
        with self._lock:
            self._peer_id, self._open = peer_id, True
            self._messages.clear()

    def append(self, seq: int, message: Message) -> bool:
        """Collect one committed message; False (and closed) when closed or full."""
        with self._lock:
            if self._open and len(self._messages) < TAP_LIMIT:
                self._messages.append(Queued(seq, message))
                return True
            self._open = False
            self._messages.clear()
            return False

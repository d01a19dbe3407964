"""What every part of the store's one writer shares: the writing connection, the database's
path, and the delivery taps (store.tap) that any change to a session's receipts must close.

Each concern (store.peers, .messages, .decisions, .forgetting) is a class built on this one;
store.writer composes them into `Store`, the only writer (see its docstring for why).
"""

from __future__ import annotations

from pathlib import Path

import apsw

from agent_bridge.store.migration import user_version
from agent_bridge.store.tap import DeliveryTap


class StoreBase:
    """The connection, the path and the taps; `_close_tap` for every concern that changes receipts."""

    def __init__(self, conn: apsw.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        self.taps: dict[str, DeliveryTap] = {}  # peer id -> its delivery task's tap
        # Known once migrated; read without touching the connection, which belongs to the
        # store's worker thread (the event loop asking it directly raced with that thread).
        self.schema_version = user_version(conn)

    def _close_tap(self, peer_id: str, only: DeliveryTap | None = None) -> None:
        tap = self.taps.get(peer_id)
        if tap is not None and (only is None or tap is only):
            del self.taps[peer_id]
            tap.close()

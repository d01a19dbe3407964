"""What every part of the store's one writer shares: the writing connection, the database's
path, and the delivery taps (store.tap) that any change to a session's receipts must close.

Each concern (store.peers, .messages, .decisions, .forgetting) is a class built on this one;
store.writer composes them into `Store`, the only writer (see its docstring for why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from agent_bridge.store.schema import user_version
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
        self._after: list[Callable[[], None]] | None = None  # inside one_commit: what waits for it

    def after_commit(self, action: Callable[[], None]) -> None:
        """Do `action` once the caller's transaction is committed: now, or, inside `one_commit`,
        after that one commit (never when it fails). For what must not happen before the rows
        are durable: a delivery tap handed a message, a test's after-commit crash point."""
        if self._after is None:
            action()
        else:
            self._after.append(action)

    @contextmanager
    def one_commit(self) -> Iterator[None]:
        """Several methods' transactions as one (the broker's group commit, StoreRunner): inside,
        each method's own `with self.conn` is a savepoint of one transaction, so a method that
        fails undoes only its own rows; the transaction commits at the end, and only then is what
        each deferred with `after_commit` done (all of it, the first failure raised after). If
        the commit fails, nothing was stored and nothing deferred is done."""
        if self._after is not None:
            raise RuntimeError("one_commit inside one_commit")
        self._after = []
        try:
            with self.conn:
                yield
            actions = self._after
        finally:
            self._after = None
        failure: BaseException | None = None
        for action in actions:
            try:
                action()
            except BaseException as exc:  # noqa: BLE001 - every deferred action runs; the first failure is raised
                failure = failure or exc
        if failure is not None:
            raise failure

    def _close_tap(self, peer_id: str, only: DeliveryTap | None = None) -> None:
        tap = self.taps.get(peer_id)
        if tap is not None and (only is None or tap is only):
            del self.taps[peer_id]
            tap.close()

"""Exactly once or marked, end to end (SPEC §10): what the federation task may do with the
outbox and with what the hub delivers, as two state machines with no I/O.

The broker's federation task feeds them what happened and carries out what they answer; the
store's rows are the truth, these only decide *when*. Time is an argument, in epoch milliseconds
as the store keeps it (a row's age must survive a restart); there are no threads, sockets or
clocks in here. `tests/federation/
test_outbox_model.py` drives both against a reference model with hypothesis.

**Outbox** (the sending side). Every row of the store's outbox (a message to a remote session,
a receipt going back to a sender, a decision or retraction going to the team) was committed in
the transaction that made it, so a kill -9 loses none; `restore(rows)` rebuilds this machine
from them after a restart.

    waiting ──tick (connected, due)──▶ publishing ──PubAck──▶ relayed (a message, a decision)
       ▲                                   │                   │  not confirmed for
       │       timeout / error / hub gone: │                   │  RECEIPT_WAIT: publish again
       └─────── unknown outcome, back off ─┘                   ▼
                                                      confirmed: done (dropped)
    receipts: PubAck ──▶ done (dropped)
    a message or decision not confirmed UNCONFIRMED_AFTER after it was queued: marked
    unconfirmed, and still published now and then; a late confirmation clears the mark and ends it.

Confirmed: a message by its receiving machine's receipt; a decision or retraction when every
machine of the team this one has heard (its presence read, not forgotten) has sent its receipt
for it. The store counts them (`TeamCount`, after each PubAck and each receipt); this machine
decides what the count means (`counted`):

    a decision's or retraction's row, after its PubAck or a receipt:
      no machine heard yet ──▶ parked: owed to the first machine heard (never published again,
                                never marked unconfirmed: nobody exists to be late)
      every machine heard confirmed ──▶ done (dropped)
      some still awaited ──▶ relayed, published again after RECEIPT_WAIT (as a message)
    a machine heard for the first time (or again after it was forgotten): the store queues
    every decision and retraction of ours it has not confirmed, and `owed` makes each one due
    now (the same Nats-Msg-Id: the hub's duplicate window drops a copy it still has, a hub that
    lost it stores it again); a parked row's bound starts then.

So a decision never ends at its PubAck, even on a machine alone: a hub that loses an
acknowledged write (a power cut) before any machine read it, or a stream past its max age,
loses nothing, since whoever joins later is owed it by this machine, not by the hub. A
machine silent for FORGET_AFTER_MS stops being awaited (its rows end on the others'
receipts) and is owed what it missed when it is heard again.

Rules: every publish of a row carries the row's own id as `Nats-Msg-Id` (the hub drops a
repeat within its window, the receiver drops one after it); a timeout is an unknown outcome,
never a failure (retried with the same id, backing off); a PubAck means relayed, not delivered
(JetStream, with its default fsync interval, can lose an acknowledged write on a power cut), so only the
receiving broker's receipt (`stored`, then `shown`, `acknowledged`) ends a message's row, and
only the other machines' receipts (`stored`) end a decision's or a retraction's.

**Inbound** (the receiving side): a delivery fetched from the hub is applied to the store (one
transaction: the message stored by id, a repeat a no-op, with a receipt row queued back to the
sender either way) and only after that commit acked to the stream; a body that cannot be read
stores nothing and is acked so the stream stops redelivering it; a store failure acks nothing
(the hub redelivers).

Mutations `tests/federation/test_outbox_model.py` catches (`python3 tests/federation/
mutate_outbox.py` applies each one to this module and runs the test; all seen failing):
  1. ack before commit: `Inbound.fetched` answers `AckStream` beside `Apply` (a kill -9 of the
     receiver between the two loses the message);
  2. ack after a failed commit: `Inbound.store_failed` answers `AckStream` (the hub never
     redelivers what was not stored);
  3. new message id on retry: a retry's `Publish.msg_id` is not the row's id (the hub stores
     the message twice within its dedupe window);
  4. timeout treated as failure: `not_published` drops the row (lost when the publish never
     landed);
  5. PubAck treated as delivered: a message's row is dropped at PubAck (lost when the hub loses
     an acknowledged write);
  6. a restart forgets relayed messages: `restore` skips rows with `relayed_at` (lost when the
     hub loses them);
  7. unconfirmed before the bound: `UNCONFIRMED_AFTER` compared with half the wait;
  8. a decision done at its PubAck: `published` drops a decision's row (lost when the hub loses
     an acknowledged write before any machine fetched it);
  9. a confirmation ends the wrong row: `confirmed` drops the message row of the same id
     whatever its kind (a decision's row waits for ever, never confirmed, so teardown finds it);
 10. a decision owed to nobody ends at its PubAck: `counted` drops a row no machine heard is
     left to confirm although none was heard at all (lost when the hub loses it before the
     first machine joins);
 11. a newcomer is not owed a parked decision: `owed` leaves a parked row parked (never
     published again: lost when the hub lost it before the newcomer read it);
 12. a parked decision is marked unconfirmed: `tick` marks a row owed to nobody (no machine
     heard exists to be late).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

MSG, RCPT, DEC = "msg", "rcpt", "dec"  # what an outbox row carries (its subject's kind)
KINDS = (MSG, RCPT, DEC)
CONFIRMED = (MSG, DEC)  # kinds whose row ends only when the receiving side confirms it, not at PubAck

# Receipts a receiving broker sends back, in order: a later one implies the earlier ones.
STORED, SHOWN, ACKNOWLEDGED = "stored", "shown", "acknowledged"
RECEIPTS = (STORED, SHOWN, ACKNOWLEDGED)

# Times are epoch milliseconds.
BACKOFF_FIRST = 500  # the first retry after an unknown outcome (a hub restart takes about 1 s)
BACKOFF_MAX = 30_000  # retries never wait longer than this while the hub answers nothing
RECEIPT_WAIT = 60_000  # a relayed message with no receipt is published again after this
RECEIPT_WAIT_MAX = 600_000  # ... the wait doubling each time, up to this
UNCONFIRMED_AFTER = 900_000  # after it was queued: a message with no receipt is marked unconfirmed
MAX_IN_FLIGHT = 64  # publishes awaiting their PubAck at once (the rest wait their turn)


OFFLINE_AFTER_MS = 90_000  # a machine not heard from for this long: its sessions show offline
FORGET_AFTER_MS = 7 * 24 * 3600 * 1000  # a session not announced (or a machine silent) this long: forgotten
SESSION_STATES = ("busy", "idle", "offline")


def session_state(said: str | None, heard_at: int | None, now: int) -> str:
    """A remote session's state as shown here (SPEC §10): what its machine last said, or
    offline when that machine has been silent for OFFLINE_AFTER_MS (times in epoch ms)."""
    if heard_at is None or now - heard_at > OFFLINE_AFTER_MS or said not in SESSION_STATES:
        return "offline"
    return said


def receipt_rank(state: str | None) -> int:
    """0 for no receipt, then stored < shown < acknowledged: receipts apply monotonically."""
    return 0 if state is None else RECEIPTS.index(state) + 1


class OutboxRow(NamedTuple):
    """What the store keeps of one outbox row, and all a restarted machine needs."""

    id: str  # the message's, decision's or retraction's id; a receipt's message id
    kind: str  # MSG, RCPT or DEC
    queued_at: float  # since when a machine is owed it (a parked row's bound starts when one is heard)
    relayed_at: float | None = None  # the last PubAck (a message or decision; receipts are dropped then)
    unconfirmed_at: float | None = None
    parked: bool = False  # a decision relayed while no machine of the team was heard: owed to the first


class TeamCount(NamedTuple):
    """What the store counts for a decision's or retraction's row: the machines of the team heard
    here (their presence read, not forgotten), and how many of them have not said they stored it."""

    heard: int
    awaited: int


# --- what the Outbox answers ------------------------------------------------------------


class Publish(NamedTuple):
    """Publish row `id` (the store has its subject and body) with Nats-Msg-Id `msg_id`; then
    tell `published` (PubAck) or `not_published` (timeout, error: outcome unknown)."""

    id: str
    kind: str
    msg_id: str


class MarkRelayed(NamedTuple):
    """Record that the hub acknowledged row `id` (a message: `sent` says relayed, not yet
    delivered; a decision: the store says whether any machine is still to confirm it)."""

    id: str
    at: float
    kind: str = MSG


class MarkUnconfirmed(NamedTuple):
    """Mark row `id` unconfirmed: not confirmed within the bound (still accepting it)."""

    id: str
    at: float
    kind: str = MSG


class Drop(NamedTuple):
    """The row is done: delete it from the store's outbox."""

    id: str
    kind: str


OutboxAction = Publish | MarkRelayed | MarkUnconfirmed | Drop


@dataclass
class _Entry:
    id: str
    kind: str
    queued_at: float
    relayed_at: float | None
    unconfirmed_at: float | None
    next_try: float
    tries: int = 0  # publishes since the last PubAck (for the backoff)
    relays: int = 0  # PubAcks without a receipt (for the receipt wait's doubling)
    in_flight: bool = False
    parked: bool = False  # a decision owed to no machine heard yet: waits for `owed`


class Outbox:
    """The sending side: which outbox rows to publish now, and what each outcome means."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}
        self.connected = False
        self._in_flight = 0

    # --- the store's rows -----------------------------------------------------------------

    def restore(self, rows: list[OutboxRow], now: float) -> None:
        """After a restart: every committed row, due at once (what was in flight is unknown),
        except a relayed message or decision, which waits for its receipt as before, and a parked
        decision, which waits for a machine to be heard."""
        self._entries.clear()
        self._in_flight = 0
        for row in rows:
            self.queued(row, now)
            if row.relayed_at is not None:
                entry = self._entries[(row.kind, row.id)]
                entry.relays = 1
                entry.next_try = max(now, row.relayed_at + RECEIPT_WAIT)
                entry.parked = row.parked and row.kind == DEC

    def queued(self, row: OutboxRow, now: float) -> None:
        """A row was committed (a send, a receipt, a decision). A row already held is kept: a
        receipt row moving on to a later state is the same row, due again."""
        key = (row.kind, row.id)
        held = self._entries.get(key)
        if held is not None:
            if not held.in_flight:
                held.next_try = now
            return
        self._entries[key] = _Entry(
            row.id, row.kind, row.queued_at, row.relayed_at, row.unconfirmed_at, next_try=now
        )

    def owed(self, row: OutboxRow, team: TeamCount, now: float) -> list[OutboxAction]:
        """A machine was heard for the first time (or again after it was forgotten), and the store
        counted the team again for a decision or retraction of ours: one that machine has not
        confirmed (queued for it, or still held) is due now, with its id as before; one it had
        confirmed before it was heard may be done. The row's `queued_at` and mark are the
        store's (for a row no machine was owed before, its bound starts now: nobody was late)."""
        key = (row.kind, row.id)
        if key not in self._entries:
            self.queued(row, now)
        entry = self._entries[key]
        entry.parked = False
        entry.queued_at, entry.unconfirmed_at = row.queued_at, row.unconfirmed_at
        if team.heard and not team.awaited:
            return self.confirmed(row.kind, row.id, now)
        entry.relays = 0
        if not entry.in_flight:
            entry.next_try = now
        return []

    # --- the hub ----------------------------------------------------------------------------

    def hub_lost_store(self, now: float) -> None:
        """The hub came back without the team's stream (its store lost: a power cut, a new disk):
        whatever it held may be gone, so every row still owed to a machine is due now, not
        after its receipt wait (same ids)."""
        for entry in self._entries.values():
            if not entry.in_flight and not entry.parked:
                entry.relays = 0
                entry.next_try = min(entry.next_try, now)

    def hub_connected(self, now: float) -> None:
        """Connected (again): what waited is due now, not after its backoff."""
        self.connected = True
        for entry in self._entries.values():
            if entry.relayed_at is None:
                entry.next_try = min(entry.next_try, now)

    def hub_disconnected(self, now: float) -> None:
        """Every publish in flight has an unknown outcome; nothing is published until connected."""
        self.connected = False
        for entry in self._entries.values():
            if entry.in_flight:
                self._unknown(entry, now)

    # --- time ---------------------------------------------------------------------------------

    def tick(self, now: float) -> list[OutboxAction]:
        """What to do now: marks that came due, and publishes while connected."""
        actions: list[OutboxAction] = []
        for entry in self._entries.values():
            if (
                entry.kind in CONFIRMED
                and entry.unconfirmed_at is None
                and not entry.parked
                and now - entry.queued_at >= UNCONFIRMED_AFTER
            ):
                entry.unconfirmed_at = now
                actions.append(MarkUnconfirmed(entry.id, now, entry.kind))
        if not self.connected:
            return actions
        due = sorted(
            (e for e in self._entries.values() if not e.in_flight and not e.parked and e.next_try <= now),
            key=lambda e: (e.next_try, e.queued_at),
        )
        for entry in due[: max(0, MAX_IN_FLIGHT - self._in_flight)]:
            entry.in_flight = True
            entry.tries += 1
            self._in_flight += 1
            actions.append(Publish(entry.id, entry.kind, msg_id=entry.id))
        return actions

    def next_due(self) -> float | None:
        """When `tick` may next have something to do (None: nothing is waiting)."""
        times = [e.next_try for e in self._entries.values() if not e.in_flight and not e.parked]
        times += [
            e.queued_at + UNCONFIRMED_AFTER
            for e in self._entries.values()
            if e.kind in CONFIRMED and e.unconfirmed_at is None and not e.parked
        ]
        return min(times, default=None)

    # --- outcomes -----------------------------------------------------------------------------

    def published(self, kind: str, row_id: str, now: float) -> list[OutboxAction]:
        """PubAck: the hub stored it. A message or a decision is relayed (and waits to be
        confirmed: a decision's store answers its `TeamCount`, see `counted`); a receipt is done."""
        entry = self._take_in_flight(kind, row_id)
        if entry is None:
            return []
        if kind not in CONFIRMED:
            del self._entries[(kind, row_id)]
            return [Drop(row_id, kind)]
        entry.tries = 0
        entry.relayed_at = now
        wait = min(RECEIPT_WAIT * 2**entry.relays, RECEIPT_WAIT_MAX)
        entry.relays += 1
        entry.next_try = now + wait
        return [MarkRelayed(row_id, now, kind)]

    def not_published(self, kind: str, row_id: str, now: float) -> list[OutboxAction]:
        """A timeout or an error: the hub may or may not have it. Again later, same id."""
        entry = self._take_in_flight(kind, row_id)
        if entry is not None:
            self._unknown(entry, now)
        return []

    def receipt(self, message_id: str, state: str, now: float) -> list[OutboxAction]:
        """The receiving broker's receipt for a message of ours was applied to the store (which
        keeps the highest one): the message reached its machine, its row is done, and an
        unconfirmed mark is cleared by the store's receipt."""
        return self.confirmed(MSG, message_id, now)

    def counted(self, row_id: str, team: TeamCount, now: float) -> list[OutboxAction]:
        """The store counted the team for a decision's or retraction's row (after its PubAck or
        a receipt): done when every machine heard confirmed it; parked when no machine was heard
        at all (it is owed to the first one, not ended); else it waits for the rest."""
        entry = self._entries.get((DEC, row_id))
        if entry is None:
            return []
        if team.heard == 0:
            entry.parked = True
            return []
        if team.awaited == 0:
            return self.confirmed(DEC, row_id, now)
        return []

    def confirmed(self, kind: str, row_id: str, now: float) -> list[OutboxAction]:
        """Row `row_id` of `kind` is confirmed (a message's receipt; every machine heard said it
        stored a decision): done."""
        entry = self._entries.pop((kind, row_id), None)
        if entry is None:
            return []
        if entry.in_flight:
            self._in_flight -= 1
        return [Drop(row_id, kind)]

    def depth(self) -> int:
        return len(self._entries)

    def oldest(self) -> float | None:
        return min((e.queued_at for e in self._entries.values()), default=None)

    # --- inside ---------------------------------------------------------------------------------

    def _take_in_flight(self, kind: str, row_id: str) -> _Entry | None:
        entry = self._entries.get((kind, row_id))
        if entry is None or not entry.in_flight:
            return None  # a late answer for a row already done or already given up on
        entry.in_flight = False
        self._in_flight -= 1
        return entry

    def _unknown(self, entry: _Entry, now: float) -> None:
        if entry.in_flight:
            entry.in_flight = False
            self._in_flight -= 1
        entry.next_try = now + min(BACKOFF_FIRST * 2 ** max(0, entry.tries - 1), BACKOFF_MAX)


# --- the receiving side -------------------------------------------------------------------------


class Apply(NamedTuple):
    """Apply delivery `token`'s body to the store (one transaction), then tell `applied`,
    `rejected` (the body cannot be read: nothing stored) or `store_failed`."""

    token: int


class AckStream(NamedTuple):
    """Ack delivery `token` to the stream: it is committed (or could never be)."""

    token: int


InboundAction = Apply | AckStream


class Inbound:
    """The receiving side: a delivery is acked to the stream only after its commit."""

    def __init__(self) -> None:
        self._applying: set[int] = set()

    def fetched(self, token: int) -> list[InboundAction]:
        """The hub delivered something (maybe again): apply it first."""
        if token in self._applying:
            return []  # already being applied; its ack follows the commit
        self._applying.add(token)
        return [Apply(token)]

    def applied(self, token: int) -> list[InboundAction]:
        """Committed (new, or a repeat that was a no-op): now the stream may forget it."""
        if token not in self._applying:
            return []
        self._applying.discard(token)
        return [AckStream(token)]

    def rejected(self, token: int) -> list[InboundAction]:
        """A body no machine of ours would send (bad JSON, too big): nothing was stored, and
        redelivering it would change nothing, so it is acked (and logged by the caller)."""
        return self.applied(token)

    def store_failed(self, token: int) -> list[InboundAction]:
        """The store could not commit (disk full, closed): no ack, the hub redelivers."""
        self._applying.discard(token)
        return []

    def hub_disconnected(self) -> None:
        """Deliveries not acked yet come again from the hub; their acks would go nowhere."""
        self._applying.clear()

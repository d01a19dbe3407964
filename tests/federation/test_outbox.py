"""core/federation.py, case by case: the timings and rules the model test (test_outbox_model.py)
relies on, spelled out (times in epoch ms)."""

from __future__ import annotations

from agent_bridge.core import federation as fed
from agent_bridge.core.federation import (
    DEC,
    MSG,
    RCPT,
    AckStream,
    Apply,
    Drop,
    Inbound,
    MarkRelayed,
    MarkUnconfirmed,
    Outbox,
    OutboxRow,
    Publish,
    TeamCount,
)

T0 = 1_790_000_000_000


def connected(*rows: OutboxRow) -> Outbox:
    box = Outbox()
    box.hub_connected(T0)
    for row in rows:
        box.queued(row, T0)
    return box


def test_nothing_is_published_while_the_hub_is_away() -> None:
    box = Outbox()
    box.queued(OutboxRow("m1", MSG, T0), T0)
    assert box.tick(T0) == []
    box.hub_connected(T0 + 5)
    assert box.tick(T0 + 5) == [Publish("m1", MSG, "m1")]
    assert box.tick(T0 + 6) == []  # in flight: not twice at once


def test_a_timeout_is_retried_with_the_same_id_backing_off() -> None:
    box = connected(OutboxRow("m1", MSG, T0))
    times = []
    now = T0
    for _ in range(9):
        [publish] = box.tick(now)
        assert publish.msg_id == "m1"
        assert box.not_published(MSG, "m1", now) == []
        due = box.next_due()
        assert due is not None
        times.append(due - now)
        now = due
    assert times == [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]


def test_a_puback_relays_a_message_which_is_published_again_until_its_receipt() -> None:
    box = connected(OutboxRow("m1", MSG, T0))
    box.tick(T0)
    assert box.published(MSG, "m1", T0 + 10) == [MarkRelayed("m1", T0 + 10)]
    assert box.tick(T0 + 10 + fed.RECEIPT_WAIT - 1) == []
    assert box.tick(T0 + 10 + fed.RECEIPT_WAIT) == [Publish("m1", MSG, "m1")]  # same id
    box.published(MSG, "m1", T0 + 70_010)
    assert box.tick(T0 + 70_010 + fed.RECEIPT_WAIT) == []  # the wait doubles
    assert box.receipt("m1", fed.STORED, T0 + 80_000) == [Drop("m1", MSG)]
    assert box.depth() == 0 and box.next_due() is None


def test_receipts_are_done_at_their_puback_decisions_when_confirmed() -> None:
    box = connected(OutboxRow("m1/stored", RCPT, T0), OutboxRow("d1", DEC, T0))
    assert sorted(box.tick(T0)) == [Publish("d1", DEC, "d1"), Publish("m1/stored", RCPT, "m1/stored")]
    assert box.published(RCPT, "m1/stored", T0) == [Drop("m1/stored", RCPT)]
    # a decision's PubAck is relayed, not stored by the team: it waits for the machines' receipts
    assert box.published(DEC, "d1", T0) == [MarkRelayed("d1", T0, DEC)]
    assert box.published(DEC, "d1", T0) == []  # a late second answer: nothing
    assert box.tick(T0 + fed.RECEIPT_WAIT - 1) == []
    assert box.tick(T0 + fed.RECEIPT_WAIT) == [Publish("d1", DEC, "d1")]  # the same id again
    assert box.published(DEC, "d1", T0 + fed.RECEIPT_WAIT) == [MarkRelayed("d1", T0 + fed.RECEIPT_WAIT, DEC)]
    late = T0 + fed.UNCONFIRMED_AFTER  # and published again then (its wait has passed)
    assert box.tick(late) == [MarkUnconfirmed("d1", late, DEC), Publish("d1", DEC, "d1")]
    assert box.confirmed(DEC, "d1", T0 + fed.UNCONFIRMED_AFTER + 1) == [Drop("d1", DEC)]
    assert box.depth() == 0 and box.next_due() is None


def test_a_decision_with_no_machine_heard_is_owed_to_the_first_one_heard() -> None:
    """Its PubAck does not end it: with no machine heard it is parked (not published again, never
    marked: nobody is late); the first machine heard is owed it at once (same id), with the bound
    from then, and its receipt ends it. A restart keeps it parked."""
    box = connected(OutboxRow("d1", DEC, T0))
    assert box.tick(T0) == [Publish("d1", DEC, "d1")]
    assert box.published(DEC, "d1", T0 + 1) == [MarkRelayed("d1", T0 + 1, DEC)]
    assert box.counted("d1", TeamCount(heard=0, awaited=0), T0 + 1) == []  # parked, not done
    assert box.depth() == 1 and box.next_due() is None
    much_later = T0 + 10 * fed.UNCONFIRMED_AFTER
    assert box.tick(much_later) == []
    box.restore([OutboxRow("d1", DEC, T0, relayed_at=T0 + 1, parked=True)], much_later)
    box.hub_connected(much_later)
    assert box.tick(much_later) == [] and box.next_due() is None

    heard = much_later + 5
    owed = OutboxRow("d1", DEC, heard, relayed_at=T0 + 1)  # the store's row: its bound from now
    assert box.owed(owed, TeamCount(heard=1, awaited=1), heard) == []
    assert box.tick(heard) == [Publish("d1", DEC, "d1")]
    assert box.published(DEC, "d1", heard + 1) == [MarkRelayed("d1", heard + 1, DEC)]
    assert box.counted("d1", TeamCount(heard=1, awaited=1), heard + 1) == []  # relayed, awaited
    assert box.tick(heard + fed.UNCONFIRMED_AFTER - 1) == [Publish("d1", DEC, "d1")]  # no mark yet
    box.not_published(DEC, "d1", heard + fed.UNCONFIRMED_AFTER - 1)
    assert box.counted("d1", TeamCount(heard=1, awaited=0), heard + 2) == [Drop("d1", DEC)]
    assert box.depth() == 0


def test_a_machine_heard_that_had_confirmed_a_parked_decision_ends_it() -> None:
    box = connected(OutboxRow("d1", DEC, T0))
    box.tick(T0)
    box.published(DEC, "d1", T0 + 1)
    box.counted("d1", TeamCount(heard=0, awaited=0), T0 + 1)
    row = OutboxRow("d1", DEC, T0 + 9, relayed_at=T0 + 1)
    assert box.owed(row, TeamCount(heard=1, awaited=0), T0 + 9) == [Drop("d1", DEC)]


def test_a_hub_that_lost_its_store_gets_every_owed_row_again_at_once() -> None:
    """Relayed rows are published again now, not after their receipt wait; a parked one stays."""
    box = connected(OutboxRow("m1", MSG, T0), OutboxRow("d1", DEC, T0), OutboxRow("d2", DEC, T0))
    box.tick(T0)
    for kind, row_id in ((MSG, "m1"), (DEC, "d1"), (DEC, "d2")):
        box.published(kind, row_id, T0 + 1)
    box.counted("d1", TeamCount(heard=1, awaited=1), T0 + 1)
    box.counted("d2", TeamCount(heard=0, awaited=0), T0 + 1)
    assert box.tick(T0 + 2) == []
    box.hub_lost_store(T0 + 2)
    assert sorted(box.tick(T0 + 2)) == [Publish("d1", DEC, "d1"), Publish("m1", MSG, "m1")]  # same ids


def test_unconfirmed_after_the_bound_even_offline_and_publishing_goes_on() -> None:
    box = Outbox()
    box.queued(OutboxRow("m1", MSG, T0), T0)
    assert box.tick(T0 + fed.UNCONFIRMED_AFTER - 1) == []
    assert box.tick(T0 + fed.UNCONFIRMED_AFTER) == [MarkUnconfirmed("m1", T0 + fed.UNCONFIRMED_AFTER)]
    assert box.tick(T0 + fed.UNCONFIRMED_AFTER + 1) == []  # marked once
    box.hub_connected(T0 + 1_000_000)
    assert box.tick(T0 + 1_000_000) == [Publish("m1", MSG, "m1")]
    assert box.receipt("m1", fed.ACKNOWLEDGED, T0 + 1_000_001) == [Drop("m1", MSG)]


def test_a_disconnect_makes_what_was_in_flight_unknown_and_a_reconnect_due_at_once() -> None:
    box = connected(OutboxRow("m1", MSG, T0))
    box.tick(T0)
    box.hub_disconnected(T0 + 1)
    assert box.published(MSG, "m1", T0 + 2) == []  # that publish's answer is no longer awaited
    box.hub_connected(T0 + 3)
    assert box.tick(T0 + 3) == [Publish("m1", MSG, "m1")]


def test_restore_rebuilds_from_rows() -> None:
    box = Outbox()
    box.restore([OutboxRow("m1", MSG, T0), OutboxRow("m2", MSG, T0, relayed_at=T0 + 100),
                 OutboxRow("m3", MSG, T0, relayed_at=T0 + 100, unconfirmed_at=T0 + fed.UNCONFIRMED_AFTER)],
                T0 + 1000)
    box.hub_connected(T0 + 1000)
    assert box.tick(T0 + 1000) == [Publish("m1", MSG, "m1")]  # relayed ones wait for their receipt
    waited = T0 + 100 + fed.RECEIPT_WAIT
    assert sorted(box.tick(waited)) == [Publish("m2", MSG, "m2"), Publish("m3", MSG, "m3")]
    later = T0 + 2 * fed.UNCONFIRMED_AFTER
    assert box.tick(later) == [MarkUnconfirmed("m1", later), MarkUnconfirmed("m2", later)]  # m3 was before
    assert box.oldest() == T0


def test_at_most_max_in_flight() -> None:
    box = connected(*(OutboxRow(f"m{i}", MSG, T0 + i) for i in range(fed.MAX_IN_FLIGHT + 5)))
    assert len(box.tick(T0 + 100)) == fed.MAX_IN_FLIGHT
    box.not_published(MSG, "m0", T0 + 100)
    assert [p.id for p in box.tick(T0 + 101)] == ["m64"]  # oldest waiting first


def test_inbound_acks_only_after_the_commit() -> None:
    inbound = Inbound()
    assert inbound.fetched(7) == [Apply(7)]
    assert inbound.fetched(7) == []  # redelivered while applying
    assert inbound.applied(7) == [AckStream(7)]
    assert inbound.applied(7) == []
    assert inbound.fetched(8) == [Apply(8)]
    assert inbound.store_failed(8) == []  # no ack: the hub redelivers
    assert inbound.fetched(8) == [Apply(8)]
    assert inbound.rejected(8) == [AckStream(8)]  # unreadable: stored nothing, never again
    assert inbound.fetched(9) == [Apply(9)]
    inbound.hub_disconnected()
    assert inbound.applied(9) == []  # that delivery comes again on the next connection

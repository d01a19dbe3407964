"""The showing machine's own rules, one event at a time (the model test drives them together)."""

from __future__ import annotations

from agent_bridge.core import showing
from agent_bridge.core.showing import ACKED, OFFERED, QUEUED, RECORDING, SETTLING, WRITTEN, Showing


def test_request_ids_are_keyed_as_the_sdk_correlates_them():
    assert showing.key(7) == showing.key("7") == "7"
    assert showing.key("07") == showing.key(7)  # int("07") == 7, as the SDK's coerce_request_id
    assert showing.key("seven") == '"seven"' != showing.key(7)
    assert showing.key(None) == "null"


def test_an_answer_is_acknowledged_only_after_its_write_and_its_grace():
    machine = Showing()
    machine.arrive({"id": "a", "text": "hi"})
    assert machine.offer("1", ["a"]) == [{"id": "a", "text": "hi"}]
    assert machine.state("a") == OFFERED and machine.take_acks(100.0) == []
    machine.on_its_way("1")
    machine.written("1", ["a"], now=10.0, grace=0.25)
    assert machine.state("a") == SETTLING and machine.take_acks(10.1) == []
    assert machine.take_acks(10.25) == ["a"] and machine.state("a") == RECORDING
    machine.recorded(["a"])
    assert machine.state("a") == ACKED
    assert machine.arrive({"id": "a", "text": "hi"}) is False  # a replay of it is dropped...
    assert machine.state("a") == WRITTEN  # ...and its acknowledgement, lost somewhere, is due again


def _written(machine: Showing, by: str, mid: str, now: float, grace: float) -> None:
    machine.arrive({"id": mid})
    machine.offer(by, [mid])
    machine.written(by, [mid], now=now, grace=grace)


def test_settling_answers_come_due_in_the_order_of_their_dues():
    """Answers written one after another settle in turn: the next due is the first one's, and
    a tick takes those due and leaves the rest, a cancelled one taken out of the line."""
    machine = Showing()
    for i, mid in enumerate("abcd"):
        _written(machine, str(i), mid, now=float(i), grace=0.25)
    assert machine.settling_due() == 0.25
    machine.cancel("1")  # b: offered again, no longer settling
    assert machine.take_acks(2.25) == ["a", "c"] and machine.state("d") == SETTLING
    assert machine.settling_due() == 3.25
    assert machine.take_acks(3.25) == ["d"] and machine.settling_due() is None


def test_an_answer_due_before_one_written_earlier_is_found_and_taken_first():
    """The machine does not rely on dues arriving in order (a caller with another grace, or a
    clock that stepped back): the earliest is found wherever it is, and once the settling line
    has emptied, order is trusted again."""
    machine = Showing()
    _written(machine, "1", "a", now=0.0, grace=1.0)
    _written(machine, "2", "b", now=0.0, grace=0.25)
    _written(machine, "3", "c", now=0.0, grace=0.5)
    assert machine.settling_due() == 0.25
    assert machine.take_acks(0.5) == ["b", "c"]
    assert machine.settling_due() == 1.0 and machine.take_acks(0.9) == []
    assert machine.take_acks(1.0) == ["a"] and machine.settling_due() is None
    _written(machine, "4", "d", now=5.0, grace=0.25)
    _written(machine, "5", "e", now=6.0, grace=0.25)
    assert machine.settling_due() == 5.25 and machine.take_acks(5.5) == ["d"]


def test_a_cancel_before_the_write_withdraws_after_it_offers_again_marked_and_first():
    machine = Showing()
    for mid in ("a", "b", "c"):
        machine.arrive({"id": mid})
    machine.offer("1", ["a"])
    assert machine.cancel("1") == (["a"], [])
    assert machine.queued() == [{"id": "a"}, {"id": "b"}, {"id": "c"}]  # never written: no mark
    machine.offer("2", ["b"])
    machine.written("2", ["b"], now=0.0, grace=0.25)
    assert machine.cancel("2") == ([], [{"id": "b", "repeat": True}])
    assert [m["id"] for m in machine.queued()] == ["b", "a", "c"]
    assert machine.take_acks(99.0) == []


def test_a_request_cancelled_before_it_offered_offers_nothing():
    machine = Showing()
    machine.arrive({"id": "a"})
    assert machine.cancel("5") == ([], [])
    assert machine.offer("5", ["a"]) == []
    assert machine.state("a") == QUEUED


def test_the_ledger_part_is_every_unconfirmed_id_however_many():
    machine = Showing()
    ids = [f"m{i}" for i in range(25_000)]
    for mid in ids:
        machine.arrive({"id": mid})
    machine.offer("1", ids)
    assert machine.unconfirmed() == (ids, [])
    machine.written("1", ids, now=0.0)
    assert machine.unconfirmed() == ([], ids)
    assert machine.take_acks(0.0) == ids
    machine.lost()  # the recorder went away before it confirmed
    assert machine.due() == ids


def test_a_bridge_protocol_client_offers_withdraws_and_is_acknowledged_by_id():
    """Offers of a client that holds the messages itself (the broker's `offer`, `withdraw`
    and `ack` ops): maybe shown from the offer on, so a second offer is a repeat; a withdrawn
    one was never shown; an acknowledged one is done."""
    machine = Showing()
    assert machine.client_offers(["a", "b"]) == []
    assert machine.busy() == {"a", "b"}
    assert machine.client_offers(["a"]) == ["a"], "offered twice without an ack: a repeat"
    machine.client_withdraws(["b"])
    assert machine.state("b") is None and machine.unconfirmed() == (["a"], [])
    machine.elsewhere(["a"])
    assert machine.state("a") == ACKED and machine.busy() == set()
    assert machine.client_offers(["a"]) == [], "acknowledged: never offered again"


def test_an_answer_cancelled_after_its_write_is_a_repeat_for_the_stop_hook_too():
    """Found by tests/test_sent_model.py: an `inbox` answer on its way, the host reads it and
    cancels the call; the Stop hook then fetches the message. The store has no offer for it yet
    (the connection records its offers when it ends), so the broker's machine must say it may
    have been shown: `repeats` (broker.ops.hooks.stop_check asks it)."""
    m = Showing()
    m.arrive({"id": "m1"})
    m.arrive({"id": "m2"})
    by = showing.key(1)
    m.offer(by, ["m1"])
    assert m.repeats(["m1", "m2"]) == set()
    m.on_its_way(by)
    m.cancel(by)
    assert m.state("m1") == QUEUED and m.repeats(["m1", "m2"]) == {"m1"}
    assert "m1" not in m.busy()  # so the Stop hook may fetch it: marked

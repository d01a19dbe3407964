"""The showing machine (agent_bridge.core.showing) against a reference model, through every
interleaving hypothesis finds (STYLE 13, SPEC §3 "One ledger of showing").

The system under test is one session wired as the processes wire it: the broker's machine
(rebuilt when the broker is killed), the relay's machine (rebuilt when the relay is killed),
the store (receipts: offered, acknowledged), the ledger file (the relay's unconfirmed part,
saved whenever no broker confirms), a Stop hook and channel pushes. The reference model is
what the host actually saw: which messages reached it in an answer it did not cancel, and
which reached it at all. After every step:

- an acknowledged message was shown to the host (in an answer the host did not ignore);
- a message written to the host before carries `repeat: true` whenever it is written again;
- nothing unacknowledged is lost: it is still somewhere it will be offered from again.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent_bridge.core import showing
from agent_bridge.core.showing import ACKED, SETTLING, Showing

GRACE = 0.25


class Delivery(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.sent = 0
        self.calls = 0
        # the store
        self.unacked: dict[str, dict[str, Any]] = {}
        self.acked: set[str] = set()
        self.offered_in_store: set[str] = set()  # receipts.offered_at or delivered_at: shown again, a repeat
        # the broker's machine for this session's connection (None while the broker is down;
        # a new one per connection: what the old one left unconfirmed goes to the store)
        self.broker: Showing | None = Showing()
        self.pushed: set[str] = set()  # the delivery task's cursor: pushed once per broker connection
        # the relay (always running: a killed relay is replaced by a new one at once)
        self.relay = Showing()
        self.ledger: tuple[list[str], list[str]] = ([], [])
        # answers in flight: key -> (process that offered them, message ids, what the host gets, stage)
        self.answers: dict[str, dict[str, Any]] = {}
        # the reference model: what the host got
        self.written_ever: set[str] = set()
        self.seen: dict[str, set[str]] = {}  # message id -> keys of the answers that showed it, not cancelled
        self.unmarked_twice: list[str] = []

    # --- helpers ----------------------------------------------------------------------

    def host_gets(self, key: str, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            mid = m["id"]
            if mid in self.written_ever and not m.get("repeat"):
                self.unmarked_twice.append(mid)
            self.written_ever.add(mid)
            self.seen.setdefault(mid, set()).add(key)

    def store_ack(self, ids: list[str]) -> None:
        for mid in ids:
            if mid in self.unacked:
                del self.unacked[mid]
                self.acked.add(mid)

    def save_ledger(self) -> None:
        offered, acked = self.relay.unconfirmed()
        self.ledger = (list(offered), list(acked))

    def flush(self) -> None:
        """The broker records the acknowledgements due; the relay hears they are recorded."""
        assert self.broker is not None
        due = self.broker.take_acks(self.now)
        self.store_ack(due)
        self.broker.recorded(due)
        self.relay.elsewhere(due)

    def persist(self, offered: list[str], written: list[str]) -> None:
        """Broker.persist_offers: the ended connection's offered (maybe shown) and written ones."""
        self.offered_in_store |= set(offered) | set(written)

    def stored_repeat(self, mid: str) -> bool:
        """Pushed marked (broker.connection.deliver): offered before in the store, or by this
        connection (a replay)."""
        offered_here = self.broker is not None and self.broker.state(mid) not in (None, showing.QUEUED)
        return mid in self.offered_in_store or offered_here

    # --- rules ------------------------------------------------------------------------

    @rule()
    def send(self) -> None:
        self.sent += 1
        mid = f"m{self.sent}"
        self.unacked[mid] = {"id": mid, "text": mid}
        if self.broker is not None:  # the delivery task pushes it at once
            self.deliver()

    @precondition(lambda self: self.broker is not None)
    @rule()
    def deliver(self) -> None:
        """The delivery task pushes what is unacknowledged; the relay holds a copy."""
        assert self.broker is not None
        for mid, message in self.unacked.items():
            if mid in self.pushed:
                continue
            self.pushed.add(mid)
            pushed = dict(message, repeat=True) if self.stored_repeat(mid) else message
            if self.broker.arrive(pushed):
                self.relay.arrive(pushed, reack=False)

    @precondition(lambda self: self.broker is not None)
    @rule(peek=st.booleans(), limit=st.integers(1, 3), sent=st.booleans())
    def inbox(self, peek: bool, limit: int, sent: bool) -> None:
        """An `inbox` call; with `sent`, its answer goes straight on its way to the relay."""
        assert self.broker is not None
        queued = self.broker.queued(limit)
        if peek or not queued:
            return
        self.calls += 1
        key = showing.key(self.calls)
        ids = [m["id"] for m in queued]
        shown = self.broker.offer(key, ids)
        self.answers[key] = {"by": "broker", "ids": ids, "messages": shown, "stage": "offered"}
        if sent:
            self.broker.on_its_way(key)
            self.answers[key]["stage"] = "on_its_way"

    @precondition(lambda self: self.broker is None and self.relay.has_queued())
    @rule(limit=st.integers(1, 3))
    def inbox_alone(self, limit: int) -> None:
        """No broker: the relay shows what it holds, keeping offers and acks in its ledger."""
        self.calls += 1
        key = showing.key(self.calls)
        ids = [m["id"] for m in self.relay.queued(limit)]
        shown = self.relay.offer(key, ids)
        self.save_ledger()
        self.host_gets(key, shown)
        self.relay.on_its_way(key)
        self.relay.written(key, ids, self.now)
        self.save_ledger()

    @rule(data=st.data())
    def answer_on_its_way(self, data: st.DataObject) -> None:
        offered = [k for k, a in self.answers.items() if a["stage"] == "offered"]
        if not offered or self.broker is None:
            return
        key = data.draw(st.sampled_from(offered))
        self.broker.on_its_way(key)
        self.answers[key]["stage"] = "on_its_way"

    @rule(data=st.data(), report=st.booleans(), grace=st.sampled_from([GRACE, 0.1, 0.6]))
    def host_gets_the_write(self, data: st.DataObject, report: bool, grace: float) -> None:
        """The relay writes the answer to the host; with `report`, the broker hears of it. The
        broker's grace may differ between answers (so a later answer may come due first)."""
        ready = [k for k, a in self.answers.items() if a["stage"] == "on_its_way"]
        if not ready:
            return
        key = data.draw(st.sampled_from(ready))
        answer = self.answers[key]
        # the broker's grace where it hears of the write; otherwise the one the host's cancel rule knows
        answer["stage"], answer["at"] = "written", self.now
        answer["grace"] = grace if self.broker is not None and report else GRACE
        self.host_gets(key, answer["messages"])
        self.relay.shown_directly(key, answer["ids"], reported=self.broker is not None)
        if self.broker is None:
            self.save_ledger()
        elif report:
            self.broker.written(key, answer["ids"], self.now, grace)

    @rule(data=st.data())
    def host_cancels(self, data: st.DataObject) -> None:
        """The host cancels a call, before or after its answer was written. A cancel that
        crossed the written answer (sent within the grace, SPEC §3) means the host ignores it;
        one sent later is the host's own business: it had the answer."""
        if not self.answers:
            return
        key = data.draw(st.sampled_from(sorted(self.answers)))
        answer = self.answers.pop(key)
        if answer["stage"] != "written" or self.now - answer["at"] < answer["grace"]:
            for mid in answer["ids"]:
                self.seen.get(mid, set()).discard(key)
        self.relay.cancel(key)
        if self.broker is not None:
            _, again = self.broker.cancel(key)
            for message in again:
                self.relay.again(message)
        else:
            self.save_ledger()

    @rule(seconds=st.sampled_from([0.1, 0.3, 1.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        if self.broker is not None:
            self.flush()
            # an answer the broker heard written is acknowledged once its own grace is over,
            # whatever the graces of the answers written before it
            for key, answer in self.answers.items():
                if answer["stage"] == "written" and self.now - answer["at"] >= answer["grace"]:
                    for mid in answer["ids"]:
                        entry = self.broker.entries.get(mid)
                        assert not (entry is not None and entry.by == key and entry.state == SETTLING), mid

    @precondition(lambda self: self.broker is not None)
    @rule()
    def host_closes_stdin(self) -> None:
        """EOF: no cancel can follow; the broker records what is written, the relay exits
        (the host starts a new one), keeping what the broker did not confirm."""
        assert self.broker is not None
        self.broker.eof()
        self.flush()
        self.kill_relay(ledger=True)

    @rule(ledger=st.booleans())
    def kill_relay(self, ledger: bool = False) -> None:
        """kill -9 (or, with `ledger`, SIGTERM, which saves the ledger first) of the relay; its
        answers in flight never reach the host. A new relay of the same host starts."""
        if ledger:
            self.relay.lost()
            self.save_ledger()
        for key, answer in list(self.answers.items()):
            if answer["stage"] != "written":
                del self.answers[key]
        if self.broker is not None:  # the broker's session ends: its offers are persisted
            for key in list(self.answers):
                self.broker.cancel(key)  # the host never sees another answer of this connection
            self.persist(*self.broker.unconfirmed())
            self.broker = Showing()
            self.pushed = set()
        self.answers.clear()
        self.relay = Showing()
        self.apply_ledger()

    @precondition(lambda self: self.broker is not None)
    @rule()
    def kill_broker(self) -> None:
        """kill -9 of the broker: its memory is gone; the relay keeps what it wrote and was not
        confirmed, in its ledger."""
        self.broker = None
        self.pushed = set()
        for key, answer in list(self.answers.items()):
            if answer["stage"] != "written":
                del self.answers[key]  # never reaches the host now
        self.relay.lost()
        self.save_ledger()

    @precondition(lambda self: self.broker is None)
    @rule()
    def broker_back(self) -> None:
        """A broker starts; the relay's hello hands over what it kept, the broker records it;
        the relay forgets its queued copies (the broker pushes what is unacknowledged)."""
        self.broker = Showing()
        self.answers.clear()
        self.offered_in_store |= set(self.relay.unconfirmed()[0])  # the hello carries the offers too
        due = self.relay.take_acks(self.now)
        self.store_ack(due)
        self.relay.recorded(due)
        self.save_ledger()
        self.relay.forget_queued()

    def apply_ledger(self) -> None:
        offered, acked = self.ledger
        self.offered_in_store |= set(offered) | set(acked)
        self.store_ack(acked)
        self.ledger = ([], [])

    @precondition(lambda self: self.broker is not None)
    @rule(write=st.booleans())
    def stop_hook(self, write: bool) -> None:
        """The Stop hook fetches what the broker is not showing, writes it (unless killed
        first), then acknowledges."""
        assert self.broker is not None
        busy = self.broker.busy()
        fetched = [mid for mid in self.unacked if mid not in busy]
        if not fetched:
            return
        # as broker.ops.hooks.stop_check: a repeat as the store or the broker's machine knows it
        held = self.broker.repeats(fetched)
        messages = [
            dict(self.unacked[m], repeat=True) if self.stored_repeat(m) or m in held else self.unacked[m]
            for m in fetched
        ]
        self.offered_in_store.update(fetched)
        self.broker.offered_elsewhere(fetched)
        if not write:
            return
        self.calls += 1
        self.host_gets(f"stop{self.calls}", messages)
        self.store_ack(fetched)
        self.broker.elsewhere(fetched)
        self.relay.elsewhere(fetched)

    @precondition(lambda self: self.broker is not None)
    @rule(written=st.booleans())
    def channel_push(self, written: bool) -> None:
        """An active message as a channel notification to a host that declared channels:
        acknowledged once written, no grace (there is no request to cancel)."""
        assert self.broker is not None
        queued = self.broker.queued(1)
        if not queued:
            return
        self.calls += 1
        key = f"channel{self.calls}"
        shown = self.broker.offer(key, [queued[0]["id"]])
        self.broker.on_its_way(key)
        if written:  # the relay writes it, then reports it
            self.host_gets(key, shown)
            self.relay.shown_directly(key, [queued[0]["id"]], reported=True)
            self.broker.written(key, [queued[0]["id"]], self.now)

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def acknowledged_only_what_the_host_saw(self) -> None:
        ignored = [mid for mid in self.acked if not self.seen.get(mid)]
        assert not ignored, (
            f"acknowledged, never shown (or shown only in an answer the host ignored): {ignored}"
        )

    @invariant()
    def never_written_twice_without_the_mark(self) -> None:
        assert not self.unmarked_twice, f"written again without repeat: {self.unmarked_twice}"

    @invariant()
    def nothing_unacknowledged_is_lost(self) -> None:
        """Unacknowledged in the store: the broker may still offer it (or will, once pushed);
        it never believes it acknowledged."""
        if self.broker is None:
            return
        for mid in self.unacked:
            assert self.broker.state(mid) != ACKED, (
                f"{mid}: the broker counts it acknowledged, the store does not"
            )

    def teardown(self) -> None:
        """Once everything settles, every message unacknowledged is offered again."""
        if self.broker is None:
            self.broker_back()
        self.answers.clear()
        self.kill_relay(ledger=True)
        self.deliver()
        assert self.broker is not None
        assert {m["id"] for m in self.broker.queued()} == set(self.unacked)


TestDelivery = Delivery.TestCase
TestDelivery.settings = settings(max_examples=1500, stateful_step_count=40, deadline=None)

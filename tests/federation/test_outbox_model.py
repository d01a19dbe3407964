"""The outbox/receipt machines (core/federation.py) driven against a tiny world with hypothesis.

The world: machine A sends messages to machine B, and records decisions for the team (B is
its one other machine, heard by its presence from the start or only later, and forgotten after
a long silence; A's store counts it as core.federation.TeamCount), through a hub. The hub is a
JetStream-like stream per direction (messages and decisions A→B, receipts B→A): it drops a
publish whose Nats-Msg-Id it saw within its dedupe window, delivers unacked entries in any
order and any number of times, and can lose an entry it acknowledged (a power cut with the
default fsync interval, nats-server issue 7564), or its whole store (a new disk). A publish
may land or not, and its answer may be a PubAck or a timeout either way (an unknown outcome).
Either broker can be killed -9: its machines are rebuilt from its committed rows only (a
commit in progress is lost). Receipts come late, or never until asked again.

What must hold:
- never delivered twice: a message is in B's inbox at most once, and within the dedupe window the
  hub holds each message once (retries carry the same Nats-Msg-Id);
- never acked to the stream before commit: an ack names a delivery B (or A) has committed;
- unconfirmed only after the bound (a decision's from when a machine heard was owed it), only
  while no receipt has come, and never a decision owed to nobody (no machine heard);
- owed shown owed: every decision B has not confirmed has its row in A's outbox (what
  `federation status` counts), also while A has heard no machine;
- never lost: after the faults stop (teardown: connected, no losses, time passing), every
  committed send is in B's inbox exactly once, A has its receipt, and no mark is left; every
  committed decision is stored on B and confirmed back to A (its end-to-end receipt), and A's
  machine holds no row its store has ended.

Mutations of core/federation.py this test catches (`python3 tests/federation/mutate_outbox.py`
applies each and runs this test): ack before commit, ack after a failed commit, a new message id
on retry, a timeout treated as a failure, a PubAck treated as delivered, a restart that forgets
relayed messages, unconfirmed before the bound, a decision done at its PubAck, a
confirmation that ends the wrong row, a decision owed to nobody ended at its PubAck, a newcomer
not owed a parked decision, and a parked decision marked unconfirmed. See the module's docstring.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

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


@dataclass
class Entry:
    """One stream entry: its Nats-Msg-Id and the body's id (a message id, or `mid/state`)."""

    seq: int
    msg_id: str
    body: str
    acked: bool = False


@dataclass
class Stream:
    entries: dict[int, Entry] = field(default_factory=dict)
    window: dict[str, str] = field(default_factory=dict)  # Nats-Msg-Id -> body, within the window

    def land(self, seq: int, msg_id: str, body: str) -> None:
        if msg_id in self.window:
            return  # a duplicate: PubAck, nothing stored
        # within the window the hub holds each body once: a retry must carry the same id
        assert body not in self.window.values(), f"{body} stored twice in the window (new id {msg_id})"
        self.window[msg_id] = body
        self.entries[seq] = Entry(seq, msg_id, body)

    def unacked(self) -> list[Entry]:
        return [e for e in self.entries.values() if not e.acked]


@dataclass
class InFlight:
    side: str
    epoch: int
    kind: str
    row_id: str
    msg_id: str
    body: str


class Side:
    """One broker: its committed rows (what a kill -9 keeps) and its machines (what it loses)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.outbox_rows: dict[tuple[str, str], OutboxRow] = {}
        self.outbox = Outbox()
        self.inbound = Inbound()
        self.connected = False
        self.epoch = 0  # a new connection or a restart: answers for older publishes go nowhere
        self.applying: dict[int, Entry] = {}  # fetched, commit in progress (lost by a kill)

    def restart(self, now: float) -> None:
        self.outbox = Outbox()
        self.inbound = Inbound()
        self.applying.clear()
        self.connected = False
        self.epoch += 1
        self.outbox.restore(list(self.outbox_rows.values()), now)


class World(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_790_000_000_000  # epoch ms
        self.seq = 0
        self.sent = 0
        self.a, self.b = Side("a"), Side("b")
        self.msgs, self.rcpts = Stream(), Stream()  # A→B messages, B→A receipts
        self.in_flight: list[InFlight] = []
        # A's committed rows: its sends, the receipts it applied, its marks
        self.a_sends: dict[str, float] = {}  # message id -> queued at
        self.a_receipt: dict[str, int] = {}  # message id -> highest receipt rank
        self.a_unconfirmed: dict[str, float] = {}
        self.a_bound_from: dict[str, float] = {}  # a mark's bound counted from (a decision's owed since)
        self.a_decisions: dict[str, float] = {}  # decision id -> queued at
        self.a_confirmed: set[str] = set()  # decisions B said it stored (team_receipts: kept)
        self.a_heard = False  # B's presence read by A (the machines table), until forgotten
        self.a_parked: set[str] = set()  # decisions A's store last counted with no machine heard
        self.b_decisions: set[str] = set()  # decisions B stored (by id: a repeat stores nothing)
        # B's committed rows
        self.b_inbox: Counter[str] = Counter()
        self.b_state: dict[str, int] = {}  # message id -> its local receipt rank (stored, shown, acked)
        self.b_reported: dict[str, int] = {}  # message id -> the rank its last look queued a receipt for
        for side in (self.a, self.b):  # both start connected; `hub_link` takes them down and up
            self.hub_link(side.name, True)

    @initialize(heard=st.booleans())
    def b_heard_from_the_start(self, heard: bool) -> None:
        if heard:
            self.b_announces()

    def a_count(self, did: str) -> TeamCount:
        """What A's store counts for decision `did`: B heard or not, and its receipt."""
        return TeamCount(heard=int(self.a_heard), awaited=int(self.a_heard and did not in self.a_confirmed))

    def a_counted(self, did: str) -> None:
        """A's store answers a decision's count (after its PubAck or a receipt) while its row is there."""
        if (DEC, did) in self.a.outbox_rows:
            count = self.a_count(did)
            if count.heard:
                self.a_parked.discard(did)
            else:
                self.a_parked.add(did)
            self.run_outbox(self.a, self.a.outbox.counted(did, count, self.now))

    # --- carrying out what the machines answer ------------------------------------------------

    def side(self, name: str) -> Side:
        return self.a if name == "a" else self.b

    def run_outbox(self, s: Side, actions: list[fed.OutboxAction]) -> None:
        for action in actions:
            if isinstance(action, Publish):
                body = action.id  # the body always names the row's own id (message id, mid/state)
                self.in_flight.append(InFlight(s.name, s.epoch, action.kind, action.id, action.msg_id, body))
            elif isinstance(action, MarkRelayed):
                row = s.outbox_rows.get((action.kind, action.id))
                if row is not None:
                    s.outbox_rows[(action.kind, action.id)] = row._replace(relayed_at=action.at)
                if action.kind == DEC:
                    self.a_counted(action.id)
            elif isinstance(action, MarkUnconfirmed):
                assert s is self.a
                if action.kind == DEC:
                    queued = s.outbox_rows[(DEC, action.id)].queued_at  # since a machine heard owes it
                    assert action.id not in self.a_confirmed, "a decision unconfirmed after its receipt"
                    assert action.id not in self.a_parked, "a decision owed to nobody marked unconfirmed"
                else:
                    queued = self.a_sends[action.id]
                    assert self.a_receipt.get(action.id, 0) == 0, "unconfirmed after a receipt"
                assert action.at - queued >= fed.UNCONFIRMED_AFTER, "unconfirmed before the bound"
                self.a_unconfirmed[action.id] = action.at
                self.a_bound_from[action.id] = queued
                row = s.outbox_rows[(action.kind, action.id)]
                s.outbox_rows[(action.kind, action.id)] = row._replace(unconfirmed_at=action.at)
            elif isinstance(action, Drop):
                s.outbox_rows.pop((action.kind, action.id), None)
                if s is self.a and action.kind == DEC:  # the decision's mark goes with its row
                    self.a_unconfirmed.pop(action.id, None)

    def run_inbound(self, s: Side, actions: list[fed.InboundAction], stream: Stream) -> None:
        for action in actions:
            if isinstance(action, Apply):
                s.applying[action.token] = stream.entries[action.token]
            elif isinstance(action, AckStream):
                entry = stream.entries.get(action.token)
                if entry is None:
                    continue
                if s is self.b and entry.body.startswith("d"):
                    assert entry.body in self.b_decisions, f"acked {entry.body} before commit"
                elif s is self.b:
                    readable = not entry.body.startswith("!")
                    assert not readable or self.b_inbox[entry.body] >= 1, f"acked {entry.body} before commit"
                elif entry.body.endswith(f"/{DEC}"):
                    assert entry.body.split("/")[0] in self.a_confirmed, "acked before commit"
                else:
                    mid, state = entry.body.split("/")
                    assert self.a_receipt.get(mid, 0) >= fed.receipt_rank(state), "acked before commit"
                entry.acked = True

    def queue_receipt(self, mid: str) -> None:
        """B commits a receipt row for the message's current state (with what made it so)."""
        state = fed.RECEIPTS[self.b_state[mid] - 1]
        row = OutboxRow(f"{mid}/{state}", RCPT, self.now)
        self.b.outbox_rows.setdefault((RCPT, row.id), row)
        self.b.outbox.queued(row, self.now)

    def deliverable(self) -> bool:
        return bool(self.b.connected and self.msgs.unacked() or self.a.connected and self.rcpts.unacked())

    # --- rules: the senders -----------------------------------------------------------------

    @rule()
    def send(self) -> None:
        """A commits a message to a remote session and its outbox row in one transaction."""
        self.sent += 1
        mid = f"m{self.sent}"
        self.a_sends[mid] = self.now
        row = OutboxRow(mid, MSG, self.now)
        self.a.outbox_rows[(MSG, mid)] = row
        self.a.outbox.queued(row, self.now)

    @rule()
    def decide(self) -> None:
        """A commits a decision for the team and its outbox row in one transaction."""
        did = f"d{len(self.a_decisions) + 1}"
        self.a_decisions[did] = self.now
        row = OutboxRow(did, DEC, self.now)
        self.a.outbox_rows[(DEC, did)] = row
        self.a.outbox.queued(row, self.now)

    @rule()
    def b_announces(self) -> None:
        """A reads B's presence. The first time (or again after forgetting it), A's store makes B a
        member and, in that transaction, owes it every decision it has not confirmed: the rows
        still held (a parked one's bound restarts: nobody was owed it) and, for the ones ended,
        new rows (none here: with one other machine a row ends only on B's receipt), each
        handed to the machine with the team's new count."""
        if self.a_heard:
            return
        alone, self.a_heard = True, True  # B is A's only other machine
        for (kind, did), row in list(self.a.outbox_rows.items()):
            if kind != DEC:
                continue
            if did not in self.a_confirmed and alone:
                row = row._replace(queued_at=self.now, unconfirmed_at=None)
                self.a.outbox_rows[(DEC, did)] = row
                self.a_unconfirmed.pop(did, None)
            elif did in self.a_confirmed and self.a_count(did).awaited:
                continue
            self.a_parked.discard(did)
            self.run_outbox(self.a, self.a.outbox.owed(row, self.a_count(did), self.now))

    @rule()
    def a_forgets_b(self) -> None:
        """B silent for FORGET_AFTER_MS: A's store no longer counts it (its receipts stay). The
        machine is not told; its next count says so."""
        self.a_heard = False

    @rule(dt=st.sampled_from([0, 300, 1_000, 5_000, 45_000, 120_000, 700_000, 1_000_000]))
    def tick(self, dt: float) -> None:
        self.now += dt
        for s in (self.a, self.b):
            self.run_outbox(s, s.outbox.tick(self.now))

    @rule(side=st.sampled_from("ab"), up=st.booleans())
    def hub_link(self, side: str, up: bool) -> None:
        s = self.side(side)
        if up and not s.connected:
            s.connected = True
            s.epoch += 1
            s.outbox.hub_connected(self.now)
        elif not up and s.connected:
            s.connected = False
            s.epoch += 1
            s.outbox.hub_disconnected(self.now)
            s.inbound.hub_disconnected()

    # --- rules: the hub -----------------------------------------------------------------------

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), lands=st.booleans(), answered=st.booleans())
    def publish_outcome(self, data: st.DataObject, lands: bool, answered: bool) -> None:
        """A publish lands or not; its answer is a PubAck (only if it landed) or a timeout."""
        p = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
        if lands:
            self.seq += 1
            (self.rcpts if p.kind == RCPT else self.msgs).land(self.seq, p.msg_id, p.body)
        s = self.side(p.side)
        if s.epoch != p.epoch:
            return  # that connection or that process is gone: nobody hears the answer
        if lands and answered:
            self.run_outbox(s, s.outbox.published(p.kind, p.row_id, self.now))
        else:
            self.run_outbox(s, s.outbox.not_published(p.kind, p.row_id, self.now))

    @rule(data=st.data(), fault=st.sampled_from(["loses", "forgets", "garbage"]), receipts=st.booleans())
    def hub_fault(self, data: st.DataObject, fault: str, receipts: bool) -> None:
        """The hub loses an acknowledged write (a power cut: the entry and its dedupe memory), or
        its dedupe window passes, or a body no broker of ours would send lands in B's stream."""
        stream = self.rcpts if receipts else self.msgs
        if fault == "loses" and stream.entries:
            entry = stream.entries.pop(data.draw(st.sampled_from(sorted(stream.entries))))
            stream.window.pop(entry.msg_id, None)
        elif fault == "forgets":
            stream.window.clear()
        elif fault == "garbage":
            self.seq += 1  # `!`: unreadable
            self.msgs.entries[self.seq] = Entry(self.seq, f"garbage-{self.seq}", f"!{self.seq}")

    @rule()
    def hub_loses_its_store(self) -> None:
        """The hub comes back with an empty store (a power cut that took its files, a new disk):
        every entry and its dedupe memory gone. A connected broker notices (the hub answers it
        has no stream or no consumer) and its machine is told."""
        for stream in (self.msgs, self.rcpts):
            stream.entries.clear()
            stream.window.clear()
        for s in (self.a, self.b):
            if s.connected:
                s.outbox.hub_lost_store(self.now)

    # --- rules: the receivers (one rule per step for both, so a run is rarely without one) ------

    @precondition(lambda self: self.deliverable())
    @rule(data=st.data(), receipts=st.booleans())
    def fetch(self, data: st.DataObject, receipts: bool) -> None:
        """The hub delivers an unacked entry (again, out of order): a message to B, a receipt to A."""
        s, stream = (self.a, self.rcpts) if receipts else (self.b, self.msgs)
        if s.connected and stream.unacked():
            entry = data.draw(st.sampled_from(stream.unacked()))
            self.run_inbound(s, s.inbound.fetched(entry.seq), stream)

    @precondition(lambda self: self.a.applying or self.b.applying)
    @rule(data=st.data(), receipts=st.booleans(), ok=st.booleans())
    def commit(self, data: st.DataObject, receipts: bool, ok: bool) -> None:
        """A store commits one delivery, or fails to (disk full, the store closing): then
        nothing is stored and nothing may be acked."""
        s, stream = (self.a, self.rcpts) if receipts else (self.b, self.msgs)
        if not s.applying:
            s, stream = (self.b, self.msgs) if receipts else (self.a, self.rcpts)
        token = data.draw(st.sampled_from(sorted(s.applying)))
        if not ok:
            del s.applying[token]
            self.run_inbound(s, s.inbound.store_failed(token), stream)
        elif s is self.b:
            self.b_commit_one(token)
        else:
            self.a_commit_one(token)

    @precondition(lambda self: self.b_state)
    @rule(data=st.data())
    def b_shows(self, data: st.DataObject) -> None:
        """The recipient session is shown the message, then acknowledges it (receipts: b_looks)."""
        mid = data.draw(st.sampled_from(sorted(self.b_state)))
        if self.b_state[mid] < fed.receipt_rank(fed.ACKNOWLEDGED):
            self.b_state[mid] += 1

    @rule()
    def b_looks(self) -> None:
        """B's outbox looks at its store (Store.queue_receipt_updates): for each message stored,
        shown or acknowledged since, one receipt row, for the highest state it reached."""
        for mid, rank in sorted(self.b_state.items()):
            if rank > self.b_reported.get(mid, 0):
                self.queue_receipt(mid)
                self.b_reported[mid] = rank

    # --- rules: kill -9 -------------------------------------------------------------------------

    @rule(side=st.sampled_from("ab"))
    def kill(self, side: str) -> None:
        s = self.side(side)
        if s is self.a:  # the store says which relayed decisions no machine heard is left to confirm
            for key, row in s.outbox_rows.items():
                s.outbox_rows[key] = row._replace(
                    parked=row.kind == DEC and row.relayed_at is not None and not self.a_heard)
            self.a_parked = {did for (kind, did), row in s.outbox_rows.items() if row.parked}
        s.restart(self.now)

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def never_twice(self) -> None:
        assert all(n == 1 for n in self.b_inbox.values())
        assert set(self.b_inbox) <= set(self.a_sends)

    @invariant()
    def marks_only_after_the_bound(self) -> None:
        for mid, at in self.a_unconfirmed.items():
            queued = self.a_bound_from[mid] if mid.startswith("d") else self.a_sends[mid]
            assert at - queued >= fed.UNCONFIRMED_AFTER

    @invariant()
    def owed_shown_owed(self) -> None:
        for did in self.a_decisions:
            assert did in self.a_confirmed or (DEC, did) in self.a.outbox_rows, (
                f"{did}: B never confirmed it, and A's outbox no longer holds it")

    def teardown(self) -> None:
        """The faults stop: both connected, A hears B, every publish lands, time passes. Nothing is
        lost."""
        self.b_announces()
        for _ in range(60):
            for s in (self.a, self.b):
                if not s.connected:
                    self.hub_link(s.name, True)
            while self.in_flight:
                p = self.in_flight.pop(0)
                self.seq += 1
                (self.rcpts if p.kind == RCPT else self.msgs).land(self.seq, p.msg_id, p.body)
                s = self.side(p.side)
                if s.epoch == p.epoch:
                    self.run_outbox(s, s.outbox.published(p.kind, p.row_id, self.now))
            for entry in self.msgs.unacked():
                self.run_inbound(self.b, self.b.inbound.fetched(entry.seq), self.msgs)
            while self.b.applying:
                self.b_commit_one(min(self.b.applying))
            self.b_looks()
            for entry in self.rcpts.unacked():
                self.run_inbound(self.a, self.a.inbound.fetched(entry.seq), self.rcpts)
            while self.a.applying:
                self.a_commit_one(min(self.a.applying))
            if (not self.in_flight and all(self.a_receipt.get(m, 0) for m in self.a_sends)
                    and self.a_confirmed == set(self.a_decisions)):
                break
            self.now += fed.RECEIPT_WAIT_MAX
            for s in (self.a, self.b):
                self.run_outbox(s, s.outbox.tick(self.now))
        for mid in self.a_sends:
            assert self.b_inbox[mid] == 1, f"{mid} lost: never reached B's inbox"
            assert self.a_receipt.get(mid, 0) >= 1, f"{mid}: A never heard B's receipt"
            assert mid not in self.a_unconfirmed, f"{mid} still marked unconfirmed after its receipt"
        for did in self.a_decisions:
            assert did in self.b_decisions, f"{did} lost: never stored on B"
            assert did in self.a_confirmed, f"{did}: A never heard B's receipt"
            assert did not in self.a_unconfirmed, f"{did} still marked unconfirmed after its receipt"
        assert not self.a.outbox_rows, "a message or decision with its receipt still in A's outbox"
        assert self.a.outbox.depth() == 0, "A's machine holds a row its store has ended"
        assert not self.msgs.unacked(), "a delivery never acked (garbage included)"

    # --- the stores' transactions --------------------------------------------------------------

    def b_commit_one(self, token: int) -> None:
        """B's store applies one delivery: stored by id, its receipt left to B's next look; a
        repeat stores nothing and queues the receipt it has now (its sender did not hear the last
        one); then acked."""
        mid = self.b.applying.pop(token).body
        if mid.startswith("d"):  # a decision: stored by id, its end-to-end receipt queued either way
            self.b_decisions.add(mid)
            row = OutboxRow(f"{mid}/{DEC}", RCPT, self.now)
            self.b.outbox_rows.setdefault((RCPT, row.id), row)
            self.b.outbox.queued(row, self.now)
            if self.b.connected:
                self.run_inbound(self.b, self.b.inbound.applied(token), self.msgs)
            return
        if mid.startswith("!"):  # unreadable: stored nothing, acked so it stops coming
            if self.b.connected:
                self.run_inbound(self.b, self.b.inbound.rejected(token), self.msgs)
            return
        if self.b_inbox[mid] == 0:
            self.b_inbox[mid] += 1
            self.b_state[mid] = fed.receipt_rank(fed.STORED)
        else:
            self.queue_receipt(mid)
        if self.b.connected:
            self.run_inbound(self.b, self.b.inbound.applied(token), self.msgs)

    def a_commit_one(self, token: int) -> None:
        """A's store applies a receipt monotonically, clears a mark and ends the message's row."""
        mid, state = self.a.applying.pop(token).body.split("/")
        if state == DEC:  # B stored it: kept, and counted while its row is there
            self.a_confirmed.add(mid)
            self.a_counted(mid)
            if self.a.connected:
                self.run_inbound(self.a, self.a.inbound.applied(token), self.rcpts)
            return
        self.a_receipt[mid] = max(self.a_receipt.get(mid, 0), fed.receipt_rank(state))
        self.a_unconfirmed.pop(mid, None)
        self.a.outbox_rows.pop((MSG, mid), None)
        self.run_outbox(self.a, self.a.outbox.receipt(mid, state, self.now))
        if self.a.connected:
            self.run_inbound(self.a, self.a.inbound.applied(token), self.rcpts)


TestOutboxModel = World.TestCase
# No example database: each run searches afresh, so mutate_outbox.py sees what the search finds.
TestOutboxModel.settings = settings(max_examples=2000, stateful_step_count=30, deadline=None, database=None)

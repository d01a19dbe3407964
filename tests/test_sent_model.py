"""The sender's receipts (the `sent` tool, SPEC §3 "Receipts for the sender") against the showing
machine (agent_bridge.core.showing), through every interleaving hypothesis finds.

The system is tests/test_showing_model.py's: one session's broker machine, relay machine, ledger,
Stop hook and channel pushes, killed and restarted at any point. Here the store also keeps what
`sent` reads, written where the processes write it: `receipts.delivered_at` when an
acknowledgement is recorded (the write is done) or when an ended connection leaves written
messages unconfirmed (Broker.persist_offers' `shown`), `receipts.acked_at` with the
acknowledgement, and a wake request when an idle session's waiter fetches (stop_check with
`wake`). `sent`'s state is computed from them by the same code as the tool's
(rows.SentReceipt.receipt_json). After every step:

- for every message, the receipt's state and its wake state never moved back;
- `shown` or `acknowledged` only for a message whose bytes reached the host;
- what the broker's machine holds acknowledged, `sent` says acknowledged;
- a confirmed wake was followed by the message being shown within 20 s.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from agent_bridge.common import domain
from agent_bridge.common.rows import SentReceipt
from agent_bridge.core.showing import ACKED
from tests.test_showing_model import Delivery

STATE_RANK = {state: i for i, state in enumerate(domain.RECEIPT_STATES)}
WOKEN_RANK = {state: i for i, state in enumerate(domain.WAKE_STATES)}


class Receipts(Delivery):
    def __init__(self) -> None:
        super().__init__()
        self.shown_at: dict[str, int] = {}  # receipts.delivered_at
        self.acked_at: dict[str, int] = {}  # receipts.acked_at
        self.wakes: dict[str, list[int]] = {}  # the wakes table
        self.seen_by_sender: dict[str, tuple[int, int]] = {}  # the last (state, woken) ranks `sent` gave

    def ms(self) -> int:
        return int(self.now * 1000)

    # --- where the processes write the receipt (the store's `ack` and `offer(shown=...)`) --------

    def store_ack(self, ids: list[str]) -> None:
        for mid in ids:
            if mid in self.unacked:
                self.shown_at.setdefault(mid, self.ms())
                self.acked_at[mid] = self.ms()
        super().store_ack(ids)

    def persist(self, offered: list[str], written: list[str]) -> None:
        super().persist(offered, written)
        for mid in written:
            self.shown_at.setdefault(mid, self.ms())

    @precondition(lambda self: self.broker is not None)
    @rule(write=st.booleans())
    def waiter(self, write: bool) -> None:
        """An idle session's waiter: the Stop hook's hand-over, its fetch recording a wake
        request for each message it fetched (stop_check with `wake`)."""
        assert self.broker is not None
        busy = self.broker.busy()
        for mid in [m for m in self.unacked if m not in busy]:
            self.wakes.setdefault(mid, []).append(self.ms())
        Delivery.stop_hook(self, write)

    # --- what `sent` says -----------------------------------------------------------------------

    def receipt(self, mid: str) -> dict[str, Any]:
        wakes = tuple(self.wakes.get(mid, ()))
        row = SentReceipt(None, self.shown_at.get(mid), self.acked_at.get(mid), wakes)  # type: ignore[arg-type]
        return row.receipt_json(self.ms())

    def every_message(self) -> list[str]:
        return [f"m{i}" for i in range(1, self.sent + 1)]

    @invariant()
    def sent_never_moves_back(self) -> None:
        for mid in self.every_message():
            r = self.receipt(mid)
            ranks = (STATE_RANK[r["state"]], WOKEN_RANK[r["woken"]])
            before = self.seen_by_sender.get(mid, (0, 0))
            assert ranks[0] >= before[0] and ranks[1] >= before[1], (mid, before, r)
            self.seen_by_sender[mid] = ranks

    @invariant()
    def shown_only_after_the_bytes_reached_the_host(self) -> None:
        for mid in self.every_message():
            if self.receipt(mid)["state"] != "queued":
                assert mid in self.written_ever, f"{mid}: `sent` says shown, the host never got it"

    @invariant()
    def agrees_with_the_machine(self) -> None:
        for mid in self.every_message():
            r = self.receipt(mid)
            if self.broker is not None and self.broker.state(mid) == ACKED:
                assert r["state"] == "acknowledged", (mid, r)
            assert (r["state"] == "acknowledged") == (mid in self.acked), (mid, r)

    @invariant()
    def a_confirmed_wake_was_followed_by_the_message_shown(self) -> None:
        for mid, asked in self.wakes.items():
            if self.receipt(mid)["woken"] == "confirmed":
                times = [t for t in (self.shown_at.get(mid), self.acked_at.get(mid)) if t is not None]
                assert any(r <= t <= r + domain.WAKE_CONFIRM_MS for r in asked for t in times)


TestReceipts = Receipts.TestCase
TestReceipts.settings = settings(max_examples=1000, stateful_step_count=40, deadline=None)

"""A decision's receipts as the dashboard reads them, on a real bridge.db: a session that got
one revision twice (its host session was cleared, so it caught up again) is one entry, pending
while either copy is, acknowledged when both are."""

from __future__ import annotations

from pathlib import Path

from agent_bridge.dashboard import reads
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.writer import Store


def test_two_copies_for_one_session_are_one_entry_pending_until_both_are_acknowledged(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "bridge.db")
    try:
        a = store.create_peer(agent="claude", name="claude-app", project="/w/app", kind="interactive",
                              host_session_id="h-a", now=1)
        b = store.create_peer(agent="codex", name="codex-app", project="/w/app", kind="interactive",
                              host_session_id="h-b1", now=1)
        decision, _ = store.record_decision(
            author=a.view(), author_agent="claude", topic="db", text="PostgreSQL", scope="all",
            source_message_id=None, recipients=[Recipient(b.view(), "h-b1")], now=10,
        )
        cleared = store.update_peer(b.id, host_session_id="h-b2")  # /clear: a new identity for catch-up
        assert store.catch_up(cleared.view(), now=20) == 1
        first, second = (m.id for m in store.unacked(b.id))

        def entry() -> dict[str, object]:
            (found,) = reads.decision_receipts(store.conn, [decision.id])
            return found.to_json(connected=False)

        assert entry() == {
            "decisionId": decision.id, "topic": "db",
            "session": {"id": b.id, "name": "codex-app", "agent": "codex", "connected": False},
            "queuedAt": 10, "deliveredAt": None, "acknowledgedAt": None, "pending": True,
        }
        store.offer(b.id, [first], now=30)  # offered, maybe shown: not known to be shown yet
        assert entry()["deliveredAt"] is None
        store.ack(b.id, [first], now=31)  # its write is done: shown then
        assert (entry()["deliveredAt"], entry()["acknowledgedAt"], entry()["pending"]) == (31, None, True)
        store.ack(b.id, [second], now=40)
        assert (entry()["deliveredAt"], entry()["acknowledgedAt"], entry()["pending"]) == (40, 40, False)
    finally:
        store.close()

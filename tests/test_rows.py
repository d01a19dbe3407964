"""The rows inside the process and their one JSON edge (`to_json`), on a real bridge.db.

The field lists are SPEC §4.1 and §5's, written out here, not taken from the code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_bridge.common.rows import Peer
from agent_bridge.store import queries
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.peers import CLI_AUTHOR
from agent_bridge.store.writer import Store
from tests.shapes import DECISION_FIELDS

WHOAMI_FIELDS = {"id", "name", "agent", "project", "hostSessionId", "kind"}  # SPEC §5 whoami
# SPEC §5 inbox, decision? aside
INBOX_FIELDS = {"id", "from", "to", "text", "hop", "replyTo", "kind", "createdAt"}


def _two_sessions(tmp_path: Path) -> tuple[Store, Peer, Peer]:
    store = Store.open(tmp_path / "bridge.db")
    a = store.create_peer(agent="claude", name="claude-app", project="/w/app", kind="interactive",
                          host_session_id="h-a", now=1)
    b = store.create_peer(agent="codex", name="codex-app", project="/w/app", kind="interactive",
                          host_session_id=None, now=2)
    return store, a, b


def test_a_sent_message_is_the_row_read_back_from_the_database(tmp_path):
    """The delivery task pushes what send_messages returned (the tap) or what it reads back:
    both must be the same message, down to the JSON."""
    store, a, b = _two_sessions(tmp_path)
    try:
        (sent,) = store.send_messages(a.id, [Outgoing(b.id, "hello", 1, None)], now=10)
        (read,) = queries.unacked_messages(store.conn, b.id, current_schema=True)
        assert read.message == sent
        as_json = json.loads(json.dumps(sent.to_json()))
        assert set(as_json) == INBOX_FIELDS
        assert as_json["from"] == {"id": a.id, "name": "claude-app", "agent": "claude"}
        assert as_json["to"] == {"id": b.id, "name": "codex-app"}
        assert (
            as_json["text"],
            as_json["hop"],
            as_json["replyTo"],
            as_json["kind"],
            as_json["createdAt"],
        ) == ("hello", 1, None, "message", 10)
    finally:
        store.close()


def test_a_message_offered_before_is_a_repeat_only_in_the_inbox(tmp_path):
    store, a, b = _two_sessions(tmp_path)
    try:
        (sent,) = store.send_messages(a.id, [Outgoing(b.id, "hello", 1, None)], now=10)
        store.offer(b.id, [sent.id], now=11)
        (queued,) = queries.unacked_messages(store.conn, b.id, current_schema=True)
        assert queued.message.to_json()["repeat"] is True
        (recent,) = queries.recent_messages(store.conn)
        assert "repeat" not in recent.to_json() and recent.to_json()["acked"] is False
    finally:
        store.close()


def test_a_decision_notice_carries_the_decision_object(tmp_path):
    store, a, b = _two_sessions(tmp_path)
    try:
        decision, delivered = store.record_decision(
            author=a.view(),
            author_agent="claude",
            topic="db",
            text="PostgreSQL",
            scope={"project": "/w/app"},
            source_message_id=None,
            recipients=[Recipient(b.view(), f"peer:{b.id}")],
            now=20,
        )
        assert delivered == ["codex-app"]
        as_json = json.loads(json.dumps(decision.to_json()))
        assert set(as_json) == DECISION_FIELDS
        assert as_json["scope"] == {"project": "/w/app"} and as_json["current"] is True
        assert as_json["author"] == {"id": a.id, "name": "claude-app", "agent": "claude"}
        (notice,) = store.unacked(b.id)
        notice_json = json.loads(json.dumps(notice.to_json()))
        assert set(notice_json) == INBOX_FIELDS | {"decision"}
        assert notice_json["kind"] == "decision" and notice_json["hop"] == 100
        assert notice_json["decision"] == as_json
    finally:
        store.close()


def test_a_retraction_notice_carries_the_retraction(tmp_path):
    store, a, b = _two_sessions(tmp_path)
    try:
        store.record_decision(
            author=a.view(), author_agent="claude", topic="db", text="PostgreSQL", scope="all",
            source_message_id=None, recipients=[], now=20,
        )
        retraction, notified = store.retract(
            topic="db", reason="moved", author=CLI_AUTHOR, author_agent="cli", connected=[b.view()], now=30
        )
        assert notified == [(b.id, "codex-app")]
        (notice,) = store.unacked(b.id)
        notice_json = json.loads(json.dumps(notice.to_json()))
        assert set(notice_json) == INBOX_FIELDS | {"retraction"}
        assert notice_json["kind"] == "retraction"
        assert notice_json["retraction"] == {
            "id": retraction.id, "topic": "db", "retracts": retraction.retracts, "reason": "moved",
            "author": {"id": "cli", "name": "cli", "agent": "cli"}, "createdAt": 30,
        }
    finally:
        store.close()


def test_a_session_record_as_whoami_and_as_the_dashboard_shows_it(tmp_path):
    store, a, b = _two_sessions(tmp_path)
    try:
        updated = store.update_peer(b.id, host_session_id="h-b", last_seen_at=40)
        assert updated.host_session_id == "h-b" and updated.last_seen_at == 40
        assert updated.public() == {"id": b.id, "name": "codex-app", "agent": "codex", "project": "/w/app",
                                    "hostSessionId": "h-b", "kind": "interactive"}
        assert set(updated.public()) == WHOAMI_FIELDS
        assert updated.to_json() == {**updated.public(), "createdAt": 2, "lastSeenAt": 40}
        assert queries.peer_by_host_session(store.conn, "h-b") == updated
    finally:
        store.close()


def test_update_peer_refuses_a_field_that_is_not_a_column_it_may_set(tmp_path):
    store, a, _ = _two_sessions(tmp_path)
    try:
        with pytest.raises(ValueError, match="hostSessionId"):
            store.update_peer(a.id, hostSessionId="h-x")  # the JSON name, not the column's
        assert store.get_peer(a.id) == a
    finally:
        store.close()


"""SPEC §8 for the owner's controls: a broker killed (kill -9) while upgrading a version-3
database to version 4, while recording a retraction, or while forgetting sessions leaves the
database exactly as it was; the next broker does the whole thing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio

from agent_bridge.common import domain, paths
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.schema import CURRENT_VERSION
from agent_bridge.store.writer import Store
from tests.conftest import CLI, BrokerProcess, run_cli
from tests.reliability.harness import KILLED, start_faulty_broker, wait_killed
from tests.test_owner_store import build_v3

pytestmark = pytest.mark.slow

TABLES = ("peers", "messages", "receipts", "decisions", "decision_deliveries")
# later versions add some; V_WAKES moves the offer a receipt held in delivered_at to offered_at
V3_COLUMNS = {
    "peers": "id, name, agent, project, kind, created_at, last_seen_at, host_session_id",
    "messages": "id, from_peer, to_peer, body, hop, reply_to, created_at, acked_at",
    "receipts": "message_id, peer_id, acked_at",
    # V_FED (version 11) adds the recording machine
    "decisions": "seq, id, topic, text, text_key, scope, scope_kind, scope_project, author_id, author_name, "
                 "author_agent, created_at, source_message_id, supersedes",
}


def snapshot(db: Path) -> dict[str, Any]:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        # sqlite_stat*: planner statistics SQLite's optimizer may write, not data
        names = {
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_stat%'"
            )
        }
        return {
            "integrity": conn.execute("PRAGMA integrity_check").fetchone()[0],
            "version": conn.execute("PRAGMA user_version").fetchone()[0],
            "data": {t: sorted(map(repr, conn.execute(f"SELECT {V3_COLUMNS.get(t, '*')} FROM {t}")))
                     for t in sorted(names)},
        }
    finally:
        conn.close()


@pytest.mark.parametrize("point", ["upgrade:after-step", "upgrade:before-commit"])
async def test_kill_during_the_upgrade_to_version_4(env, home, point):
    home.mkdir(mode=0o700, parents=True)
    db = home / "bridge.db"
    build_v3(db)
    before = snapshot(db)
    with trio.fail_after(120):
        proc = await trio.run_process(
            [*CLI, "up"],
            env={**env, "AGENT_BRIDGE_FAULT": point},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert proc.returncode == KILLED, proc.stderr.decode()
    assert snapshot(db) == before  # version 3, every row, no v4 table
    (backup,) = home.glob("bridge.db.v3-*.bak")
    assert snapshot(backup)["data"] == before["data"]

    broker = BrokerProcess(env, home).start()
    try:
        assert broker.status()["schemaVersion"] == CURRENT_VERSION
        after = snapshot(db)
        for table in TABLES:
            assert after["data"][table] == before["data"][table], table
        assert after["data"]["decision_retractions"] == []
    finally:
        broker.stop()


def _prepare(home: Path) -> tuple[str, list[str]]:
    """Two sessions (gone) that were sent the current `db` decision, and messages to one of them."""
    paths.ensure_home(home)
    store = Store.open(paths.db_path(home))
    try:
        views = []
        for name in ("claude-a", "codex-b"):
            p = store.create_peer(agent=name.split("-")[0], name=name, project="/w/app", kind="interactive",
                                  host_session_id=f"host-{name}", now=1)
            views.append(p.view())
        decision, _ = store.record_decision(
            author=views[0],
            author_agent="claude",
            topic="db",
            text="PostgreSQL",
            scope=domain.parse_scope("all"),
            source_message_id=None,
            recipients=[Recipient(v, v.host_session_id or "") for v in views],
            now=2,
        )
        store.send_messages(views[0].id, [Outgoing(views[1].id, "waiting", 1, None)], now=3)
        return decision.id, [v.id for v in views]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("point", "command"),
    [
        ("retract:after-record", ("retract", "db", "--reason", "r", "--json")),
        ("retract:mid-notices", ("retract", "db", "--reason", "r", "--json")),
        ("retract:before-commit", ("retract", "db", "--reason", "r", "--json")),
        ("forget:before-commit", ("forget", "claude-a", "codex-b", "--json")),
    ],
)
async def test_kill_while_retracting_or_forgetting_changes_nothing(env, home, point, command):
    decision_id, peer_ids = _prepare(home)
    db = home / "bridge.db"
    broker = start_faulty_broker(env, home, point)
    before = snapshot(db)
    done = await trio.to_thread.run_sync(lambda: run_cli(env, *command))
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert await wait_killed(broker) == KILLED
    assert snapshot(db) == before  # all or nothing: here, nothing

    again = BrokerProcess(env, home).start()
    try:
        done = run_cli(env, *command)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        if command[0] == "retract":
            assert result["retraction"]["retracts"] == decision_id
            assert result["notified"] == ["claude-a", "codex-b"]
        else:
            assert sorted(i["session"]["id"] for i in result["forgotten"]) == sorted(peer_ids)
            assert [
                m["text"] for i in result["forgotten"] for m in i["dropped"] if m["kind"] == "message"
            ] == ["waiting"]
    finally:
        again.stop()

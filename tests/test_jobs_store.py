"""Jobs in the store (SPEC §4.7), on real SQLite files: the upgrade to schema V_JOBS from every
earlier version, the append-only rules of `jobs` and `job_events`, and a run's end recorded once
with one answer message of kind `job` to the parent, which waits there like any message."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from agent_bridge.common import domain
from agent_bridge.store.schema import CURRENT_VERSION, STEPS, V_JOBS
from agent_bridge.store.writer import Store

JOBS_VERSION = STEPS.index(V_JOBS) + 1
JOB_ID = "4201b772-096b-494f-8770-5ce402ae5217"


def new_job(store: Store, parent: str, *, now: int = 100) -> None:
    store.record_job(job_id=JOB_ID, name=domain.job_name("codex", JOB_ID), parent_id=parent, agent="codex",
                     title="review", task="review the diff", access="read", project="/w", cwd="/w",
                     worktree=None, branch=None, model=None, depth=1, timeout_ms=60_000, now=now)


@pytest.fixture
def store(tmp_path: Path):
    s = Store.open(tmp_path / "bridge.db")
    yield s
    s.close()


def parent_of(store: Store) -> str:
    return store.create_peer(agent="claude", name="claude-w", project="/w", kind="interactive",
                             host_session_id="hs", now=1).id


@pytest.mark.parametrize("old", range(JOBS_VERSION))
def test_the_upgrade_to_jobs_keeps_sessions_and_messages_and_takes_jobs(tmp_path: Path, old: int) -> None:
    db = tmp_path / "bridge.db"
    conn = apsw.Connection(str(db))
    for step in STEPS[:old]:
        conn.execute(step)
    if old >= 1:
        conn.execute("INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at) VALUES "
                     "('p1','claude-w','claude','/w','interactive',1,1),"
                     "('p2','codex-w','codex','/w','interactive',1,1)")
        conn.execute("INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) VALUES "
                     "('m1','p2','p1','before the upgrade',1,NULL,10)")
    if old >= 2:  # from V2 on, a broker writes a receipt with each message (V2 made them for the older ones)
        conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES ('m1','p1')")
    conn.close()
    store = Store.open(db)
    try:
        assert store.version() == CURRENT_VERSION
        assert store.jobs(every=True) == []
        parent = "p1" if old >= 1 else parent_of(store)
        new_job(store, parent)
        assert store.end_job_run(JOB_ID, 1, "finished", 200, body="Job done", answer="ok", thread="t",
                                 last_step=None) is not None
        kinds = [(m.text, m.kind) for m in store.unacked(parent)]
        expected = [("before the upgrade", "message")] if old >= 1 else []
        assert kinds == [*expected, ("Job done", "job")]
    finally:
        store.close()


def test_a_new_job_is_queued_with_its_own_session_of_kind_job(store: Store) -> None:
    parent = parent_of(store)
    new_job(store, parent)
    [row] = store.jobs()
    assert (row.state, row.run, row.parent.id, row.depth) == ("queued", 1, parent, 1)
    peer = store.conn.execute("SELECT kind, name, host_session_id FROM peers WHERE id = ?",
                              (row.peer_id,)).fetchone()
    assert peer == ("job", row.name, JOB_ID)
    assert store.find_jobs(row.name) == [row] and store.find_jobs(JOB_ID[:8]) == [row]


def test_jobs_and_their_events_are_append_only(store: Store) -> None:
    new_job(store, parent_of(store))
    for sql in ("UPDATE jobs SET task = 'other'", "UPDATE job_events SET state = 'finished'",
                "DELETE FROM job_events"):
        with pytest.raises(apsw.ConstraintError, match="append-only"):
            store.conn.execute(sql)
    assert store.conn.execute("SELECT task FROM jobs").fetchall() == [("review the diff",)]


def test_a_run_ends_once_with_one_message_and_a_continued_run_ends_again(store: Store) -> None:
    parent = parent_of(store)
    new_job(store, parent)
    store.job_event(JOB_ID, 1, "running", 110, pid=4242, pid_start=7)
    first = store.end_job_run(JOB_ID, 1, "finished", 200, body="Job finished", answer="x" * 9000, thread="t1",
                              last_step="whoami")
    again = store.end_job_run(JOB_ID, 1, "failed", 210, body="Job failed", answer=None, thread=None,
                              last_step=None)
    assert first is not None and again is None
    row = store.job(JOB_ID)
    assert row is not None and (row.state, row.thread, len(row.answer or "")) == ("finished", "t1", 8000)
    assert [m.id for m in store.unacked(parent)] == [first]
    # continue: a second run, its own end and message
    store.job_event(JOB_ID, 2, "queued", 300, prompt="and the tests?")
    second = store.end_job_run(JOB_ID, 2, "interrupted", 400, body="Job interrupted", answer=None,
                               thread="t1", last_step=None)
    assert second is not None and [m.id for m in store.unacked(parent)] == [first, second]
    row = store.job(JOB_ID)
    assert row is not None and (row.state, row.run, row.prompt) == ("interrupted", 2, "and the tests?")


def test_a_job_whose_parent_was_forgotten_ends_with_no_message(store: Store) -> None:
    parent = parent_of(store)
    new_job(store, parent)
    store.forget_peers([parent], 150)
    assert store.end_job_run(JOB_ID, 1, "finished", 200, body="nobody", answer="ok", thread=None,
                             last_step=None) is None
    row = store.job(JOB_ID)
    assert row is not None and row.state == "finished"
    assert store.conn.execute("SELECT count(*) FROM messages WHERE body = 'nobody'").fetchone() == (0,)

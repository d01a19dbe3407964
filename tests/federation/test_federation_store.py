"""The store's side of federation (store/federation.py, schema versions 11 and 12), with two real stores
standing for two machines and the test carrying the outbox's bodies between them as the hub would
(decoded by core/envelopes, as the receiving broker does)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_bridge.common import domain
from agent_bridge.common.domain import SessionView
from agent_bridge.core import envelopes as env
from agent_bridge.core import federation as fed
from agent_bridge.store import federation_queries as fq
from agent_bridge.store import queries
from agent_bridge.store.federation import Applied
from agent_bridge.store.schema import CURRENT_VERSION, STEPS, V_FED
from agent_bridge.store.writer import Store

T0 = 1_790_000_000_000
KEY = "github.com/Org/App"


CLI = env.Author("cli", "cli", "cli")


def dec(did: str, topic: str, text: str, at: int) -> env.DecisionEnvelope:
    return env.DecisionEnvelope(did, topic, text, None, CLI, at, None, None)


@pytest.fixture
def laptop(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "laptop.db")


@pytest.fixture
def devbox(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "devbox.db")


def session(store: Store, name: str, project: str = "/w/app") -> SessionView:
    agent = name.split("-")[0]
    return store.create_peer(agent=agent, name=name, project=project, kind="interactive",
                             host_session_id=None, now=T0).view()


def announce(store: Store, machine: str, sessions: list[SessionView], at: int, key: str | None = KEY) -> None:
    """`store`'s machine hears `machine`'s presence."""
    presence = env.PresenceEnvelope(at, tuple(
        env.PresenceSession(s.id, s.name, s.name.split("-")[0], s.project, key, "interactive", "idle")
        for s in sessions
    ))
    store.record_presence(machine, env.decode_presence(env.encode(presence)), at)


def outbox(store: Store, kind: str) -> dict[str, tuple[str | None, bytes]]:
    found = {}
    for row in store.outbox_rows():
        if row.kind == kind:
            item = store.outbox_item(kind, row.id)
            assert item is not None
            found[row.id] = item
    return found


def test_remote_sessions_come_from_presence_and_go_offline_after_90_s(laptop: Store, devbox: Store) -> None:
    codex = session(devbox, "codex-app")
    mine = session(laptop, "claude-app")
    announce(laptop, "devbox", [codex], T0)
    [remote] = fq.remote_sessions(laptop.conn, T0 + 1000)
    assert (remote.name, remote.machine, remote.state) == ("codex-app", "devbox", "idle")
    assert remote.remote_id == codex.id
    assert remote.address == "codex-app@devbox" and remote.project_key == KEY
    assert [p.id for p in laptop.list_peers()] == [mine.id]  # never listed or addressed as local
    assert laptop.find_peers_by_address("codex-app") == []
    assert fq.remote_sessions(laptop.conn, T0 + fed.OFFLINE_AFTER_MS)[0].state == "idle"
    assert fq.remote_sessions(laptop.conn, T0 + fed.OFFLINE_AFTER_MS + 1)[0].state == "offline"
    announce(laptop, "devbox", [], T0 + 100_000)  # no longer announced: offline though heard
    assert fq.remote_sessions(laptop.conn, T0 + 100_001)[0].state == "offline"
    assert fq.remote_session(laptop.conn, "codex-app", "devbox", T0) is not None
    assert fq.remote_session(laptop.conn, "codex-app", "laptop", T0) is None
    assert [m.name for m in fq.machines(laptop.conn)] == ["devbox"]


def test_session_state_rule() -> None:
    assert fed.session_state("busy", T0, T0 + 90_000) == "busy"
    assert fed.session_state("busy", T0, T0 + 90_001) == "offline"
    assert fed.session_state("idle", None, T0) == "offline"
    assert fed.session_state("weird", T0, T0) == "offline"


def send_to_devbox(laptop: Store, devbox: Store, text: str = "review please?", **kw: str) -> tuple[str, str]:
    sender = session(laptop, "claude-app")
    codex = session(devbox, "codex-app")
    announce(laptop, "devbox", [codex], T0)
    stored = laptop.queue_remote_message(sender.id, f"{codex.id}@devbox", text, 1, None, T0 + 1, **kw)
    return stored.messages[0].id, codex.id


def test_a_message_arrives_once_and_its_receipts_come_back(laptop: Store, devbox: Store) -> None:
    mid, codex = send_to_devbox(laptop, devbox)
    [(machine, body)] = outbox(laptop, fed.MSG).values()
    assert machine == "devbox"
    message = env.decode_message(body)
    assert (message.id, message.to_id, message.text) == (mid, codex, "review please?")

    assert devbox.apply_remote_message("laptop", message, T0 + 2) is Applied.NEW
    assert devbox.apply_remote_message("laptop", message, T0 + 3) is Applied.REPEAT  # redelivered
    [got] = devbox.unacked(codex)
    # shown by its address on its machine (SPEC §10: `from.machine` and `name@machine`)
    assert (got.id, got.text, got.sender.name) == (mid, "review please?", "claude-app@laptop")
    assert got.sender.id.endswith("@laptop") and got.sender.to_json()["machine"] == "laptop"
    assert devbox.conn.execute("SELECT machine FROM messages WHERE id = ?", (mid,)).fetchone()[0] == "laptop"
    assert list(outbox(devbox, fed.RCPT)) == [f"{mid}/stored"]  # answered, once

    devbox.ack(codex, [mid], T0 + 10)
    assert devbox.queue_receipt_updates(T0 + 11) == 1
    assert devbox.queue_receipt_updates(T0 + 12) == 0  # reported once
    receipts = outbox(devbox, fed.RCPT)
    assert set(receipts) == {f"{mid}/stored", f"{mid}/acknowledged"}
    assert {m for m, _ in receipts.values()} == {"laptop"}

    ack = env.decode_receipt(receipts[f"{mid}/acknowledged"][1])
    stored = env.decode_receipt(receipts[f"{mid}/stored"][1])
    assert laptop.apply_remote_receipt("laptop", ack, T0 + 20) is False  # only its machine answers
    assert laptop.apply_remote_receipt("devbox", ack, T0 + 20) is True
    assert laptop.apply_remote_receipt("devbox", stored, T0 + 21) is False  # late, lower: no going back
    [sent] = laptop.sent(laptop.list_peers()[0].id, [mid], 10)
    assert sent.state == domain.ACKNOWLEDGED
    assert outbox(laptop, fed.MSG) == {}  # its receipt ends the outbox row
    row = laptop.conn.execute("SELECT stored_at, unconfirmed_at FROM messages WHERE id = ?", (mid,))
    assert row.fetchone() == (T0 + 11, None)
    marks = fq.RemoteMarks("devbox", None, T0 + 11, None)
    assert fq.remote_marks(laptop.conn, [mid, "other"]) == {mid: marks}
    assert fq.sending_machines(devbox.conn, [mid]) == {mid: "laptop"}
    assert fq.sending_machines(laptop.conn, [mid]) == {} and fq.remote_marks(devbox.conn, [mid]) == {}


def test_a_look_queues_one_receipt_for_the_highest_state_a_message_reached(
    laptop: Store, devbox: Store
) -> None:
    """A new message's receipt is not queued by the transaction that stores it (off the path to
    its recipient) but by the outbox's next look, for the highest state reached by then: one
    acknowledged before the look sends `acknowledged` alone; one not shown yet sends `stored`,
    then `shown` and `acknowledged` as later looks find them."""
    quick, codex = send_to_devbox(laptop, devbox)
    sender = laptop.list_peers()[0].id
    later = laptop.queue_remote_message(sender, f"{codex}@devbox", "and this one?", 1, None, T0 + 1)
    slow = later.messages[0].id
    for mid in (quick, slow):
        message = env.decode_message(outbox(laptop, fed.MSG)[mid][1])
        assert devbox.apply_remote_message("laptop", message, T0 + 2) is Applied.NEW
    assert outbox(devbox, fed.RCPT) == {}  # nothing queued on the message's path
    devbox.offer(codex, [quick], T0 + 3, shown=[quick])
    devbox.ack(codex, [quick], T0 + 4)
    assert devbox.queue_receipt_updates(T0 + 5) == 2
    assert set(outbox(devbox, fed.RCPT)) == {f"{quick}/acknowledged", f"{slow}/stored"}
    devbox.offer(codex, [slow], T0 + 6, shown=[slow])
    devbox.queue_receipt_updates(T0 + 7)
    devbox.ack(codex, [slow], T0 + 8)
    devbox.queue_receipt_updates(T0 + 9)
    assert devbox.queue_receipt_updates(T0 + 10) == 0
    assert set(outbox(devbox, fed.RCPT)) == {f"{quick}/acknowledged", f"{slow}/stored", f"{slow}/shown",
                                             f"{slow}/acknowledged"}
    # the one receipt ends the sender's row and tells `sent` everything: stored, shown, acknowledged
    ack = env.decode_receipt(outbox(devbox, fed.RCPT)[f"{quick}/acknowledged"][1])
    assert laptop.apply_remote_receipt("devbox", ack, T0 + 11) is True
    [sent] = laptop.sent(sender, [quick], 10)
    assert sent.state == domain.ACKNOWLEDGED and quick not in outbox(laptop, fed.MSG)
    assert fq.remote_marks(laptop.conn, [quick])[quick].stored_at == T0 + 5


def test_a_repeat_answers_with_the_receipt_it_has_now(laptop: Store, devbox: Store) -> None:
    mid, codex = send_to_devbox(laptop, devbox)
    message = env.decode_message(next(iter(outbox(laptop, fed.MSG).values()))[1])
    devbox.apply_remote_message("laptop", message, T0 + 2)
    devbox.ack(codex, [mid], T0 + 3)
    for row in list(outbox(devbox, fed.RCPT)):
        devbox.drop(fed.RCPT, row)  # published; then the hub lost them, and laptop sends again
    assert devbox.apply_remote_message("laptop", message, T0 + 4) is Applied.REPEAT
    assert list(outbox(devbox, fed.RCPT)) == [f"{mid}/acknowledged"]
    assert len(devbox.unacked(codex)) == 0


def test_unconfirmed_is_marked_and_a_late_receipt_clears_it(laptop: Store, devbox: Store) -> None:
    mid, _ = send_to_devbox(laptop, devbox)
    laptop.mark_relayed(fed.MSG, mid, T0 + 5)
    laptop.mark_unconfirmed(mid, T0 + 900_000)
    [row] = laptop.outbox_rows()
    assert (row.relayed_at, row.unconfirmed_at) == (T0 + 5, T0 + 900_000)
    marks = "SELECT relayed_at, unconfirmed_at FROM messages WHERE id = ?"
    assert laptop.conn.execute(marks, (mid,)).fetchone() == (T0 + 5, T0 + 900_000)
    late = env.ReceiptEnvelope(mid, "stored", T0 + 1_000_000)
    assert laptop.apply_remote_receipt("devbox", late, T0 + 1_000_001) is True
    assert laptop.conn.execute(marks, (mid,)).fetchone() == (T0 + 5, None)
    assert laptop.outbox_rows() == []


def test_a_send_with_a_message_id_is_stored_once(laptop: Store, devbox: Store) -> None:
    key = "0f8fad5b-d9cb-469f-a165-70867728950e"
    mid, codex = send_to_devbox(laptop, devbox, key=key, address="codex-app@devbox")
    assert mid == key
    sender = laptop.list_peers()[0].id
    again = laptop.queue_remote_message(sender, f"{codex}@devbox", "review please?", 1, None, T0 + 9,
                                        key=key, address="codex-app@devbox")
    assert again.duplicate and again.messages[0].id == key
    assert len(laptop.outbox_rows()) == 1
    with pytest.raises(domain.InputError):
        laptop.queue_remote_message(sender, f"{codex}@devbox", "other text", 1, None, T0 + 9, key=key,
                                    address="codex-app@devbox")


def test_what_cannot_be_applied_stores_nothing(laptop: Store, devbox: Store) -> None:
    mine = session(laptop, "claude-app")
    with pytest.raises(domain.InputError):
        laptop.queue_remote_message(mine.id, mine.id, "to a local session", 1, None, T0)
    nobody = env.MessageEnvelope("m-x", env.Author("a", "claude-app", "claude"), "no-such-session", "ghost",
                                 "hi", 1, None, T0, None)
    with pytest.raises(domain.InputError):
        devbox.apply_remote_message("laptop", nobody, T0)
    assert devbox.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    assert devbox.outbox_rows() == []


def decide(store: Store, author: SessionView, topic: str, text: str, scope: domain.Scope, now: int) -> str:
    decision, _ = store.record_decision(author=author, author_agent="claude", topic=topic, text=text,
                                        scope=scope, source_message_id=None, recipients=[], now=now)
    return decision.id


def replicate(source: Store, target: Store, machine: str, keys: dict[str, str | None]) -> list[Applied]:
    source.queue_team_decisions(T0, lambda folder: keys.get(folder))
    out = []
    for row_id, (dest, body) in outbox(source, fed.DEC).items():
        assert dest is None
        out.append(target.apply_remote_decision(machine, env.decode_decision(body), T0 + 50))
        source.drop(fed.DEC, row_id)
    return out


def current(store: Store, topic: str) -> str | None:
    found = queries.query_decisions(store.conn, topic=topic)
    return found[0].id if found else None


def test_a_look_that_finds_nothing_new_changes_no_row(laptop: Store) -> None:
    """The broker's outbox looks at the store after every commit that changed rows (the commit
    feed); a look that finds nothing new must change none itself, or an idle broker pokes its
    own feed and every follower (post box, indexer, alerts, this look) runs again, GAP apart,
    for ever. Once the decisions and the retraction are queued, looking again writes nothing."""
    me = session(laptop, "claude-app", "/home/me/app")
    decide(laptop, me, "camera", "hold to look", "all", T0)
    laptop.retract(topic="camera", reason="gone", author=me, author_agent="claude", connected=[], now=T0 + 1)
    assert laptop.queue_team_decisions(T0 + 2, {}.get) == 2
    before = laptop.conn.total_changes()
    for at in (T0 + 3, T0 + 4):
        assert laptop.queue_team_decisions(at, {}.get) == 0
        laptop.queue_receipt_updates(at)
        laptop.outbox_rows()
        assert laptop.forget_remote(at, fed.FORGET_AFTER_MS) == []
    assert laptop.conn.total_changes() == before


def test_decisions_reach_the_team_by_scope_and_project_key(laptop: Store, devbox: Store) -> None:
    me = session(laptop, "claude-app", "/home/me/app")
    d_all = decide(laptop, me, "camera", "hold to look", "all", T0)
    d_app = decide(laptop, me, "db", "PostgreSQL", {"project": "/home/me/app"}, T0 + 1)
    decide(laptop, me, "secret", "x", {"sessions": [me.name]}, T0 + 2)  # stays here
    decide(laptop, me, "tmp", "y", {"project": "/home/me/scratch"}, T0 + 3)  # no origin: stays here
    keys = {"/home/me/app": KEY}
    assert sorted(replicate(laptop, devbox, "laptop", keys), key=str) == [Applied.NEW, Applied.NEW]
    assert laptop.queue_team_decisions(T0, keys.get) == 0  # queued once

    assert current(devbox, "camera") == d_all and current(devbox, "db") == d_app
    assert current(devbox, "secret") is None and current(devbox, "tmp") is None
    remote = queries.decision_by_id(devbox.conn, d_app)
    assert remote is not None and remote.scope == {"project": "git:" + KEY}
    assert remote.author.id == f"{me.id}@laptop" and remote.author.name == "claude-app"
    machine = devbox.conn.execute("SELECT machine FROM decisions WHERE id = ?", (d_app,)).fetchone()[0]
    assert machine == "laptop"

    same_key = queries.query_decisions(devbox.conn, lookup={"project": "/srv/app"}, project_key=KEY)
    assert {d.id for d in same_key} == {d_all, d_app}
    other_key = queries.query_decisions(devbox.conn, lookup={"project": "/srv/o"}, project_key="h/o/other")
    assert {d.id for d in other_key} == {d_all}
    no_key = queries.query_decisions(devbox.conn, lookup={"project": "/srv/app"})
    assert {d.id for d in no_key} == {d_all}
    # the SessionStart note of a folder with that key shows both; another folder only the global one
    shown, total = queries.note_decisions(devbox.conn, "/srv/app", limit=5, project_key=KEY)
    assert ({d.id for d in shown}, total) == ({d_all, d_app}, 2)
    shown, total = queries.note_decisions(devbox.conn, "/srv/app", limit=5)
    assert ({d.id for d in shown}, total) == ({d_all}, 1)

    # applied again (a redelivery): a no-op
    body = env.encode(dec(d_all, "camera", "hold to look", T0))
    assert devbox.apply_remote_decision("laptop", env.decode_decision(body), T0) is Applied.REPEAT


def test_every_machine_agrees_on_the_current_revision_whatever_the_arrival_order(tmp_path: Path) -> None:
    revisions = [dec("a1", "db", "MySQL", T0), dec("b2", "db", "SQLite", T0 + 5),
                 dec("c3", "db", "PostgreSQL", T0 + 5), dec("a0", "db", "Oracle", T0 + 2)]
    retraction = env.RetractionEnvelope("r1", "db", "c3", "changed our mind", CLI, T0 + 7)
    later = dec("z9", "db", "DuckDB", T0 + 9)
    orders = [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1], [1, 3, 0, 2]]
    for n, order in enumerate(orders):
        store = Store.open(tmp_path / f"m{n}.db")
        for i in order:
            assert store.apply_remote_decision("x", revisions[i], T0) is Applied.NEW
        assert current(store, "db") == "c3"  # the latest by (createdAt, id): c3 > b2 in the same ms
        assert store.apply_remote_decision("x", retraction, T0) is Applied.NEW
        assert current(store, "db") is None
        assert store.apply_remote_decision("x", later, T0) is Applied.NEW
        assert current(store, "db") == "z9"
        assert store.apply_remote_decision("x", dec("old", "db", "Old", T0 - 1), T0) is Applied.NEW
        assert current(store, "db") == "z9"  # a late old revision changes nothing
        store.close()


REVISION = st.tuples(st.integers(0, 4), st.sampled_from("abc"), st.booleans())  # (ms, id letter, retraction)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(revisions=st.lists(REVISION, min_size=1, max_size=8, unique_by=lambda r: r[:2]), data=st.data())
def test_any_two_arrival_orders_agree_on_the_current_revision(
    tmp_path: Path, revisions: list[tuple[int, str, bool]], data: st.DataObject
) -> None:
    """Revisions and retractions of one topic, each applied once on two machines in two orders
    (a retraction waiting until what it retracts is there): both end with one current revision,
    the same, and it is the latest by (createdAt, id) unless a retraction is later still."""
    first = [r for r in revisions if not r[2]] or [(0, "a", False)]
    records: list[env.DecisionEnvelope | env.RetractionEnvelope] = []
    for at, letter, is_retraction in revisions:
        rid = f"{letter}{at}"
        if is_retraction:
            target = data.draw(st.sampled_from(first))
            retracts = f"d{target[1]}{target[0]}"
            records.append(env.RetractionEnvelope("r" + rid, "db", retracts, None, CLI, T0 + at))
        else:
            records.append(dec("d" + rid, "db", rid, T0 + at))
    if not any(isinstance(r, env.DecisionEnvelope) for r in records):
        records.append(dec("da0", "db", "a0", T0))
    ends = []
    for n in range(2):
        order = data.draw(st.permutations(records))
        path = tmp_path / f"{n}-{len(list(tmp_path.iterdir()))}.db"
        store = Store.open(path)
        waiting = list(order)
        while waiting:
            results = [store.apply_remote_decision("x", r, T0) for r in waiting]
            assert Applied.NEW in results  # a retraction only waits for a decision still to come
            waiting = [r for r, got in zip(waiting, results, strict=True) if got is Applied.WAITING]
        ends.append(current(store, "db"))
        store.close()
    assert ends[0] == ends[1]
    latest = max(records, key=lambda r: (r.created_at, r.id))
    assert ends[0] == (None if isinstance(latest, env.RetractionEnvelope) else latest.id)


def test_a_retraction_before_its_decision_waits(devbox: Store) -> None:
    retraction = env.RetractionEnvelope("r1", "db", "d1", None, env.Author("cli", "cli", "cli"), T0 + 7)
    assert devbox.apply_remote_decision("laptop", retraction, T0) is Applied.WAITING
    assert devbox.conn.execute("SELECT count(*) FROM decision_retractions").fetchone()[0] == 0
    assert devbox.apply_remote_decision("laptop", dec("d1", "db", "MySQL", T0), T0) is Applied.NEW
    assert devbox.apply_remote_decision("laptop", retraction, T0) is Applied.NEW
    assert current(devbox, "db") is None


def test_a_local_revision_is_latest_even_behind_another_machines_clock(devbox: Store) -> None:
    me = session(devbox, "codex-app")
    devbox.apply_remote_decision("laptop", dec("future", "db", "MySQL", T0 + 60_000), T0)
    mine = decide(devbox, me, "db", "PostgreSQL", "all", T0)
    assert current(devbox, "db") == mine
    d = queries.decision_by_id(devbox.conn, mine)
    assert d is not None and d.created_at == T0 + 60_001 and d.supersedes == "future"
    again = decide(devbox, me, "db", "SQLite", "all", T0)  # the same millisecond here
    assert current(devbox, "db") == again
    retraction, _ = devbox.retract(topic="db", reason=None, author=me, author_agent="codex", connected=[],
                                   now=T0)
    assert current(devbox, "db") is None and retraction.created_at == T0 + 60_003


def test_retractions_reach_the_team(laptop: Store, devbox: Store) -> None:
    me = session(laptop, "claude-app", "/home/me/app")
    decide(laptop, me, "camera", "hold to look", "all", T0)
    replicate(laptop, devbox, "laptop", {})
    laptop.retract(topic="camera", reason="gone", author=me, author_agent="claude", connected=[], now=T0 + 5)
    assert replicate(laptop, devbox, "laptop", {}) == [Applied.NEW]
    assert current(devbox, "camera") is None and current(laptop, "camera") is None
    [r] = queries.retractions(devbox.conn, topic="camera")
    assert r.reason == "gone"


def build_v10(path: Path) -> None:
    """A version-10 database as the previous release left it, with a session, an unacknowledged
    message and two revisions of a decision."""
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA foreign_keys = ON")
    for step in STEPS[: STEPS.index(V_FED)]:
        with conn:
            conn.execute(step)
    conn.execute(
        "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, host_session_id) VALUES "
        "('p1','claude-app','claude','/w/app','interactive',1,1,'host-1'),"
        "('p2','codex-app','codex','/w/app','interactive',1,5,'host-2')"
    )
    conn.execute("INSERT INTO messages(id, from_peer, to_peer, body, hop, created_at) "
                 "VALUES ('m1','p1','p2','hello from v10',1,10)")
    conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES ('m1','p2')")
    for did, text, at, sup in (("d1", "MySQL", 100, None), ("d2", "PostgreSQL", 100, "d1")):
        conn.execute(
            "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, scope_project, author_id, "
            "author_name, author_agent, created_at, source_message_id, supersedes) "
            "VALUES (?,'db',?,?,'\"all\"','all',NULL,'p1','claude-app','claude',?,NULL,?)",
            (did, text, text.lower(), at, sup),
        )
    conn.close()


def test_version_10_upgrades_to_11_keeping_everything(tmp_path: Path) -> None:
    db = tmp_path / "bridge.db"
    build_v10(db)
    lines: list[str] = []
    store = Store.open(db, lines.append)
    assert store.version() == CURRENT_VERSION
    assert any("backed up" in line for line in lines)
    assert [p.name for p in store.list_peers()] == ["codex-app", "claude-app"]
    assert [m.text for m in store.unacked("p2")] == ["hello from v10"]
    # d2 was recorded after d1 in the same millisecond: it stays current (the head was kept)
    assert current(store, "db") == "d2"
    assert store.conn.execute("SELECT count(*) FROM peers WHERE machine IS NOT NULL").fetchone()[0] == 0
    assert store.outbox_rows() == [] and fq.remote_sessions(store.conn, T0) == []
    d3 = decide(store, store.list_peers()[1].view(), "db", "SQLite", "all", 100)
    assert current(store, "db") == d3
    store.close()


def test_a_decision_is_counted_by_the_team_and_owed_to_every_machine_heard_later(tmp_path: Path) -> None:
    """A decision's outbox row never ends in the store at its PubAck: the store counts the team
    (machines heard by their presence; core.federation.Outbox.counted decides). Recorded with no
    machine heard, it stays, parked; a machine heard for the first time is owed it (bound from
    then), and also a decision whose row ended before it was heard; receipts outlive the row, so
    a machine heard again after it was forgotten is owed only what it has not confirmed."""
    laptop, devbox, ci, web = (Store.open(tmp_path / f"{n}.db") for n in ("laptop", "devbox", "ci", "web"))
    me = session(laptop, "claude-app")
    alone = decide(laptop, me, "early", "nobody to confirm", "all", T0)
    decide(laptop, me, "mine", "stays here", {"sessions": [me.id]}, T0)  # never shared, never owed
    laptop.queue_team_decisions(T0, {}.get)
    assert laptop.mark_relayed(fed.DEC, alone, T0) == fed.TeamCount(heard=0, awaited=0)
    [row] = laptop.outbox_rows()
    assert (row.id, row.parked, row.queued_at) == (alone, True, T0)
    assert fq.outbox_stats(laptop.conn)[3:] == (1, 1)  # one decision owed, to a first machine

    # devbox heard first: owed it, its bound from now; ci next: owed it too, the bound kept
    later = T0 + fed.UNCONFIRMED_AFTER * 2
    announce(laptop, "devbox", [session(devbox, "codex-app")], later)
    assert laptop.outbox_rows() == [fed.OutboxRow(alone, fed.DEC, later, T0, None, parked=False)]
    assert fq.outbox_stats(laptop.conn)[3:] == (1, 0)
    presence = env.PresenceEnvelope(later, (env.PresenceSession("x", "codex-ci", "codex", "/w", None,
                                                                "interactive", "idle"),))
    assert [(r.id, n) for r, n in laptop.record_presence("ci", presence, later + 1)] == [
        (alone, fed.TeamCount(heard=2, awaited=2))]
    assert laptop.record_presence("ci", presence, later + 2) == []  # heard before: owed nothing new
    assert laptop.outbox_rows()[0].queued_at == later

    d = decide(laptop, me, "db", "PostgreSQL", "all", T0 + 1)
    laptop.queue_team_decisions(later + 3, {}.get)
    body = outbox(laptop, fed.DEC)[d][1]
    assert laptop.mark_relayed(fed.DEC, d, later + 4) == fed.TeamCount(heard=2, awaited=2)
    counts = []
    for store, name in ((devbox, "devbox"), (ci, "ci")):
        for _ in range(2):  # a redelivery queues the receipt again (same row id: the same Nats-Msg-Id)
            store.apply_remote_decision("laptop", env.decode_decision(body), later + 5)
            [(to, receipt_body)] = outbox(store, fed.RCPT).values()
            assert to == "laptop" and f"{d}/{fed.DEC}" in outbox(store, fed.RCPT)
            store.drop(fed.RCPT, f"{d}/{fed.DEC}")
        receipt = env.decode_receipt(receipt_body)
        assert (receipt.kind, receipt.message_id, receipt.state) == (fed.DEC, d, fed.STORED)
        counts.append(laptop.apply_decision_receipt(name, receipt, later + 6))
        assert laptop.apply_decision_receipt(name, receipt, later + 6) == counts[-1]  # counted once
    assert counts == [fed.TeamCount(2, 1), fed.TeamCount(2, 0)]  # the last one: Outbox.counted ends it
    assert d in outbox(laptop, fed.DEC)  # the store ends nothing itself
    laptop.drop(fed.DEC, d)  # what the machine's Drop does
    assert laptop.apply_decision_receipt("ci", receipt, later + 7) is None  # its row gone: no count
    foreign = env.ReceiptEnvelope("not-ours", fed.STORED, later, kind=fed.DEC)
    assert laptop.apply_decision_receipt("ci", foreign, later + 7) is None

    # web, heard later, is owed both: the one still owed to others, and d, whose row had ended
    owed = dict((r.id, (r, n)) for r, n in laptop.record_presence("web", presence, later + 8))
    assert sorted(owed) == sorted([alone, d])
    assert owed[d][0].queued_at == later + 8 and owed[d][1] == fed.TeamCount(3, 1)  # queued again for it
    assert outbox(laptop, fed.DEC)[d][1] == body  # the same envelope, published with the same id
    web.close()

    # ci forgotten, then heard again: owed only `alone` (it confirmed d, receipts outlive rows)
    with laptop.conn:
        laptop.conn.execute("DELETE FROM machines WHERE name = 'ci'")
    assert [r.id for r, _ in laptop.record_presence("ci", presence, later + 9)] == [alone]
    assert laptop.conn.execute("SELECT count(*) FROM team_receipts").fetchone()[0] == 2


def test_version_11_upgrades_to_12_with_its_outbox(tmp_path: Path) -> None:
    db = tmp_path / "bridge.db"
    conn = apsw.Connection(str(db))
    for step in STEPS[: STEPS.index(V_FED) + 1]:
        with conn:
            conn.execute(step)
    conn.execute("INSERT INTO outbox(kind, id, machine, body, queued_at) "
                 "VALUES ('dec', 'd1', NULL, x'7b7d', 5)")
    conn.close()
    store = Store.open(db)
    assert store.version() == CURRENT_VERSION  # 12, and the steps after it
    assert store.outbox_rows() == [fed.OutboxRow("d1", fed.DEC, 5)]
    assert store.conn.execute("SELECT count(*) FROM team_receipts").fetchone()[0] == 0
    store.close()


def test_what_the_team_stopped_announcing_is_forgotten(laptop: Store, devbox: Store) -> None:
    """A remote session not announced for FORGET_AFTER_MS (its machine silent that long) is
    forgotten: not listed, not addressable, its queued message and outbox row dropped, the
    machine no longer listed nor awaited; announced again, it is listed again."""
    mid, codex = send_to_devbox(laptop, devbox)
    assert list(outbox(laptop, fed.MSG)) == [mid]
    bound = fed.FORGET_AFTER_MS
    assert laptop.forget_remote(T0 + bound - 1, bound) == []  # not yet: nothing changes
    assert [s.address for s in fq.remote_sessions(laptop.conn, T0 + bound)] == ["codex-app@devbox"]

    assert laptop.forget_remote(T0 + bound + 1, bound) == ["codex-app@devbox", "machine devbox"]
    assert fq.remote_sessions(laptop.conn, T0 + bound + 1) == []
    assert laptop.remote_session("codex-app", "devbox", T0 + bound + 1) is None  # `send` says no such session
    assert laptop.outbox_rows() == [] and fq.machines(laptop.conn) == []
    assert laptop.conn.execute("SELECT count(*) FROM messages WHERE id = ?", (mid,)).fetchone()[0] == 0
    assert laptop.forget_remote(T0 + bound + 2, bound) == []  # once

    codex_view = devbox.get_peer(codex)
    assert codex_view is not None
    announce(laptop, "devbox", [codex_view.view()], T0 + bound + 3)
    assert [s.address for s in fq.remote_sessions(laptop.conn, T0 + bound + 3)] == ["codex-app@devbox"]


def test_forgetting_a_remote_session_drops_its_waiting_messages(laptop: Store, devbox: Store) -> None:
    """`agent-bridge forget name@machine` (a gone one): its queued message and outbox row go."""
    mid, codex = send_to_devbox(laptop, devbox)
    [gone] = laptop.forget_peers([f"{codex}@devbox"], T0 + 5)
    assert [m.id for m in gone.dropped] == [mid]
    assert laptop.outbox_rows() == [] and fq.remote_sessions(laptop.conn, T0 + 5) == []


def test_a_message_from_another_machine_is_handed_to_its_recipients_open_tap(
    laptop: Store, devbox: Store
) -> None:
    """The recipient's delivery task, its tap open (its last read reached the end), takes the
    message from the tap as it takes a local send: what the database gives, without reading it."""
    from agent_bridge.store.tap import DeliveryTap

    mid, codex = send_to_devbox(laptop, devbox)
    [(_, body)] = outbox(laptop, fed.MSG).values()
    tap = DeliveryTap()
    assert devbox.queued(codex, tap=tap) == []  # the read reached the end: the tap collects from now
    assert devbox.apply_remote_message("laptop", env.decode_message(body), T0 + 2) is Applied.NEW
    taken = tap.take(codex)
    assert taken == devbox.queued(codex) and [q.message.id for q in taken] == [mid]
    assert taken[0].message.sender.name == "claude-app@laptop"
    assert devbox.apply_remote_message("laptop", env.decode_message(body), T0 + 3) is Applied.REPEAT
    assert tap.take(codex) == []  # a redelivery hands nothing twice

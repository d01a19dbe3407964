"""The owner's search at the store level (SPEC §4.6 "Search", §7), on real SQLite files: the upgrade to
schema V_SEARCH from every earlier version builds the index from the rows already there; the
writer's transactions keep it in step (a send, a decision, a question, a forget); words are matched
as words, never as FTS5 syntax; results come newest first with who, what and when."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from agent_bridge.common import domain
from agent_bridge.common.domain import SessionView
from agent_bridge.store import reader, search
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.peers import CLI_AUTHOR
from agent_bridge.store.schema import CURRENT_VERSION, STEPS, V_SEARCH
from agent_bridge.store.writer import Store

SEARCH_VERSION = STEPS.index(V_SEARCH) + 1


def find(db: Path, query: str) -> list[search.Hit]:
    """Through the read-only path the CLI and the dashboard use."""
    with reader.reading(db) as conn:
        assert conn is not None
        hits, _ = search.search(conn, domain.search_words(query))
    return hits


def summary(hits: list[search.Hit]) -> list[tuple[str, str]]:
    return [(h.kind, h.id) for h in hits]


@pytest.fixture
def store(tmp_path: Path):
    s = Store.open(tmp_path / "bridge.db")
    yield s
    s.close()


def two_sessions(store: Store) -> tuple[SessionView, SessionView]:
    views = []
    for agent, host in (("claude", "h-a"), ("codex", "h-b")):
        p = store.create_peer(agent=agent, name=f"{agent}-app", project="/w/app", kind="interactive",
                              host_session_id=host, now=1)
        views.append(SessionView(p.id, p.name, "/w/app", host, "interactive"))
    return views[0], views[1]


def send(store: Store, a: SessionView, b: SessionView, text: str, now: int) -> str:
    [m] = store.send_messages(a.id, [Outgoing(b.id, text, 1, None)], now)
    return m.id


# --- the upgrade ---------------------------------------------------------------------------------


def build(db: Path, version: int) -> None:
    """A database at `version` (the pinned steps), holding what that version could hold: sessions
    and a message from 1, a decision and its notice from 3, a question from 6."""
    conn = apsw.Connection(str(db))
    for step in STEPS[:version]:
        conn.execute(step)
    if version >= 1:
        conn.execute("INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at) VALUES "
                     "('p1','claude-w','claude','/w','interactive',1,1),"
                     "('p2','codex-w','codex','/w','interactive',1,1)")
        conn.execute("INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) VALUES "
                     "('m1','p2','p1','the migration runbook is ready',1,NULL,10)")
    if version >= 2:
        conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES ('m1','p1')")
    if version >= 3:
        conn.execute(
            "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, scope_project, author_id, "
            "author_name, author_agent, created_at) VALUES ('d1','database','PostgreSQL with a runbook',"
            "'postgresql with a runbook','\"all\"','all',NULL,'p1','claude-w','claude',20)")
        conn.execute("INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) VALUES "
                     "('n1','p1','p2','Pinned owner decision: database: PostgreSQL with a runbook',"
                     "100,NULL,20)")
        conn.execute("INSERT INTO decision_deliveries(decision_id, host_key, peer_id, message_id, "
                     "created_at) "
                     "VALUES ('d1','peer:p2','p2','n1',20)")
    if version >= 6:
        conn.execute("INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at) VALUES "
                     "('cli','cli','cli','','interactive',1,1)")
        conn.execute("INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) VALUES "
                     "('q1','p2','cli','Which runbook format?',1,NULL,30)")
        conn.execute("INSERT INTO questions(id, question, topic, options, scope, created_at) VALUES "
                     "('q1','Which runbook format?','runbooks','[]','\"all\"',30)")
        conn.execute("INSERT INTO question_askers(question_id, peer_id, name, agent, asked_at) VALUES "
                     "('q1','p2','codex-w','codex',30)")
    conn.close()


@pytest.mark.parametrize("old", range(SEARCH_VERSION))
def test_the_upgrade_to_search_indexes_every_row_already_there(tmp_path: Path, old: int) -> None:
    db = tmp_path / "bridge.db"
    build(db, old)
    store = Store.open(db)
    try:
        assert store.version() == CURRENT_VERSION
        expected = []
        if old >= 6:
            expected.append(("question", "q1"))
        if old >= 3:
            expected.append(("decision", "d1"))  # its notice n1 is not a result of its own
        if old >= 1:
            expected.append(("message", "m1"))
        assert summary(find(db, "runbook")) == expected
        # ... and the writer keeps it in step from then on.
        a, b = two_sessions(store)
        new = send(store, a, b, "a second runbook draft", 40)
        assert summary(find(db, "runbook"))[0] == ("message", new)
        assert store.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    finally:
        store.close()


def test_a_reader_of_a_database_from_before_the_index_says_how_to_build_it(tmp_path: Path) -> None:
    db = tmp_path / "bridge.db"
    build(db, SEARCH_VERSION - 1)
    with reader.reading(db) as conn, pytest.raises(search.SearchUnavailable) as refused:
        assert conn is not None
        search.search(conn, ["runbook"])
    assert "agent-bridge up" in str(refused.value) and "\n" not in str(refused.value)


# --- kept in step by the writer --------------------------------------------------------------------


def test_messages_decisions_and_questions_are_found_newest_first_with_who_and_when(
    store: Store, tmp_path: Path
) -> None:
    a, b = two_sessions(store)
    m1 = send(store, a, b, "Please review the parser change before lunch", 100)
    m2 = send(store, b, a, "Reviewed: the parser looks fine", 200)
    decision, told = store.record_decision(
        author=CLI_AUTHOR, author_agent="cli", topic="parser", text="Keep the hand-written parser",
        scope="all", source_message_id=None, recipients=[Recipient(a, "h-a"), Recipient(b, "h-b")], now=300)
    assert told == ["claude-app", "codex-app"]  # two notices that carry the decision's text
    q, _ = store.ask_question(asker=b, asker_agent="codex", question="Should the PARSER be streaming?",
                              topic=None, options=[], scope="all", caller_addresses=b.addresses, now=400)
    assert q is not None
    hits = find(tmp_path / "bridge.db", "parser")
    assert summary(hits) == [("question", q.id), ("decision", decision.id), ("message", m2), ("message", m1)]
    question, dec, reply, first = hits
    assert question.to_json() == {
        "kind": "question", "id": q.id, "from": {"id": b.id, "name": "codex-app", "agent": "codex"},
        "to": {"id": "cli", "name": "cli"}, "topic": None, "state": "open", "createdAt": 400,
        "snippet": "Should the PARSER be streaming?", "highlights": [[11, 17]],
    }
    assert (dec.topic, dec.state, dec.sender.name, dec.to, dec.snippet) == (
        "parser", "current", "cli", None, "Keep the hand-written parser")
    assert first.to_json()["from"] == {"id": a.id, "name": "claude-app", "agent": "claude"}
    assert first.to_json()["to"] == {"id": b.id, "name": "codex-app"}
    assert (first.created_at, first.snippet[slice(*first.highlights[0])]) == (100, "parser")
    assert reply.to_json()["to"] == {"id": a.id, "name": "claude-app"}


def test_every_word_must_match_and_each_is_a_prefix_with_case_and_accents_folded(
    store: Store, tmp_path: Path
) -> None:
    a, b = two_sessions(store)
    both = send(store, a, b, "The Café database migration", 1)
    send(store, a, b, "database only", 2)
    db = tmp_path / "bridge.db"
    assert summary(find(db, "cafe DATAB")) == [("message", both)]
    assert summary(find(db, "migrat")) == [("message", both)]
    assert find(db, "cafe nothing-like-this") == []
    # Under three characters a word matches whole words only (a one-letter prefix would merge the
    # lists of every word starting with it).
    assert find(db, "ca") == [] and find(db, "da") == []
    short = send(store, a, b, "the db is up", 3)
    assert summary(find(db, "DB")) == [("message", short)]


@pytest.mark.parametrize(
    "query",
    ['"', 'a"b', "NEAR(a b)", "body: x", "a OR", "AND", "*", "^x", "x NOT", "(x", "-x", "{body}: x", "x + y"],
)
def test_search_syntax_in_the_words_is_text_never_an_error(store: Store, tmp_path: Path, query: str) -> None:
    a, b = two_sessions(store)
    hit = send(store, a, b, f"literally {query} here", 1)
    words = domain.search_words(query + " literally")
    with reader.reading(tmp_path / "bridge.db") as conn:
        assert conn is not None
        hits, more = search.search(conn, words)
    assert summary(hits) == [("message", hit)] and more is False


@pytest.mark.parametrize(
    ("query", "error"),
    [("", "at least one word"), ("   ", "at least one word"), ("!!! ...", "at least one word"),
     ("x" * 513, "at most 512"), ("\ud800", "not valid text"), (7, "expected a string")],
)
def test_a_query_with_nothing_to_search_for_is_one_clear_error(query: object, error: str) -> None:
    with pytest.raises(domain.InputError) as refused:
        domain.search_words(query)
    assert error in str(refused.value) and "\n" not in str(refused.value)


def test_retracted_and_superseded_revisions_are_found_and_marked(store: Store, tmp_path: Path) -> None:
    first, _ = store.record_decision(author=CLI_AUTHOR, author_agent="cli", topic="queue", text="Use redis",
                                     scope="all", source_message_id=None, recipients=[], now=1)
    second, _ = store.record_decision(author=CLI_AUTHOR, author_agent="cli", topic="queue",
                                      text="Use redis streams", scope="all", source_message_id=None,
                                      recipients=[], now=2)
    db = tmp_path / "bridge.db"
    assert [(h.id, h.state) for h in find(db, "redis")] == [(second.id, "current"), (first.id, "superseded")]
    store.retract(topic="queue", reason="not yet", author=CLI_AUTHOR, author_agent="cli", connected=[], now=3)
    assert [(h.id, h.state) for h in find(db, "redis")] == [
        (second.id, "retracted"), (first.id, "superseded")]
    assert summary(find(db, "queue")) == summary(find(db, "redis"))  # the topic is searched too


def test_answered_and_declined_questions_show_their_state(store: Store, tmp_path: Path) -> None:
    a, _ = two_sessions(store)
    asked = []
    for i, topic in enumerate(("cache", "logging")):
        q, _ = store.ask_question(asker=a, asker_agent="claude", question=f"Which {topic} library?",
                                  topic=topic, options=[], scope="all", caller_addresses=a.addresses,
                                  now=10 + i)
        assert q is not None
        asked.append(q.id)
    store.answer_question(question_id=asked[0], author=CLI_AUTHOR, topic="cache",
                          text="Only the standard one",
                          scope="all", recipients=[], now=20)
    store.decline_question(question_id=asked[1], reason="not now", now=21)
    db = tmp_path / "bridge.db"
    assert [(h.id, h.state) for h in find(db, "library")] == [
        (asked[1], "declined"), (asked[0], "answered")]
    # The answer is a decision (found as one); the messages that told the asker are not results.
    assert [h.kind for h in find(db, "standard one")] == ["decision"]


def test_what_forgetting_a_session_deleted_is_no_longer_found(store: Store, tmp_path: Path) -> None:
    a, b = two_sessions(store)
    kept = send(store, b, a, "zanzibar from the session that stays", 1)
    gone = send(store, a, b, "zanzibar queued for the session that goes", 2)
    db = tmp_path / "bridge.db"
    assert summary(find(db, "zanzibar")) == [("message", gone), ("message", kept)]
    store.forget_peers([b.id], now=3)
    assert not store.conn.execute("SELECT 1 FROM messages WHERE id = ?", (gone,)).fetchall()
    assert summary(find(db, "zanzibar")) == [("message", kept)]
    store.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")


def test_a_rolled_back_send_leaves_nothing_in_the_index(store: Store, tmp_path: Path) -> None:
    a, b = two_sessions(store)

    def crash(point: str) -> None:
        if point == "send:before-commit":
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        store.send_messages(a.id, [Outgoing(b.id, "quetzal never stored", 1, None)], 1, fault=crash)
    assert find(tmp_path / "bridge.db", "quetzal") == []
    store.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")


def test_the_newest_fifty_are_returned_and_more_is_said(store: Store, tmp_path: Path) -> None:
    a, b = two_sessions(store)
    ids = [send(store, a, b, f"note number {i}", i) for i in range(search.LIMIT + 5)]
    with reader.reading(tmp_path / "bridge.db") as conn:
        assert conn is not None
        hits, more = search.search(conn, ["note"])
    assert [h.id for h in hits] == ids[::-1][: search.LIMIT] and more is True


def test_a_long_text_gives_a_snippet_around_the_match(store: Store, tmp_path: Path) -> None:
    a, b = two_sessions(store)
    words = [f"w{i}" for i in range(200)]
    words[150] = "needle"
    send(store, a, b, " ".join(words), 1)
    [hit] = find(tmp_path / "bridge.db", "needle")
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…") and len(hit.snippet.split()) <= 24
    assert [hit.snippet[s:e] for s, e in hit.highlights] == ["needle"]


# --- indexed after the commit (V_INDEX_LATER) -------------------------------------------------------


def test_a_search_finds_the_same_before_and_after_the_index_reaches_the_messages(
    store: Store, tmp_path: Path
) -> None:
    """A send commits no index entry; until Store.index_messages reaches its message, a search
    looks through it as well, with the same words, order, snippets and exclusions."""
    db = tmp_path / "bridge.db"
    a, b = two_sessions(store)
    old = send(store, b, a, "pelican draft, the first", 1)
    assert store.index_messages(100) == 1  # indexed: the rest comes after it
    new = send(store, b, a, "Pélican draft, the second", 2)
    decision, told = store.record_decision(
        author=CLI_AUTHOR, author_agent="cli", topic="birds", text="Pelican drafts go to the wiki",
        scope="all", source_message_id=None, recipients=[Recipient(a, "h-a"), Recipient(b, "h-b")], now=3)
    assert told == ["claude-app", "codex-app"]  # two notices with the decision's text: never results
    gone = send(store, a, b, "pelican for the session that goes", 4)
    expected = [("message", gone), ("decision", decision.id), ("message", new), ("message", old)]
    before = find(db, "pelican")
    assert summary(before) == expected
    store.forget_peers([b.id], now=5)  # its messages go, indexed or not
    expected = [("decision", decision.id), ("message", new), ("message", old)]
    before = find(db, "pelic")
    assert summary(before) == expected
    assert store.index_messages(1) == 1 and store.index_messages(100) == 0  # `new` only: no notice
    after = find(db, "pelic")
    assert [h.to_json() for h in after] == [h.to_json() for h in before]
    assert after[1].snippet[slice(*after[1].highlights[0])] == "Pélican"  # from the index now
    store.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")

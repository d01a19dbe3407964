"""search: the owner's search over 100,000 messages (SPEC §4.6 "Search", §9).

The database is built with the broker's own schema and writer (Store.open, then the rows in bulk
through the same INSERTs, indexed as the broker's transactions and its indexer index them; since
messages are indexed after their commit (schema V_INDEX_LATER), the newest UNINDEXED_TAIL are left
for the searches to look through, as a broker under a stream of sends leaves them between passes):
100,000 messages between 50 sessions, 2,000 decision revisions each sent to 5 sessions as notices
(10,000 more messages, which search leaves out), and 500 questions with the messages that carry
them. Texts are 8 to 40 words drawn from a vocabulary of about 120, so a common word matches
thousands of rows.

Measured through the read path `agent-bridge search` and the dashboard take (`reader.reading` +
`domain.search_words` + `search.search`: open a read-only connection, one read transaction, the
three indexes, snippets, newest first, the 50 newest), cycling through queries of every shape:
one common word, a word's first letters (a prefix), two words, three words, a rare word (a
session's number), a word nothing holds. Baseline, interleaved: the same words as one bare FTS5
match on the messages index on an open APSW connection, 51 rowids, nothing joined or rendered.
Target: p99 ≤ 25 ms.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402
from bench_decisions_query import WORDS  # noqa: E402

TARGET_MS = 25.0
SESSIONS = 50
NOTICES_PER_DECISION = 5
T0 = 1_790_000_000_000


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(8, 40))).capitalize() + "."


# Messages not indexed yet when the searches run: about what a broker's indexer leaves between two
# passes (broker/feeds/indexer.py GAP, 0.2 s) under 5,000 sends a second.
UNINDEXED_TAIL = 1_000


def build(db: Path, messages: int, decisions: int, questions: int, seed: int = 34) -> None:
    """Write the rows (through the triggers, in one transaction)."""
    from agent_bridge.common import domain
    from agent_bridge.store.ids import new_id
    from agent_bridge.store.writer import Store

    rng = random.Random(seed)
    store = Store.open(db)
    try:
        conn = store.conn
        with conn:
            peers = [new_id() for _ in range(SESSIONS)]
            conn.executemany(
                "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, "
                "host_session_id) "
                "VALUES (?, ?, 'claude', ?, 'interactive', 1, 1, ?)",
                [(p, f"claude-session{i:02d}", f"/src/project-{i % 10}", f"host-{i}")
                 for i, p in enumerate(peers)],
            )
            conn.execute("INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at) "
                         "VALUES ('cli', 'cli', 'cli', '', 'interactive', 1, 1)")
            clock = iter(range(T0, T0 + 10 * (messages + decisions + questions) + 10, 7))
            rows = []
            for i in range(messages):
                a, b = rng.sample(range(SESSIONS), 2)
                text = sentence(rng) + (f" See session{a:02d}." if i % 50 == 0 else "")
                rows.append((new_id(), peers[a], peers[b], text, 1, next(clock)))
            conn.executemany("INSERT INTO messages(id, from_peer, to_peer, body, hop, created_at) "
                             "VALUES (?,?,?,?,?,?)", rows)
            conn.executemany("INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)",
                             [(r[0], r[2]) for r in rows])
            for n in range(decisions):
                decision_id, text, now = new_id(), sentence(rng), next(clock)
                topic = f"topic-{n % 400:03d} {WORDS[n % len(WORDS)]}"
                conn.execute(
                    "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, author_id, "
                    "author_name, "
                    "author_agent, created_at) VALUES (?, ?, ?, ?, '\"all\"', 'all', 'cli', 'cli', 'cli', ?)",
                    (decision_id, topic, text, domain.search_key(text), now),
                )
                for p in rng.sample(peers, NOTICES_PER_DECISION):
                    notice = new_id()
                    conn.execute("INSERT INTO messages(id, from_peer, to_peer, body, hop, created_at) "
                                 "VALUES (?, 'cli', ?, ?, 100, ?)",
                                 (notice, p, f"Pinned owner decision: {text}", now))
                    conn.execute("INSERT INTO decision_deliveries(decision_id, host_key, peer_id, "
                                 "message_id, created_at) VALUES (?, ?, ?, ?, ?)",
                                 (decision_id, f"peer:{p}", p, notice, now))
            for _ in range(questions):
                question_id, text, now = new_id(), sentence(rng)[:1000], next(clock)
                asker = rng.choice(peers)
                conn.execute("INSERT INTO messages(id, from_peer, to_peer, body, hop, created_at) "
                             "VALUES (?, ?, 'cli', ?, 1, ?)", (question_id, asker, text, now))
                conn.execute("INSERT INTO questions(id, question, topic, options, scope, created_at) "
                             "VALUES (?, ?, NULL, '[]', '\"all\"', ?)", (question_id, text, now))
                conn.execute("INSERT INTO question_askers(question_id, peer_id, name, agent, asked_at) "
                             "VALUES (?, ?, 'asker', 'claude', ?)", (question_id, asker, now))
        index = getattr(store, "index_messages", None)  # None: a tree that indexed in the transaction
        if index is not None:
            from agent_bridge.store.search import UNINDEXED

            (waiting,) = conn.execute(f"SELECT count(*) FROM ({UNINDEXED})").fetchone()
            index(max(0, waiting - UNINDEXED_TAIL))
        conn.execute("ANALYZE")
    finally:
        store.close()


def queries(rng: random.Random, n: int) -> list[str]:
    """Every shape in turn: common word, prefix, two words, three words, rare word, no match."""
    shapes = [
        lambda: rng.choice(WORDS),
        lambda: rng.choice(WORDS)[:3],
        lambda: f"{rng.choice(WORDS)} {rng.choice(WORDS)}",
        lambda: f"{rng.choice(WORDS)} {rng.choice(WORDS)} {rng.choice(WORDS)}",
        lambda: f"session{rng.randrange(SESSIONS):02d}",
        lambda: "xylophone",
    ]
    return [shapes[i % len(shapes)]() for i in range(n)]


BARE = "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rowid DESC LIMIT 51"


def main() -> None:
    args = c.parse_args(__doc__ or "")
    messages, decisions, questions, loops = (2_000, 40, 20, 36) if args.quick else (100_000, 2_000, 500, 600)
    from agent_bridge.common import domain
    from agent_bridge.store import reader, search

    with c.temp_home() as home:
        home.mkdir(parents=True)
        db = home / "bridge.db"
        started = time.perf_counter()
        build(db, messages, decisions, questions)
        c.log(f"search: built {messages} messages, {decisions} decisions, {questions} questions "
              f"in {time.perf_counter() - started:.1f}s")
        size_mb = sum(f.stat().st_size for f in home.glob("bridge.db*")) / 1e6
        bare = reader.open_readonly(db)
        assert bare is not None
        timed: list[int] = []
        base: list[int] = []
        by_shape: dict[int, list[int]] = {}
        found = 0
        for i, query in enumerate(queries(random.Random(7), loops)):
            start = time.perf_counter_ns()
            with reader.reading(db) as conn:
                assert conn is not None
                hits, _ = search.search(conn, domain.search_words(query))
            took = time.perf_counter_ns() - start
            timed.append(took)
            by_shape.setdefault(i % 6, []).append(took)
            found += len(hits)
            start = time.perf_counter_ns()
            bare.execute(BARE, (search.match_expression(query.split()),)).fetchall()
            base.append(time.perf_counter_ns() - start)
        bare.close()
    p99 = c.ms(c.percentile(timed, 99))
    names = ["word", "prefix", "two_words", "three_words", "rare_word", "no_match"]
    c.report(
        "search",
        value=p99,
        unit="ms (p99 of a search: messages, decisions and questions, the 50 newest)",
        baseline=c.ms(c.percentile(base, 99)),
        target=f"p99 <= {TARGET_MS:g} ms over 100,000 messages",
        ok=p99 <= TARGET_MS,
        n=len(timed),
        p50=c.ms(c.percentile(timed, 50)),
        p99=p99,
        quick=args.quick,
        details={
            "messages": messages,
            "notices": decisions * NOTICES_PER_DECISION,
            "decisions": decisions,
            "questions": questions,
            "avg_results": found / loops,
            **{f"{names[k]}_p99_ms": c.ms(c.percentile(v, 99)) for k, v in sorted(by_shape.items())},
            "db_mb": round(size_mb, 1),
        },
    )


if __name__ == "__main__":
    main()

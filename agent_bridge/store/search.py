"""The owner's search (SPEC §4.6 "Search"): messages, decisions and questions found by words, newest
first, through the FTS5 indexes of schema V_SEARCH. A plain function of a read-only connection,
like store.queries: the CLI and the dashboard call it with the broker up or down.

What is searched: every decision revision (current, superseded or retracted, each marked so), every
question, and the messages sessions and the owner wrote. The messages the bridge made from those (a
decision's or a retraction's notices, the message that carries a question, the answers it sent to
askers) are left out: their text is the decision's or the question's, found as that. What forgetting
a session deleted is gone from the index with it. The schema's triggers keep both rules (V_SEARCH).
Messages are indexed a moment after their commit, in batches (V_INDEX_LATER); a search looks
through the ones the index has not reached yet too (UNINDEXED), so it finds every committed one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import apsw

from agent_bridge.common.rows import Author
from agent_bridge.store.migration import SchemaError, user_version
from agent_bridge.store.queries import has_table
from agent_bridge.store.schema import CURRENT_VERSION, STEPS, V_INDEX_LATER, V_SEARCH

LIMIT = 50  # results, newest first: a search box's page; more words narrow it
PREFIX_MIN = 3  # a shorter word matches whole words only: "p"* would merge the lists of every p-word
SNIPPET_TOKENS = 24  # words of context around the first match (FTS5 allows at most 64)
OPEN, CLOSE = "\ue000", "\ue001"  # private-use marks around a match in FTS5's snippet, parsed out below
SEARCH_VERSION = STEPS.index(V_SEARCH) + 1
INDEX_LATER_VERSION = STEPS.index(V_INDEX_LATER) + 1


class SearchUnavailable(SchemaError):
    """bridge.db is older than its search index: only the broker's upgrade (a write) builds it."""

    def __init__(self, found: int) -> None:
        super().__init__(
            f"bridge.db (schema version {found}) has no search index yet; it is built when a broker "
            f"upgrades it to version {CURRENT_VERSION}: run `agent-bridge up --detach` once"
        )


class Hit(NamedTuple):
    """One result. `to`: the recipient (a message), the owner (a question), None (a decision).
    `state`: a decision's current/superseded/retracted, a question's open/answered/declined/
    withdrawn, None for a message. `snippet`: the text around the first match; `highlights`:
    [start, end) of each matched word in it, in characters (code points)."""

    kind: str
    id: str
    sender: Author
    to: Author | None
    topic: str | None
    state: str | None
    created_at: int
    snippet: str
    highlights: tuple[tuple[int, int], ...]
    order: int  # the row's recording order within its kind (rowid or seq): newest first on ties

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "from": self.sender.to_json(),
            "to": None if self.to is None else {"id": self.to.id, "name": self.to.name},
            "topic": self.topic,
            "state": self.state,
            "createdAt": self.created_at,
            "snippet": self.snippet,
            "highlights": [list(h) for h in self.highlights],
        }


def match_expression(words: Sequence[str]) -> str:
    """An FTS5 query in which every word is a quoted phrase, all of them required: no operator,
    column filter or syntax error can come from the owner's text. A word of PREFIX_MIN characters
    or more matches the start of a word ("datab" finds "database"); a shorter one, whole words."""
    return " ".join(
        '"' + word.replace('"', '""') + ('"*' if len(word) >= PREFIX_MIN else '"') for word in words
    )


def split_snippet(marked: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """FTS5's snippet with OPEN/CLOSE around each match → (plain text, [start, end) of each).
    (A text that itself holds those private-use characters loses them here.)"""
    first, *marked_parts = marked.split(OPEN)
    plain = [first.replace(CLOSE, "")]
    length = len(plain[0])
    spans: list[tuple[int, int]] = []
    for part in marked_parts:
        inner, _, rest = part.partition(CLOSE)
        rest = rest.replace(CLOSE, "")
        if inner:
            spans.append((length, length + len(inner)))
        plain += (inner, rest)
        length += len(inner) + len(rest)
    return "".join(plain), tuple(spans)


# Each query's last two columns are the row's time and its marked snippet (search() sorts on the first).
_MESSAGES = f"""
SELECT f.rowid, m.id, m.from_peer, fp.name, fp.agent, m.to_peer, tp.name, m.created_at,
       snippet(messages_fts, 0, '{OPEN}', '{CLOSE}', '…', {SNIPPET_TOKENS})
FROM messages_fts f
JOIN messages m ON m.rowid = f.rowid
LEFT JOIN peers fp ON fp.id = m.from_peer
LEFT JOIN peers tp ON tp.id = m.to_peer
WHERE messages_fts MATCH :match
ORDER BY f.rowid DESC LIMIT :limit
"""

_DECISIONS = f"""
SELECT f.rowid, d.id, d.author_id, d.author_name, d.author_agent, d.topic,
       CASE WHEN h.seq = d.seq THEN 'current'
            WHEN EXISTS (SELECT 1 FROM decision_retractions r WHERE r.retracts = d.id) THEN 'retracted'
            ELSE 'superseded' END,
       d.created_at,
       snippet(decisions_fts, 1, '{OPEN}', '{CLOSE}', '…', {SNIPPET_TOKENS})
FROM decisions_fts f
JOIN decisions d ON d.seq = f.rowid
LEFT JOIN decision_heads h ON h.topic = d.topic
WHERE decisions_fts MATCH :match
ORDER BY f.rowid DESC LIMIT :limit
"""

_QUESTIONS = f"""
SELECT f.rowid, q.id, a.peer_id, a.name, a.agent, q.topic, COALESCE(o.state, {{ended}}'open'), q.created_at,
       snippet(questions_fts, 0, '{OPEN}', '{CLOSE}', '…', {SNIPPET_TOKENS})
FROM questions_fts f
JOIN questions q ON q.seq = f.rowid
LEFT JOIN question_askers a ON a.seq = (SELECT min(seq) FROM question_askers WHERE question_id = q.id)
LEFT JOIN question_outcomes o ON o.question_id = q.id{{ends}}
WHERE questions_fts MATCH :match
ORDER BY f.rowid DESC LIMIT :limit
"""
_QUESTIONS_BEFORE_ASK = _QUESTIONS.format(ended="", ends="")
# From V_ASK on, a question every asker withdrew is `withdrawn`.
_QUESTIONS_ENDED = _QUESTIONS.format(
    ended="e.state, ", ends="\nLEFT JOIN question_ends e ON e.question_id = q.id"
)

# What the messages index has not reached yet (schema V_INDEX_LATER: messages are indexed after their
# commit, in batches, by Store.index_messages): the messages past its newest entry, minus the ones
# the bridge made from a decision, a retraction or a question (V_SEARCH's rules). Every message at or
# below that entry that is not such a notice is in the index: the batches index in rowid order, a new
# message's rowid is past every existing one, and only a notice's row or a deletion takes one out.
UNINDEXED = """
SELECT m.rowid, m.body FROM messages m
WHERE m.rowid > coalesce((SELECT rowid FROM messages_fts ORDER BY rowid DESC LIMIT 1), 0)
  AND NOT EXISTS (SELECT 1 FROM decision_deliveries dd WHERE dd.message_id = m.id)
  AND NOT EXISTS (SELECT 1 FROM retraction_notices rn WHERE rn.message_id = m.id)
  AND NOT EXISTS (SELECT 1 FROM question_notices qn WHERE qn.message_id = m.id)
  AND NOT EXISTS (SELECT 1 FROM questions q WHERE q.id = m.id)
ORDER BY m.rowid
"""
# The same rules over those, in a table of the reading connection's own (temp: a read-only
# connection may write there), with the tokenizer of messages_fts (schema V_SEARCH).
_TAIL = "messages_unindexed"
_TAIL_TABLE = (f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{_TAIL} "
               "USING fts5(body, tokenize='unicode61 remove_diacritics 2')")
_MESSAGES_TAIL = _MESSAGES.replace("messages_fts", _TAIL)

_OWNER = Author("cli", "cli", "cli")
# Within one millisecond: a decision that answers a question comes after (above) it.
_KIND_ORDER = {"message": 0, "question": 1, "decision": 2}


def search(conn: apsw.Connection, words: Sequence[str], *, limit: int = LIMIT) -> tuple[list[Hit], bool]:
    """The newest `limit` messages, decisions and questions holding every word (domain.search_words),
    newest first, and whether more matched. SearchUnavailable for a database from before V_SEARCH."""
    found = user_version(conn)
    if found < SEARCH_VERSION:
        raise SearchUnavailable(found)
    args = {"match": match_expression(words), "limit": limit + 1}
    # (createdAt, kind order, rowid, kind, the row): the snippets are split once chosen.
    rows: list[tuple[Any, ...]] = []
    questions = _QUESTIONS_ENDED if has_table(conn, "question_ends") else _QUESTIONS_BEFORE_ASK
    with conn:  # one snapshot: the index, and the messages it has not reached in it
        queries = [("message", _MESSAGES), ("decision", _DECISIONS), ("question", questions)]
        if found >= INDEX_LATER_VERSION and _fill_tail(conn):
            queries.append(("message", _MESSAGES_TAIL))
        for kind, sql in queries:
            rows += ((row[-2], _KIND_ORDER[kind], row[0], kind, row) for row in conn.execute(sql, args))
    rows.sort(key=lambda r: r[:3], reverse=True)
    return [_hit(kind, row) for *_, kind, row in rows[:limit]], len(rows) > limit


def _fill_tail(conn: apsw.Connection) -> bool:
    """The messages the index has not reached yet (UNINDEXED) into the connection's own temp
    index; whether there are any. (Inside the caller's read transaction.)"""
    tail = conn.execute(UNINDEXED).fetchall()
    if not tail:
        return False
    conn.execute(_TAIL_TABLE)
    conn.execute(f"DELETE FROM temp.{_TAIL}")
    conn.executemany(f"INSERT INTO temp.{_TAIL}(rowid, body) VALUES (?, ?)", tail)
    return True


def _hit(kind: str, row: tuple[Any, ...]) -> Hit:
    text, spans = split_snippet(row[-1])
    if kind == "message":
        rowid, mid, from_id, from_name, from_agent, to_id, to_name, created, _ = row
        sender, to = Author(from_id, from_name, from_agent), Author(to_id, to_name, None)
        return Hit(kind, mid, sender, to, None, None, created, text, spans, rowid)
    rowid, rid, aid, aname, aagent, topic, state, created, _ = row
    return Hit(kind, rid, Author(aid, aname, aagent), None if kind == "decision" else _OWNER, topic, state,
               created, text, spans, rowid)

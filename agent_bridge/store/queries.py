"""Read queries over bridge.db, shared by the writer (broker), the read-only readers
(dashboard, hooks, CLI) and the tests. One implementation of each lookup.

Light: apsw and the domain rules only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import apsw

from agent_bridge.common import domain
from agent_bridge.common.domain import Scope
from agent_bridge.common.rows import (
    Author,
    Decision,
    Message,
    Peer,
    Question,
    Queued,
    Receipt,
    Retraction,
    SentReceipt,
)

DECISION_COLUMNS = (
    "seq",
    "id",
    "topic",
    "text",
    "scope",
    "author_id",
    "author_name",
    "author_agent",
    "created_at",
    "source_message_id",
    "supersedes",
    "current",
)
_SELECT_DECISION = (
    "SELECT d.seq, d.id, d.topic, d.text, d.scope, d.author_id, d.author_name, d.author_agent, "
    "d.created_at, d.source_message_id, d.supersedes, h.seq = d.seq AS current "
)


def has_table(conn: apsw.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def expand_addresses(conn: apsw.Connection, addresses: Iterable[str]) -> set[str]:
    """Every address (id, name, host session id) of every session any of `addresses` names."""
    given = set(addresses)
    if not given or not has_table(conn, "peers"):
        return given
    found = set(given)
    marks = ",".join("?" * len(given))
    values = list(given)
    host_col = "host_session_id" if _has_host_column(conn) else "NULL"
    sql = (
        f"SELECT id, name, {host_col} FROM peers "
        f"WHERE id IN ({marks}) OR name IN ({marks})"
        + (f" OR host_session_id IN ({marks})" if host_col != "NULL" else "")
    )
    args = values * (3 if host_col != "NULL" else 2)
    for peer_id, name, host in conn.execute(sql, args):
        found.update(a for a in (peer_id, name, host) if a)
    return found


def _has_host_column(conn: apsw.Connection) -> bool:
    return any(row[1] == "host_session_id" for row in conn.execute("PRAGMA table_info(peers)"))


def query_decisions(
    conn: apsw.Connection,
    *,
    needle: str | None = None,
    lookup: Scope | None = None,
    caller_addresses: Iterable[str] = (),
    history: bool = False,
    topic: str | None = None,
    limit: int | None = None,
    project_key: str | None = None,
) -> list[Decision]:
    """Decisions, newest revision first (SPEC §4.2, §6).

    `needle` is an already-normalized query (domain.normalize_query); `lookup` a parsed scope or
    None for every scope; `caller_addresses` the calling session's addresses (a project lookup
    through MCP also includes decisions addressed to the caller). `project_key`: the project
    folder's key (projectkey.py), so a project lookup also finds other machines' decisions for
    that key (recorded for the folder `git:<key>`, SPEC §10).
    """
    if not has_table(conn, "decisions"):
        return []
    where: list[str] = []
    args: dict[str, Any] = {}
    if history:  # LEFT: a retracted topic has no head, and its revisions are all history
        sql = _SELECT_DECISION + "FROM decisions d LEFT JOIN decision_heads h ON h.topic = d.topic"
    else:
        sql = _SELECT_DECISION + "FROM decision_heads h JOIN decisions d ON d.seq = h.seq"
    if topic is not None:
        where.append("d.topic = :topic")
        args["topic"] = topic
    if needle:
        where.append("(instr(d.topic, :q) > 0 OR instr(d.text_key, :q) > 0)")
        args["q"] = needle
    addresses: set[str] = set(caller_addresses)
    if lookup is not None:
        kind = domain.scope_kind(lookup)
        if kind == "all":
            where.append("d.scope_kind = 'all'")
        elif kind == "project":
            assert isinstance(lookup, dict)
            args["project"] = lookup["project"]
            clause = "d.scope_kind = 'all' OR (d.scope_kind = 'project' AND d.scope_project = :project)"
            if project_key is not None:
                args["keyed"] = domain.KEYED_PROJECT + project_key
                clause += " OR (d.scope_kind = 'project' AND d.scope_project = :keyed)"
            if addresses:
                clause += " OR d.scope_kind = 'sessions'"
            where.append(f"({clause})")
        else:
            assert isinstance(lookup, dict)
            addresses = expand_addresses(conn, [*lookup["sessions"], *addresses])
            where.append("d.scope_kind IN ('all', 'sessions')")
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY d.seq DESC"
    out: list[Decision] = []
    for values in conn.execute(sql, args):
        scope = domain.scope_from_json(values[4])
        if lookup is not None and not domain.lookup_matches(scope, lookup, addresses=addresses):
            if not (project_key is not None and scope == {"project": domain.KEYED_PROJECT + project_key}):
                continue
        out.append(Decision.from_row(values, scope))
        if limit is not None and len(out) >= limit:
            break
    return out


def has_keyed_decisions(conn: apsw.Connection) -> bool:
    """Does bridge.db hold another machine's project decision (scope `git:<project key>`,
    SPEC §10)? Only then is a folder's project key worth reading (one index probe)."""
    if not has_table(conn, "decisions"):
        return False
    row = conn.execute(
        "SELECT 1 FROM decisions WHERE scope_project >= ?1 AND scope_project < ?2 LIMIT 1",
        (domain.KEYED_PROJECT, domain.KEYED_PROJECT[:-1] + chr(ord(domain.KEYED_PROJECT[-1]) + 1)),
    ).fetchone()
    return row is not None


def note_decisions(
    conn: apsw.Connection, project: str, *, caller_addresses: Iterable[str] = (), limit: int,
    project_key: str | None = None,
) -> tuple[list[Decision], int]:
    """(the `limit` newest current decisions a project lookup by `project` finds, how many it finds
    in all), for the SessionStart note (SPEC §4.5). Same matching as `query_decisions(conn,
    lookup={"project": project}, caller_addresses=...)`, without rendering every row: the hook
    runs at every session start, also over 10,000 decisions (SPEC §9). `project_key`: the
    folder's key (projectkey.py): other machines' decisions for it count too (SPEC §10).
    """
    if not has_table(conn, "decisions"):
        return [], 0
    lookup: Scope = {"project": project}
    addresses = set(caller_addresses)
    keyed = None if project_key is None else {"project": domain.KEYED_PROJECT + project_key}
    where = "d.scope_kind = 'all' OR (d.scope_kind = 'project' AND d.scope_project IN (:project, :keyed))"
    if addresses:
        where += " OR d.scope_kind = 'sessions'"
    args = {"project": project, "keyed": None if keyed is None else keyed["project"]}
    # decisions first (CROSS JOIN keeps it the outer loop): newest rows come in rowid order, no sort.
    sql = (
        _SELECT_DECISION + "FROM decisions d CROSS JOIN decision_heads h ON h.topic = d.topic "
        f"WHERE h.seq = d.seq AND ({where}) ORDER BY d.seq DESC"
    )
    shown: list[Decision] = []
    for values in conn.execute(sql, args):
        scope = domain.scope_from_json(values[4])
        if scope == keyed or domain.lookup_matches(scope, lookup, addresses=addresses):
            shown.append(Decision.from_row(values, scope))
            if len(shown) >= limit:
                break
    # One pass over the current revisions: count project and global ones, collect the
    # (usually few) session-addressed scopes, which are matched against the addresses here.
    counts = conn.execute(
        "SELECT count(*) FILTER (WHERE d.scope_kind = 'all' "
        "OR (d.scope_kind = 'project' AND d.scope_project IN (:project, :keyed))), "
        "json_group_array(d.scope) FILTER (WHERE d.scope_kind = 'sessions' AND :sessions) "
        "FROM decision_heads h JOIN decisions d ON d.seq = h.seq",
        {**args, "sessions": bool(addresses)},
    ).fetchone()
    assert counts is not None  # an aggregate always answers one row
    total, session_scopes = int(counts[0]), counts[1]
    for scope_json in json.loads(session_scopes or "[]"):
        if domain.lookup_matches(domain.scope_from_json(scope_json), lookup, addresses=addresses):
            total += 1
    return shown, int(total)


# The first column is the receipt's rowid: a session's delivery cursor. Receipts are written
# with their messages, so receipt order is message order, and the receipts_unacked index
# serves "this session's unacknowledged receipts after the cursor" as one range, in order.
MESSAGE_SELECT = """
SELECT r.rowid, m.id, m.from_peer, fp.name, fp.agent, r.peer_id, tp.name, m.body, m.hop, m.reply_to,
       m.created_at, dd.decision_id, r.acked_at, r.delivered_at
FROM receipts r
JOIN messages m ON m.id = r.message_id
LEFT JOIN peers fp ON fp.id = m.from_peer
LEFT JOIN peers tp ON tp.id = r.peer_id
LEFT JOIN decision_deliveries dd ON dd.message_id = m.id
"""


def message_from_row(conn: apsw.Connection, values: tuple[Any, ...], *, repeat: bool = False) -> Message:
    """The message of a MESSAGE_SELECT row (the receipt's rowid, acknowledgement and offer,
    the row's first, thirteenth and fourteenth values, are the caller's to read)."""
    (_, mid, from_id, from_name, from_agent, to_id, to_name, body, hop, reply_to, created, decision_id) = (
        values[:12]
    )
    decision = None if not decision_id else decision_by_id(conn, decision_id)
    retraction = question = None
    if decision_id is None and hop == domain.DECISION_HOP:
        # Only notices carry the maximum hop (an ordinary reply chain rarely gets there), so
        # this lookup stays off the delivery path of ordinary messages.
        retraction = retraction_for_message(conn, mid)
    elif decision_id is None and from_id == CLI_ID:
        # Only the owner answers questions: sessions' messages never pay for this lookup.
        question = question_for_message(conn, mid)
    job = False
    if decision_id is None and question is None and retraction is None and domain.is_job_name(from_name):
        # Only a job's session is named so: other messages never pay for this lookup.
        job = has_table(conn, "job_events") and conn.execute(
            "SELECT 1 FROM job_events WHERE message_id = ?", (mid,)).fetchone() is not None
    if from_id and "@" in from_id and from_name:  # another machine's session (SPEC §10): its address
        from_name = f"{from_name}@{from_id.rsplit('@', 1)[1]}"
    kind = ("decision" if decision_id else "retraction" if retraction is not None
            else "answer" if question is not None else "job" if job else "message")
    return Message(
        mid, Author(from_id, from_name, from_agent), to_id, to_name, body, hop, reply_to, kind, created,
        decision, retraction, repeat, question,
    )


def decision_by_id(conn: apsw.Connection, decision_id: str) -> Decision | None:
    row = conn.execute(
        _SELECT_DECISION + "FROM decisions d LEFT JOIN decision_heads h ON h.topic = d.topic WHERE d.id = ?",
        (decision_id,),
    ).fetchone()
    return None if row is None else Decision.from_row(row)


def unacked_messages(
    conn: apsw.Connection, peer_id: str, *, after_seq: int = 0, limit: int = 200, current_schema: bool = False
) -> list[Queued]:
    """A session's unacknowledged messages after the receipt `after_seq`, oldest first.

    `current_schema`: the caller knows the database is at the current version (the broker's
    migrated writer), so the two table checks are skipped: this runs at every delivery.
    """
    if not current_schema and not has_table(conn, "receipts"):
        return []
    dd = current_schema or has_table(conn, "decision_deliveries")
    sql = MESSAGE_SELECT if dd else MESSAGE_SELECT.replace(
        "LEFT JOIN decision_deliveries dd ON dd.message_id = m.id", ""
    ).replace("dd.decision_id", "NULL")
    if current_schema or has_column(conn, "receipts", "offered_at"):  # before V_WAKES, delivered_at: offered
        sql = sql.replace("r.acked_at, r.delivered_at", "r.acked_at, coalesce(r.offered_at, r.delivered_at)")
    sql += " WHERE r.peer_id = ? AND r.acked_at IS NULL AND r.rowid > ? ORDER BY r.rowid LIMIT ?"
    # A receipt offered or shown to the host before and never acknowledged is a repeat (SPEC §3).
    return [
        Queued(values[0], message_from_row(conn, values, repeat=values[13] is not None))
        for values in conn.execute(sql, (peer_id, after_seq, limit))
    ]


def messages_by_id(conn: apsw.Connection, ids: Sequence[str]) -> list[Message]:
    """These messages (as their recipients get them), in the order given; unknown ids left out."""
    sql = MESSAGE_SELECT + " WHERE m.id IN (SELECT value FROM json_each(?))"
    rows = conn.execute(sql, (json.dumps(list(ids)),))
    found = {values[1]: message_from_row(conn, values) for values in rows}
    return [found[i] for i in ids if i in found]


SENT_DEFAULT = 20  # `sent` without ids: the caller's newest messages
SENT_ROWS_MAX = 1000  # messages `sent` returns for the ids it was given (a `*` send's copies share one)

# A session's own messages with their receipts, newest first: every message but the notices
# of its decisions (decision_deliveries) and retractions, with the times its wakes were
# requested and the ids of the messages that reply to it.
_SENT = (
    MESSAGE_SELECT.replace(
        "r.acked_at, r.delivered_at",
        "r.acked_at, r.delivered_at, "
        "(SELECT json_group_array(w.requested_at) FROM wakes w WHERE w.message_id = m.id), "
        "(SELECT json_group_array(x.id) FROM messages x WHERE x.reply_to = m.id), m.send_id",
    )
    + "WHERE m.from_peer IN (SELECT :me UNION SELECT old_id FROM peer_merges WHERE into_id = :me) "
    "AND dd.decision_id IS NULL "
    "AND NOT EXISTS (SELECT 1 FROM retraction_notices n WHERE n.message_id = m.id) "
)


def sent_messages(
    conn: apsw.Connection, peer_id: str, ids: Sequence[str] | None, limit: int = SENT_DEFAULT
) -> list[SentReceipt]:
    """The messages session `peer_id` (or a record merged into it) sent, with their receipts,
    newest first: those `ids` name (a message's id, or the message_id its send was given),
    else the `limit` newest. A database older than receipts for senders (schema V_WAKES) has
    no answer here: the broker that runs next upgrades it."""
    if not has_table(conn, "wakes"):
        return []
    sql, args = _SENT, {"me": peer_id, "limit": limit}
    if ids is not None:
        sql += ("AND (m.id IN (SELECT value FROM json_each(:ids)) "
                "OR m.send_id IN (SELECT value FROM json_each(:ids))) ")
        args["ids"] = json.dumps(list(ids))
    sql += "ORDER BY m.rowid DESC LIMIT :limit"
    return [
        SentReceipt(
            message_from_row(conn, values),
            shown_at=values[13],
            acked_at=values[12],
            wakes=tuple(json.loads(values[14])),
            replies=tuple(json.loads(values[15])),
            send_id=values[16],
        )
        for values in conn.execute(sql, args)
    ]


INBOX_DEFAULT = 20  # `inbox`: the owner's newest messages


def owner_inbox(conn: apsw.Connection, limit: int = INBOX_DEFAULT) -> list[dict[str, Any]]:
    """The messages sessions sent to the owner (`to: "owner"`), newest first, as
    `{"id", "from": {"id", "name", "agent"}, "text", "replyTo", "createdAt"}`. Questions, which also
    go to the owner, are `questions`' to list."""
    not_a_question = "AND m.id NOT IN (SELECT id FROM questions) " if has_table(conn, "questions") else ""
    rows = conn.execute(
        "SELECT m.id, m.from_peer, p.name, p.agent, m.body, m.reply_to, m.created_at FROM messages m "
        f"LEFT JOIN peers p ON p.id = m.from_peer WHERE m.to_peer = ? {not_a_question}"
        "ORDER BY m.rowid DESC LIMIT ?",
        (CLI_ID, limit),
    )
    return [
        {"id": mid, "from": {"id": fid, "name": name, "agent": agent}, "text": body, "replyTo": reply_to,
         "createdAt": created}
        for mid, fid, name, agent, body, reply_to, created in rows
    ]


def not_sent(found: Sequence[SentReceipt], ids: Sequence[str]) -> list[str]:
    """The ids among `ids` that name none of `found` (`sent_messages` for those ids): by its
    own id or its send's message_id."""
    matched = {r.message.id for r in found} | {r.send_id for r in found}
    return [i for i in ids if i not in matched]


def recent_messages(conn: apsw.Connection, limit: int = 50) -> list[Receipt]:
    """The newest messages (one entry per recipient), newest first."""
    if not has_table(conn, "receipts"):
        return []
    dd = has_table(conn, "decision_deliveries")
    sql = MESSAGE_SELECT if dd else MESSAGE_SELECT.replace(
        "LEFT JOIN decision_deliveries dd ON dd.message_id = m.id", ""
    ).replace("dd.decision_id", "NULL")
    sql += " ORDER BY m.rowid DESC LIMIT ?"
    return [
        Receipt(values[0], message_from_row(conn, values), values[12] is not None)
        for values in conn.execute(sql, (limit,))
    ]


def list_peers(conn: apsw.Connection) -> list[Peer]:
    if not has_table(conn, "peers"):
        return []
    host_col = "host_session_id" if _has_host_column(conn) else "NULL"
    sql = (
        f"SELECT id, name, agent, project, {host_col}, kind, created_at, last_seen_at FROM peers "
        f"WHERE {LISTED_PEERS} ORDER BY last_seen_at DESC, rowid DESC"
    )
    if not has_column(conn, "peers", "machine"):  # before federation (version 11)
        sql = sql.replace(" AND machine IS NULL", "")
    if not has_column(conn, "peers", "forgotten_at"):
        sql = sql.replace(" AND forgotten_at IS NULL", "")
    return [Peer(*v) for v in conn.execute(sql)]


# The sessions a person or an agent sees: not the command line's author record, not a forgotten one.
CLI_ID = "cli"


def listed_peers(alias: str = "") -> str:
    """SQL condition on peers (`alias.`-qualified): rows listed and addressable."""
    p = f"{alias}." if alias else ""
    # machine: a session of another machine (SPEC §10) is listed by the federation reads, never here
    return f"{p}id != '{CLI_ID}' AND {p}forgotten_at IS NULL AND {p}machine IS NULL"


LISTED_PEERS = listed_peers()


def has_column(conn: apsw.Connection, table: str, column: str) -> bool:
    return any(row[1] == column for row in conn.execute(f"PRAGMA table_info({table})"))


def unacked_counts(conn: apsw.Connection) -> dict[str, int]:
    """Unacknowledged receipts per session id."""
    if not has_table(conn, "receipts"):
        return {}
    rows = conn.execute("SELECT peer_id, count(*) FROM receipts WHERE acked_at IS NULL GROUP BY peer_id")
    return {peer_id: int(n) for peer_id, n in rows}


_SELECT_RETRACTION = (
    "SELECT id, topic, retracts, reason, author_id, author_name, author_agent, created_at "
    "FROM decision_retractions "
)


def retraction_from_row(values: tuple[Any, ...]) -> Retraction:
    rid, topic, retracts, reason, author_id, author_name, author_agent, created = values
    return Retraction(rid, topic, retracts, reason, Author(author_id, author_name, author_agent), created)


def retractions(conn: apsw.Connection, *, topic: str | None = None) -> list[Retraction]:
    """Retraction records, newest first (of one topic, or all)."""
    if not has_table(conn, "decision_retractions"):
        return []
    if topic is None:
        rows = conn.execute(_SELECT_RETRACTION + "ORDER BY seq DESC")
    else:
        rows = conn.execute(_SELECT_RETRACTION + "WHERE topic = ? ORDER BY seq DESC", (topic,))
    return [retraction_from_row(v) for v in rows]


def retraction_for_message(conn: apsw.Connection, message_id: str) -> Retraction | None:
    """The retraction a notice message announces, if it is one."""
    if not has_table(conn, "retraction_notices"):
        return None
    row = conn.execute(
        _SELECT_RETRACTION.replace(
            "FROM decision_retractions ", "FROM retraction_notices n JOIN decision_retractions r "
        )
        + "ON r.id = n.retraction_id WHERE n.message_id = ?",
        (message_id,),
    ).fetchone()
    return None if row is None else retraction_from_row(row)


# A question with its askers (oldest first) and its outcome, if it has one (SPEC §4.6).
_ASKERS = (
    "(SELECT json_group_array(json_array(a.peer_id, a.name, a.agent)) FROM "
    "(SELECT peer_id, name, agent FROM question_askers qa WHERE question_id = q.id{still} ORDER BY seq) a)"
)
SELECT_QUESTION_V6 = (  # a database from before V_ASK (a reader's, before the broker upgraded it)
    "SELECT q.id, q.question, q.topic, q.options, q.scope, q.created_at, o.state, o.decision_id, o.reason, "
    + _ASKERS.format(still="") + " "
    "FROM questions q LEFT JOIN question_outcomes o ON o.question_id = q.id "
)
SELECT_QUESTION = (
    "SELECT q.id, q.question, q.topic, q.options, q.scope, q.created_at, coalesce(o.state, e.state), "
    "o.decision_id, o.reason, "
    + _ASKERS.format(still=" AND NOT EXISTS (SELECT 1 FROM question_withdrawals w "
                           "WHERE w.question_id = qa.question_id AND w.peer_id = qa.peer_id)") + ", "
    "d.context, d.recommended "
    "FROM questions q LEFT JOIN question_outcomes o ON o.question_id = q.id "
    "LEFT JOIN question_ends e ON e.question_id = q.id LEFT JOIN question_details d ON d.question_id = q.id "
)
OPEN_V6 = "o.question_id IS NULL"
OPEN = "o.question_id IS NULL AND e.question_id IS NULL"


def question_sql(conn: apsw.Connection) -> tuple[str, str]:
    """(the SELECT of a question, the WHERE term of an open one) for this database's schema."""
    if has_table(conn, "question_details"):
        return SELECT_QUESTION, OPEN
    return SELECT_QUESTION_V6, OPEN_V6


def question_from_row(values: tuple[Any, ...]) -> Question:
    qid, text, topic, options, scope, created, state, decision_id, reason, askers, *more = values
    context, recommended = more if more else (None, None)
    return Question(
        qid, text, topic, tuple(json.loads(options)), domain.scope_from_json(scope),
        tuple(Author(*a) for a in json.loads(askers or "[]")), created, state or "open", decision_id, reason,
        context, recommended,
    )


def question_by_id(conn: apsw.Connection, question_id: str) -> Question | None:
    if not has_table(conn, "questions"):
        return None
    row = conn.execute(question_sql(conn)[0] + "WHERE q.id = ?", (question_id,)).fetchone()
    return None if row is None else question_from_row(row)


def question_for_message(conn: apsw.Connection, message_id: str) -> Question | None:
    """The question an answer message (kind answer) tells its asker about, if it is one."""
    if not has_table(conn, "question_notices"):
        return None
    row = conn.execute(
        "SELECT question_id FROM question_notices WHERE message_id = ?", (message_id,)
    ).fetchone()
    return None if row is None else question_by_id(conn, row[0])


def retraction_by_id(conn: apsw.Connection, retraction_id: str) -> Retraction | None:
    row = conn.execute(_SELECT_RETRACTION + "WHERE id = ?", (retraction_id,)).fetchone()
    return None if row is None else retraction_from_row(row)


def peer_by_host_session(conn: apsw.Connection, host_session_id: str) -> Peer | None:
    if not has_table(conn, "peers") or not _has_host_column(conn):
        return None
    row = conn.execute(
        "SELECT id, name, agent, project, host_session_id, kind, created_at, last_seen_at FROM peers "
        "WHERE host_session_id = ? ORDER BY last_seen_at DESC, rowid DESC LIMIT 1",
        (host_session_id,),
    ).fetchone()
    return Peer(*row) if row else None

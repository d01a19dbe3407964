"""Read queries over bridge.db, shared by the writer (broker), the read-only readers
(dashboard, hooks, CLI) and the tests. One implementation of each lookup.

Light: apsw and the domain rules only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NamedTuple

import apsw

from agent_bridge import domain
from agent_bridge.domain import Scope

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
) -> list[dict[str, Any]]:
    """Decision objects, newest revision first (SPEC §4.2, §6).

    `needle` is an already-normalized query (domain.normalize_query); `lookup` a parsed scope or
    None for every scope; `caller_addresses` the calling session's addresses (a project lookup
    through MCP also includes decisions addressed to the caller).
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
    out: list[dict[str, Any]] = []
    for values in conn.execute(sql, args):
        row = dict(zip(DECISION_COLUMNS, values, strict=True))
        scope = domain.scope_from_json(row["scope"])
        if lookup is not None and not domain.lookup_matches(scope, lookup, addresses=addresses):
            continue
        out.append(domain.render_decision(row, scope))
        if limit is not None and len(out) >= limit:
            break
    return out


def note_decisions(
    conn: apsw.Connection, project: str, *, caller_addresses: Iterable[str] = (), limit: int
) -> tuple[list[dict[str, Any]], int]:
    """(the `limit` newest current decisions a project lookup by `project` finds, how many it finds
    in all), for the SessionStart note (SPEC §4.5). Same matching as `query_decisions(conn,
    lookup={"project": project}, caller_addresses=...)`, without rendering every row: the hook
    runs at every session start, also over 10,000 decisions (SPEC §9).
    """
    if not has_table(conn, "decisions"):
        return [], 0
    lookup: Scope = {"project": project}
    addresses = set(caller_addresses)
    where = "d.scope_kind = 'all' OR (d.scope_kind = 'project' AND d.scope_project = :project)"
    if addresses:
        where += " OR d.scope_kind = 'sessions'"
    # decisions first (CROSS JOIN keeps it the outer loop): newest rows come in rowid order, no sort.
    sql = (
        _SELECT_DECISION + "FROM decisions d CROSS JOIN decision_heads h ON h.topic = d.topic "
        f"WHERE h.seq = d.seq AND ({where}) ORDER BY d.seq DESC"
    )
    shown: list[dict[str, Any]] = []
    for values in conn.execute(sql, {"project": project}):
        row = dict(zip(DECISION_COLUMNS, values, strict=True))
        scope = domain.scope_from_json(row["scope"])
        if domain.lookup_matches(scope, lookup, addresses=addresses):
            shown.append(domain.render_decision(row, scope))
            if len(shown) >= limit:
                break
    # One pass over the current revisions: count project and global ones, collect the
    # (usually few) session-addressed scopes, which are matched against the addresses here.
    counts = conn.execute(
        "SELECT count(*) FILTER (WHERE d.scope_kind = 'all' "
        "OR (d.scope_kind = 'project' AND d.scope_project = :project)), "
        "json_group_array(d.scope) FILTER (WHERE d.scope_kind = 'sessions' AND :sessions) "
        "FROM decision_heads h JOIN decisions d ON d.seq = h.seq",
        {"project": project, "sessions": bool(addresses)},
    ).fetchone()
    assert counts is not None  # an aggregate always answers one row
    total, session_scopes = int(counts[0]), counts[1]
    for scope_json in json.loads(session_scopes or "[]"):
        if domain.lookup_matches(domain.scope_from_json(scope_json), lookup, addresses=addresses):
            total += 1
    return shown, int(total)


# The first column is the receipt's rowid: a session's delivery cursor. Receipts are written
# with their messages, so receipt order is message order, and the receipts_peer_unacked index
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


class Queued(NamedTuple):
    """An unacknowledged receipt: its rowid (the order of delivery, a delivery task's cursor)
    and the message as it is pushed."""

    seq: int
    message: dict[str, Any]


def message_from_row(conn: apsw.Connection | None, values: tuple[Any, ...]) -> dict[str, Any]:
    """The message of a MESSAGE_SELECT row, as the JSON edge shows it (the receipt's rowid and
    acknowledgement, the row's first and thirteenth values, are the caller's to read)."""
    (_, mid, from_id, from_name, from_agent, to_id, to_name, body, hop, reply_to, created, decision_id) = values[:12]
    message: dict[str, Any] = {
        "id": mid,
        "from": {"id": from_id, "name": from_name, "agent": from_agent},
        "to": {"id": to_id, "name": to_name},
        "text": body,
        "hop": hop,
        "replyTo": reply_to,
        "kind": "decision" if decision_id else "message",
        "createdAt": created,
    }
    if decision_id and conn is not None:
        found = decision_by_id(conn, decision_id)
        if found is not None:
            message["decision"] = found
    if decision_id is None and hop == domain.DECISION_HOP and conn is not None:
        # Only notices carry the maximum hop (an ordinary reply chain rarely gets there), so
        # this lookup stays off the delivery path of ordinary messages.
        retraction = retraction_for_message(conn, mid)
        if retraction is not None:
            message["kind"] = "retraction"
            message["retraction"] = retraction
    return message


def decision_by_id(conn: apsw.Connection, decision_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        _SELECT_DECISION + "FROM decisions d LEFT JOIN decision_heads h ON h.topic = d.topic WHERE d.id = ?",
        (decision_id,),
    ).fetchone()
    if row is None:
        return None
    data = dict(zip(DECISION_COLUMNS, row, strict=True))
    return domain.render_decision(data)


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
    sql += " WHERE r.peer_id = ? AND r.acked_at IS NULL AND r.rowid > ? ORDER BY r.rowid LIMIT ?"
    out = []
    for values in conn.execute(sql, (peer_id, after_seq, limit)):
        message = message_from_row(conn, values)
        if values[13] is not None:
            message["repeat"] = True  # offered to the host before, never acknowledged (SPEC §3)
        out.append(Queued(values[0], message))
    return out


def recent_messages(conn: apsw.Connection, limit: int = 50) -> list[dict[str, Any]]:
    """The newest messages (one entry per recipient), newest first."""
    if not has_table(conn, "receipts"):
        return []
    dd = has_table(conn, "decision_deliveries")
    sql = MESSAGE_SELECT if dd else MESSAGE_SELECT.replace(
        "LEFT JOIN decision_deliveries dd ON dd.message_id = m.id", ""
    ).replace("dd.decision_id", "NULL")
    sql += " ORDER BY m.rowid DESC LIMIT ?"
    out = []
    for values in conn.execute(sql, (limit,)):
        message = message_from_row(conn, values)
        message["acked"] = values[12] is not None
        out.append(message)
    return out


PEER_COLUMNS = ("id", "name", "agent", "project", "hostSessionId", "kind", "createdAt", "lastSeenAt")


def list_peers(conn: apsw.Connection) -> list[dict[str, Any]]:
    if not has_table(conn, "peers"):
        return []
    host_col = "host_session_id" if _has_host_column(conn) else "NULL"
    sql = (
        f"SELECT id, name, agent, project, {host_col}, kind, created_at, last_seen_at FROM peers "
        f"WHERE {LISTED_PEERS} ORDER BY last_seen_at DESC, rowid DESC"
    )
    if not has_column(conn, "peers", "forgotten_at"):
        sql = sql.replace(" AND forgotten_at IS NULL", "")
    return [dict(zip(PEER_COLUMNS, v, strict=True)) for v in conn.execute(sql)]


# The sessions a person or an agent sees: not the command line's author record, not a forgotten one.
CLI_ID = "cli"


def listed_peers(alias: str = "") -> str:
    """SQL condition on peers (`alias.`-qualified): rows listed and addressable."""
    p = f"{alias}." if alias else ""
    return f"{p}id != '{CLI_ID}' AND {p}forgotten_at IS NULL"


LISTED_PEERS = listed_peers()


def has_column(conn: apsw.Connection, table: str, column: str) -> bool:
    return any(row[1] == column for row in conn.execute(f"PRAGMA table_info({table})"))


def unacked_counts(conn: apsw.Connection) -> dict[str, int]:
    """Unacknowledged receipts per session id."""
    if not has_table(conn, "receipts"):
        return {}
    rows = conn.execute("SELECT peer_id, count(*) FROM receipts WHERE acked_at IS NULL GROUP BY peer_id")
    return {peer_id: int(n) for peer_id, n in rows}


RETRACTION_COLUMNS = ("id", "topic", "retracts", "reason", "author_id", "author_name", "author_agent", "created_at")
_SELECT_RETRACTION = (
    "SELECT id, topic, retracts, reason, author_id, author_name, author_agent, created_at FROM decision_retractions "
)


def render_retraction(values: tuple[Any, ...]) -> dict[str, Any]:
    row = dict(zip(RETRACTION_COLUMNS, values, strict=True))
    return {
        "id": row["id"],
        "topic": row["topic"],
        "retracts": row["retracts"],
        "reason": row["reason"],
        "author": {"id": row["author_id"], "name": row["author_name"], "agent": row["author_agent"]},
        "createdAt": row["created_at"],
    }


def retractions(conn: apsw.Connection, *, topic: str | None = None) -> list[dict[str, Any]]:
    """Retraction records, newest first (of one topic, or all)."""
    if not has_table(conn, "decision_retractions"):
        return []
    if topic is None:
        rows = conn.execute(_SELECT_RETRACTION + "ORDER BY seq DESC")
    else:
        rows = conn.execute(_SELECT_RETRACTION + "WHERE topic = ? ORDER BY seq DESC", (topic,))
    return [render_retraction(v) for v in rows]


def retraction_for_message(conn: apsw.Connection, message_id: str) -> dict[str, Any] | None:
    """The retraction a notice message announces, if it is one."""
    if not has_table(conn, "retraction_notices"):
        return None
    row = conn.execute(
        _SELECT_RETRACTION.replace("FROM decision_retractions ", "FROM retraction_notices n JOIN decision_retractions r ")
        + "ON r.id = n.retraction_id WHERE n.message_id = ?",
        (message_id,),
    ).fetchone()
    return None if row is None else render_retraction(row)


def retraction_by_id(conn: apsw.Connection, retraction_id: str) -> dict[str, Any] | None:
    row = conn.execute(_SELECT_RETRACTION + "WHERE id = ?", (retraction_id,)).fetchone()
    return None if row is None else render_retraction(row)


def peer_by_host_session(conn: apsw.Connection, host_session_id: str) -> dict[str, Any] | None:
    if not has_table(conn, "peers") or not _has_host_column(conn):
        return None
    row = conn.execute(
        "SELECT id, name, agent, project, host_session_id, kind, created_at, last_seen_at FROM peers "
        "WHERE host_session_id = ? ORDER BY last_seen_at DESC, rowid DESC LIMIT 1",
        (host_session_id,),
    ).fetchone()
    return dict(zip(PEER_COLUMNS, row, strict=True)) if row else None

"""Reads only the dashboard makes: who got which decision, and the message list split into
conversation and notices. Plain functions of a read-only connection, like `store.queries`,
whose message rendering they reuse.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import apsw

from agent_bridge.common import domain
from agent_bridge.common.rows import Author, SentReceipt
from agent_bridge.store import queries

# One row per queued notification (a decision_deliveries row names its message). The receipt
# says who holds it now: an identity merge moves receipts to the surviving session and adds a
# delivery row for it beside the old one, so rows are grouped by message, not by delivery.
# A forgotten session (`agent-bridge forget`) is not listed, and its receipts went with it.
_RECEIPTS = """
SELECT dd.decision_id, d.topic, min(dd.created_at), COALESCE(r.peer_id, dd.peer_id), p.name, p.agent,
       r.delivered_at, r.acked_at, r.message_id IS NULL
FROM decision_deliveries dd
JOIN decisions d ON d.id = dd.decision_id
LEFT JOIN receipts r ON r.message_id = dd.message_id
LEFT JOIN peers p ON p.id = COALESCE(r.peer_id, dd.peer_id)
WHERE dd.decision_id IN (SELECT value FROM json_each(?)) AND p.forgotten_at IS NULL
GROUP BY dd.decision_id, COALESCE(dd.message_id, dd.host_key)
ORDER BY d.seq DESC
"""


class DecisionReceipt(NamedTuple):
    """Who one revision was queued for, when it was queued, shown (its bytes reached the host;
    offered, in a database older than schema V_WAKES) and acknowledged, and whether it is still
    pending (queued, not acknowledged)."""

    decision_id: str
    topic: str
    session: Author
    queued_at: int
    delivered_at: int | None
    acknowledged_at: int | None
    pending: bool

    def to_json(self, *, connected: bool) -> dict[str, Any]:
        return {
            "decisionId": self.decision_id,
            "topic": self.topic,
            "session": {**self.session.to_json(), "connected": connected},
            "queuedAt": self.queued_at,
            "deliveredAt": self.delivered_at,
            "acknowledgedAt": self.acknowledged_at,
            "pending": self.pending,
        }


def decision_receipts(conn: apsw.Connection, decision_ids: Sequence[str]) -> list[DecisionReceipt]:
    """For each of `decision_ids` (in the order given), the sessions it was queued for, one
    entry per session, by name: when it was queued, offered and acknowledged, and whether it is
    still pending (queued, not acknowledged). A session that got a revision twice (a cleared
    host session catches up again) is pending while either copy is."""
    if not decision_ids or not queries.has_table(conn, "decision_deliveries"):
        return []
    sql = _RECEIPTS
    if not queries.has_column(conn, "peers", "forgotten_at"):  # before schema v4 nothing is forgotten
        sql = sql.replace(" AND p.forgotten_at IS NULL", "")
    merged: dict[tuple[str, str], DecisionReceipt] = {}
    for decision_id, topic, queued, peer_id, name, agent, offered, acked, no_receipt in conn.execute(
        sql, (json.dumps(list(decision_ids)),)
    ):
        key = (decision_id, peer_id)
        entry = merged.get(key)
        pending = acked is None and not no_receipt  # no receipt: nothing is waiting to be shown
        if entry is None:
            merged[key] = DecisionReceipt(
                decision_id, topic, Author(peer_id, name, agent), queued, offered, acked, pending
            )
            continue
        pending = entry.pending or pending
        merged[key] = entry._replace(
            queued_at=min(entry.queued_at, queued),
            delivered_at=_latest(entry.delivered_at, offered),
            pending=pending,
            acknowledged_at=None if pending else _latest(entry.acknowledged_at, acked),
        )
    order = {decision_id: i for i, decision_id in enumerate(decision_ids)}
    return sorted(
        merged.values(), key=lambda e: (order[e.decision_id], e.session.name or "", e.session.id or "")
    )


def _latest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


MESSAGE_KINDS = ("message", "notice")


def recent_messages(
    conn: apsw.Connection, *, limit: int, kind: str | None, hop_limit: int | None
) -> list[dict[str, Any]]:
    """The newest messages (one entry per recipient), newest first, as `queries.recent_messages`
    renders them plus `notice` (a decision or retraction notice rather than conversation),
    `active` (hop below the hop limit: may wake the session; None when the limit is unknown) and
    `receipt` (its state, when it was shown and acknowledged, woken: as the `sent` tool says).

    `kind`: "message" or "notice" to keep only those, None for both. A notice is a message linked
    to a decision, or one recorded at the notice hop without being a reply (conversation starts
    at hop 1 and reaches that hop only through replies).
    """
    if not queries.has_table(conn, "receipts"):
        return []
    has_dd = queries.has_table(conn, "decision_deliveries")
    sql = queries.MESSAGE_SELECT
    if not has_dd:
        sql = sql.replace("LEFT JOIN decision_deliveries dd ON dd.message_id = m.id", "").replace(
            "dd.decision_id", "NULL"
        )
    linked = "dd.decision_id IS NOT NULL OR " if has_dd else ""
    notice = f"({linked}(m.hop >= {domain.DECISION_HOP} AND m.reply_to IS NULL))"
    if kind == "notice":
        sql += f" WHERE {notice}"
    elif kind == "message":
        sql += f" WHERE NOT {notice}"
    sql += " ORDER BY m.rowid DESC LIMIT ?"
    rows = list(conn.execute(sql, (limit,)))
    wakes = _wakes(conn, [values[1] for values in rows])
    now = time.time_ns() // 1_000_000
    out = []
    for values in rows:
        message = queries.message_from_row(conn, values)
        if wakes is None:  # before V_WAKES delivered_at held the offer: only an acknowledgement says shown
            receipt = SentReceipt(message, values[12], values[12])
        else:
            receipt = SentReceipt(message, values[13], values[12], tuple(wakes.get(message.id, ())))
        out.append(
            {
                **message.to_json(),
                "acked": values[12] is not None,
                # a job's answer is conversation: the end of work its recipient asked for
                "notice": message.kind not in ("message", "job")
                or (message.hop >= domain.DECISION_HOP and message.reply_to is None),
                "active": None if hop_limit is None else message.hop < hop_limit,
                "receipt": receipt.receipt_json(now),
            }
        )
    return out


def _wakes(conn: apsw.Connection, message_ids: list[str]) -> dict[str, list[int]] | None:
    """When wakes were requested for these messages; None for a database older than wake
    requests (schema V_WAKES), whose receipts' delivered_at says offered, not shown."""
    if not queries.has_table(conn, "wakes"):
        return None
    found: dict[str, list[int]] = {}
    for message_id, at in conn.execute(
        "SELECT message_id, requested_at FROM wakes WHERE message_id IN (SELECT value FROM json_each(?))",
        (json.dumps(message_ids),),
    ):
        found.setdefault(message_id, []).append(at)
    return found


def decisions_json(
    conn: apsw.Connection,
    *,
    needle: str | None = None,
    lookup: domain.Scope | None = None,
    history: bool = False,
    topic: str | None = None,
) -> list[dict[str, Any]]:
    """`queries.query_decisions` as the API's decision objects (SPEC §6)."""
    found = queries.query_decisions(conn, needle=needle, lookup=lookup, history=history, topic=topic)
    return [d.to_json() for d in found]


def retractions_json(conn: apsw.Connection, *, topic: str | None = None) -> list[dict[str, Any]]:
    return [r.to_json() for r in queries.retractions(conn, topic=topic)]

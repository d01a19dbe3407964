"""Federation's reads (SPEC §10), for the broker, the CLI and the dashboard: the team's sessions
as this machine knows them, the machines heard from, the outbox. Read-only; a database from
before federation (version < 11) has none of them (empty results).
"""

from __future__ import annotations

import json
from typing import NamedTuple

import apsw

from agent_bridge.core import federation as fed
from agent_bridge.store.queries import has_column, has_table

KEY_PREFIX = "git:"  # a remote project decision's scope: {"project": "git:<project key>"}


class RemoteSession(NamedTuple):
    """A session of another machine, as `peers` and `agent-bridge sessions` list it."""

    id: str  # its record here: `<its id>@<machine>`
    remote_id: str  # its id on its machine
    name: str
    agent: str
    project: str
    project_key: str | None
    kind: str
    machine: str
    state: str  # busy, idle or offline (its machine silent for 90 s: offline)
    last_heard: int | None

    @property
    def address(self) -> str:
        return f"{self.name}@{self.machine}"


class Machine(NamedTuple):
    name: str
    heard_at: int
    presence_at: int | None


class OutboxStats(NamedTuple):
    depth: int
    oldest: int | None  # queued_at of the oldest row (epoch ms)
    unconfirmed: int = 0  # rows (messages, decisions) not confirmed within the bound
    decisions: int = 0  # rows of decisions and retractions owed to the team
    parked: int = 0  # ... relayed while no machine was heard: owed to the first one heard


def remote_sessions(conn: apsw.Connection, now: int) -> list[RemoteSession]:
    """Every announced session of the team's other machines (not the authors only known from a
    decision or a message), by machine then name."""
    if not has_table(conn, "peers") or not has_column(conn, "peers", "machine"):
        return []
    rows = conn.execute(
        "SELECT p.id, p.remote_id, p.name, p.agent, p.project, p.project_key, p.kind, p.machine, "
        "p.remote_state, m.heard_at FROM peers p LEFT JOIN machines m ON m.name = p.machine "
        "WHERE p.machine IS NOT NULL AND p.project != '' AND p.forgotten_at IS NULL "
        "ORDER BY p.machine, p.name"
    )
    return [
        RemoteSession(pid, rid, name, agent, project, key, kind, machine,
                      fed.session_state(said, heard, now), heard)
        for pid, rid, name, agent, project, key, kind, machine, said, heard in rows
    ]


def remote_session(conn: apsw.Connection, name: str, machine: str, now: int) -> RemoteSession | None:
    """The session `name@machine` addresses (its name or its id there), or None."""
    for s in remote_sessions(conn, now):
        if s.machine == machine and name in (s.name, s.remote_id):
            return s
    return None


def machines(conn: apsw.Connection) -> list[Machine]:
    if not has_table(conn, "machines"):
        return []
    rows = conn.execute("SELECT name, heard_at, presence_at FROM machines ORDER BY name")
    return [Machine(*row) for row in rows]


def outbox_stats(conn: apsw.Connection) -> OutboxStats:
    if not has_table(conn, "outbox"):
        return OutboxStats(0, None)
    row = conn.execute(
        "SELECT count(*), min(queued_at), count(unconfirmed_at), count(*) FILTER (WHERE kind = 'dec'), "
        "count(*) FILTER (WHERE kind = 'dec' AND relayed_at IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM machines)) FROM outbox"
    ).fetchone()
    assert row is not None
    return OutboxStats(int(row[0]), row[1], int(row[2]), int(row[3]), int(row[4]))


def outbox_rows(conn: apsw.Connection) -> list[fed.OutboxRow]:
    """Every outbox row as core.federation.Outbox takes it (times in seconds)."""
    if not has_table(conn, "outbox"):
        return []
    alone = conn.execute("SELECT 1 FROM machines LIMIT 1").fetchone() is None
    return [
        fed.OutboxRow(row_id, kind, queued, relayed, unconfirmed,
                      parked=alone and kind == fed.DEC and relayed is not None)
        for kind, row_id, queued, relayed, unconfirmed in conn.execute(
            "SELECT kind, id, queued_at, relayed_at, unconfirmed_at FROM outbox ORDER BY queued_at"
        )
    ]



class RemoteMarks(NamedTuple):
    """What `sent` adds for a message to another machine's session (SPEC §10)."""

    machine: str  # the recipient's machine
    relayed_at: int | None  # the hub acknowledged it (relayed, not delivered)
    stored_at: int | None  # its machine stored it (its first receipt)
    unconfirmed_at: int | None  # no receipt within the bound (cleared by a late one)


def remote_marks(conn: apsw.Connection, message_ids: list[str]) -> dict[str, RemoteMarks]:
    """The marks of those of `message_ids` that went to another machine's session."""
    if not message_ids or not has_column(conn, "messages", "relayed_at"):
        return {}
    rows = conn.execute(
        "SELECT m.id, p.machine, m.relayed_at, m.stored_at, m.unconfirmed_at FROM messages m "
        "JOIN peers p ON p.id = m.to_peer WHERE p.machine IS NOT NULL "
        "AND m.id IN (SELECT value FROM json_each(?))",
        (json.dumps(message_ids),),
    )
    return {mid: RemoteMarks(machine, relayed, stored, unconfirmed)
            for mid, machine, relayed, stored, unconfirmed in rows}


def sending_machines(conn: apsw.Connection, message_ids: list[str]) -> dict[str, str]:
    """`from.machine` of those of `message_ids` that came from another machine."""
    if not message_ids or not has_column(conn, "messages", "machine"):
        return {}
    rows = conn.execute(
        "SELECT id, machine FROM messages WHERE machine IS NOT NULL "
        "AND id IN (SELECT value FROM json_each(?))",
        (json.dumps(message_ids),),
    )
    return {str(mid): str(machine) for mid, machine in rows}

"""Bringing bridge.db to the current schema version (store.schema holds the steps), and the
errors of a database this version cannot use."""

from __future__ import annotations

from collections.abc import Callable

import apsw

from agent_bridge.store.schema import CURRENT_VERSION, STEPS


class SchemaError(RuntimeError):
    """The database cannot be used by this version of agent-bridge."""


class SchemaTooNew(SchemaError):
    def __init__(self, found: int) -> None:
        super().__init__(
            f"bridge.db has schema version {found}, newer than this agent-bridge understands "
            f"(up to {CURRENT_VERSION}); upgrade agent-bridge, or point AGENT_BRIDGE_HOME elsewhere"
        )
        self.found = found


def user_version(conn: apsw.Connection) -> int:
    row = conn.execute("PRAGMA user_version").fetchone()
    assert row is not None  # a pragma always answers
    return int(row[0])


def migrate(
    conn: apsw.Connection,
    *,
    before_upgrade: Callable[[int], None] | None = None,
    fault: Callable[[str], None] = lambda point: None,
) -> tuple[int, int]:
    """Bring `conn` to CURRENT_VERSION. Returns (old, new).

    All steps run in one transaction, each inside its own savepoint together with its
    `user_version` bump: a failure at any step leaves the database exactly as it was.
    `fault`: the broker's test-only crash points (common.faults).
    """
    found = user_version(conn)
    if found > CURRENT_VERSION:
        raise SchemaTooNew(found)
    if found == CURRENT_VERSION:
        return found, found
    if before_upgrade is not None:
        before_upgrade(found)
    with conn:
        for version in range(found, CURRENT_VERSION):
            with conn:
                conn.execute(STEPS[version])
            fault("upgrade:after-step")
        fault("upgrade:before-commit")
    return found, CURRENT_VERSION

"""`agent-bridge decisions`: read pinned owner decisions straight from bridge.db (broker not needed)."""

from __future__ import annotations

import json
import sys

from agent_bridge import domain, paths
from agent_bridge.store import queries, reader
from agent_bridge.store.schema import SchemaError


def decisions_command(query: str | None, scope: str | None, history: bool, as_json: bool) -> int:
    try:
        needle = domain.normalize_query(query)
        lookup = domain.parse_scope(scope) if scope is not None else None
    except domain.InputError as exc:
        print(f"agent-bridge decisions: {exc}", file=sys.stderr)
        return 2
    try:
        with reader.reading(paths.db_path(paths.home())) as conn:
            found = [] if conn is None else queries.query_decisions(conn, needle=needle, lookup=lookup, history=history)
    except SchemaError as exc:
        print(f"agent-bridge decisions: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(found, ensure_ascii=False, indent=2))
        return 0
    if not found:
        print("No decisions." if not (needle or lookup) else "No matching decisions.")
        return 0
    for d in found:
        scope_text = "all" if d["scope"] == "all" else json.dumps(d["scope"], ensure_ascii=False)
        mark = "" if d["current"] else " (superseded)"
        print(f"{d['topic']}{mark}  [{scope_text}]  by {d['author']['name']}")
        print(f"    {d['text']}")
    return 0

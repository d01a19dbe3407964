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
            # Text history also shows when a topic's decision was withdrawn, and why.
            retractions = [] if conn is None or as_json or not history else queries.retractions(conn)
    except SchemaError as exc:
        print(f"agent-bridge decisions: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(found, ensure_ascii=False, indent=2))
        return 0
    if not found:
        print("No decisions." if not (needle or lookup) else "No matching decisions.")
        return 0
    retracted = {r["retracts"]: r for r in retractions}  # newest first: each just above what it withdrew
    for d in found:
        r = retracted.get(d["id"])
        if r is not None:
            reason = f": {r['reason']}" if r["reason"] else ""
            print(f"{r['topic']} (retracted {_when(r['createdAt'])} by {r['author']['name']}){reason}")
        scope_text = "all" if d["scope"] == "all" else json.dumps(d["scope"], ensure_ascii=False)
        mark = "" if d["current"] else " (retracted)" if r is not None else " (superseded)"
        print(f"{d['topic']}{mark}  [{scope_text}]  by {d['author']['name']}  {_when(d['createdAt'])}")
        print(f"    {d['text']}")
    return 0


def _when(epoch_ms: int) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_ms / 1000))

"""`agent-bridge decisions` and `agent-bridge search`: read straight from bridge.db (broker not needed)."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import apsw

from agent_bridge.common import domain, paths
from agent_bridge.common.display import scope_words, visible, when
from agent_bridge.common.rows import Decision, Retraction
from agent_bridge.store import queries, reader, search
from agent_bridge.store.migration import SchemaError


def decisions_command(query: str | None, scope: str | None, history: bool, as_json: bool) -> int:
    try:
        needle = domain.normalize_query(query)
        lookup = domain.parse_scope(scope) if scope is not None else None
    except domain.InputError as exc:
        print(f"agent-bridge decisions: {exc}", file=sys.stderr)
        return 2
    try:
        with reader.reading(paths.db_path(paths.home())) as conn:
            found = (
                []
                if conn is None
                else queries.query_decisions(conn, needle=needle, lookup=lookup, history=history)
            )
            # Text history also shows when a topic's decision was withdrawn, and why.
            retractions = [] if conn is None or as_json or not history else queries.retractions(conn)
    except SchemaError as exc:
        print(f"agent-bridge decisions: {exc}", file=sys.stderr)
        return 1
    except (apsw.Error, OSError) as exc:  # busy, corrupt, not a database, a WAL gone missing
        return _cannot_read(paths.db_path(paths.home()), exc)
    if as_json:
        print(json.dumps([d.to_json() for d in found], ensure_ascii=False, indent=2))
        return 0
    if not found:
        print("No decisions." if not (needle or lookup) else "No matching decisions.")
        return 0
    if history:
        _print_history(found, retractions)
        return 0
    for d in found:
        print(
            f"{visible(d.topic)}  for {scope_words(d.scope)}  by {visible(d.author.name)}  "
            f"{when(d.created_at)}"
        )
        print(f"    {visible(d.text)}")
    return 0


def search_command(query: str, as_json: bool) -> int:
    """`agent-bridge search QUERY [--json]`: messages, decisions and questions holding every word,
    newest first (SPEC §4.6 "Search"); read-only, works with the broker down."""
    try:
        words = domain.search_words(query)
    except domain.InputError as exc:
        print(f"agent-bridge search: {exc}", file=sys.stderr)
        return 2
    db = paths.db_path(paths.home())
    try:
        with reader.reading(db) as conn:
            hits, more = ([], False) if conn is None else search.search(conn, words)
    except SchemaError as exc:
        print(f"agent-bridge search: {exc}", file=sys.stderr)
        return 1
    except (apsw.Error, OSError) as exc:
        return _cannot_read(db, exc, "search")
    if as_json:
        print(json.dumps({"query": query, "results": [h.to_json() for h in hits], "more": more},
                         ensure_ascii=False, indent=2))
        return 0
    if not hits:
        print("Nothing found.")
        return 0
    for h in hits:
        print(f"{when(h.created_at)}  {_headline(h)}  id {h.id}")
        print(f"    {visible(h.snippet)}")
    if more:
        print(f"(the {len(hits)} newest shown; more words narrow the search)")
    return 0


def _headline(hit: search.Hit) -> str:
    """Who and what, in words: `message from A to B`, `decision db (current) by cli`, `question
    (open) from A, topic db`."""
    sender = visible(hit.sender.name or "?")
    if hit.kind == "message":
        to = visible(hit.to.name if hit.to is not None and hit.to.name else "?")
        return f"message from {sender} to {to}"
    if hit.kind == "decision":
        return f"decision {visible(hit.topic)} ({hit.state}) by {sender}"
    topic = f", topic {visible(hit.topic)}" if hit.topic else ""
    return f"question ({hit.state}) from {sender}{topic}"


def _print_history(found: list[Decision], retractions: list[Retraction]) -> None:
    """Each topic once (the topic with the newest revision first), its revisions under it, newest
    first, with each retraction just above the revision it withdrew."""
    topics: dict[str, list[Decision]] = {}
    for d in found:  # newest first, so a topic's first revision seen is its newest
        topics.setdefault(d.topic, []).append(d)
    retracted = {r.retracts: r for r in retractions}
    for topic, revisions in topics.items():
        state = "current" if revisions[0].current else "no current decision"
        count = f"{len(revisions)} revision{'s' if len(revisions) != 1 else ''}"
        print(f"{visible(topic)}  ({state}; {count})")
        for d in revisions:
            r = retracted.get(d.id)
            if r is not None:
                reason = f": {visible(r.reason)}" if r.reason else ""
                print(f"  retracted {when(r.created_at)} by {visible(r.author.name)}{reason}")
            mark = "current" if d.current else "retracted" if r is not None else "superseded"
            print(
                f"  {when(d.created_at)}  for {scope_words(d.scope)}  by {visible(d.author.name)}  ({mark})"
            )
            print(f"      {visible(d.text)}")


def _cannot_read(db: Path, exc: BaseException, command: str = "decisions") -> int:
    """One line for the person; the traceback in broker.log for whoever debugs it."""
    busy = isinstance(exc, (apsw.BusyError, apsw.LockedError))
    why = (
        "it is busy (another process holds a lock on it); try again"
        if busy
        else f"{type(exc).__name__}: {exc}"
    )
    print(
        f"agent-bridge {command}: cannot read {db}: {why} (details in {paths.log_path(db.parent)})",
        file=sys.stderr,
    )
    details = "".join(traceback.format_exception(exc)).replace("\n", " | ")
    paths.append_log(db.parent, f"{command}: cannot read {db}: {details}")
    return 1

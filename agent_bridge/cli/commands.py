"""The owner's commands: `agent-bridge decide | send | retract | answer | forget | sessions | questions`.

`decide`, `send`, `retract`, `answer` and `forget` change bridge.db, so they go through the broker
(the only writer), starting one when none runs, as an MCP server does: the command then behaves
exactly as the MCP tools (same rules, limits, errors, fan-out and notices). `sessions` and
`questions` only read, so they read bridge.db directly and work with the broker down.

Results go to stdout as one or two lines for people, or with `--json` as the tool's JSON
(exit 0); a refusal is one line on stderr and a non-zero exit: 2 for a bad argument (what the
broker refuses as bad input), 1 for anything else. Text that came from agents goes through
display.visible before it reaches a terminal. Standard library and the blocking client only:
no Trio, no MCP.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_bridge.common import domain, paths
from agent_bridge.common.display import age, names, scope_words, visible, when
from agent_bridge.ipc import blocking
from agent_bridge.ipc.owner import BAD_ARGUMENTS, CommandError, broker_call
from agent_bridge.ipc.protocol import RemoteError

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
DURATION_MAX_MS = 36_500 * UNIT_MS["d"]


def _record_decision(
    op: str, args: dict[str, Any], as_json: bool, summary: Callable[[dict[str, Any]], str]
) -> int:
    """`decide` or `answer` through the broker: its JSON with --json, else `summary` of it; a scope
    naming no known session is said on stderr (the decision is recorded for it as given)."""
    try:
        result = _call(op, args)
    except CommandError as exc:
        return _fail(op, str(exc), exc.code)
    unmatched = result.pop(domain.UNMATCHED_ADDRESSES, None)
    if unmatched:
        print(f"agent-bridge {op}: no known session is addressed by {names(unmatched)}; "
              "recorded for the scope as given", file=sys.stderr)
    if as_json:
        _print_json(result)
    else:
        print(summary(result))
    return 0


def _fail(command: str, message: str, code: int = 1) -> int:
    print(f"agent-bridge {command}: {visible(message)}", file=sys.stderr)
    return code


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False, indent=2))


def decide(topic: str, text: str, scope: str | None, as_json: bool = False) -> int:
    args: dict[str, Any] = {"topic": topic, "text": text, "project": os.path.abspath(os.getcwd())}
    if scope is not None:
        try:  # a bad argument is refused here (exit 2), before a broker is started for it
            domain.parse_scope(scope)
        except domain.InputError as exc:
            _fail("decide", str(exc))
            return 2
        args["scope"] = scope  # a string: "all" or JSON, parsed by the broker's rules
    return _record_decision(
        "decide", args, as_json, lambda r: decided_summary(r, _superseded(r["decision"].get("supersedes")))
    )


def send(to: str, text: str, as_json: bool = False, message_id: str | None = None) -> int:
    """`agent-bridge send TO TEXT [--message-id UUID]`: TO as the send tool takes it, an agent
    kind and `*` looking for sessions of the current folder's project."""
    args: dict[str, Any] = {"to": to, "text": text, "project": os.path.abspath(os.getcwd())}
    if message_id is not None:
        args["message_id"] = message_id
    try:
        result = _call("send", args)
    except CommandError as exc:
        return _fail("send", str(exc), exc.code)
    if as_json:
        _print_json(result)
    else:
        print(sent_summary(result))
    return 0


def sent(ids: list[str], as_json: bool) -> int:
    """`agent-bridge sent [ID…] [--json]`: the owner's own messages (sender `cli`) with their
    receipts, as the sent tool gives an agent its own; read-only, the broker may be down."""
    from agent_bridge.store import queries, reader
    from agent_bridge.store.migration import SchemaError

    try:
        with reader.reading(paths.db_path(paths.home())) as conn:
            found = [] if conn is None else queries.sent_messages(
                conn, queries.CLI_ID, ids or None, queries.SENT_ROWS_MAX if ids else queries.SENT_DEFAULT
            )
    except SchemaError as exc:
        return _fail("sent", str(exc))
    unknown = queries.not_sent(found, ids)
    if unknown:
        return _fail(
            "sent", f"no message with id {unknown[0]!r} was sent with `agent-bridge send`", BAD_ARGUMENTS
        )
    now = time.time_ns() // 1_000_000
    if as_json:
        _print_json([r.to_json(now) for r in found])
        return 0
    if not found:
        print("No messages sent with `agent-bridge send` yet.")
    for r in found:
        print(receipt_line(r.to_json(now)))
        text = " ".join(r.message.text.split())
        print(f"    {visible(text[:120] + ('…' if len(text) > 120 else ''))}")
    return 0


def inbox(as_json: bool) -> int:
    """`agent-bridge inbox [--json]`: the messages sessions sent to the owner, newest first;
    read-only, the broker may be down."""
    from agent_bridge.store import queries, reader
    from agent_bridge.store.migration import SchemaError

    try:
        with reader.reading(paths.db_path(paths.home())) as conn:
            found = [] if conn is None else queries.owner_inbox(conn)
    except SchemaError as exc:
        return _fail("inbox", str(exc))
    if as_json:
        _print_json(found)
        return 0
    if not found:
        print("No messages to the owner yet.")
    for m in found:
        sender = m["from"]
        who = f"{sender['name'] or sender['id']} ({sender['agent']})" if sender["agent"] else sender["name"]
        print(f"{visible(m['id'])}  from {visible(who or '?')}  {when(m['createdAt'])}")
        print(f"    {visible(' '.join(m['text'].split()))}")
    if found:
        print("Reply with `agent-bridge send NAME TEXT`.")
    return 0


def receipt_line(r: dict[str, Any]) -> str:
    """`0199… to codex-app  acknowledged (shown 12:01:02, acknowledged 12:01:02); woken: confirmed;
    replies: 0199…`: a `sent` item for people."""
    to = visible((r.get("to") or {}).get("name") or (r.get("to") or {}).get("id") or "?")
    times = [
        f"{what} {when(r[key])}"
        for what, key in (("shown", "shownAt"), ("acknowledged", "acknowledgedAt"))
        if r.get(key) is not None
    ]
    parts = [f"{visible(r['id'])}  to {to}  {r['state']}" + (f" ({', '.join(times)})" if times else "")]
    if r.get("woken"):
        parts.append(f"woken: {r['woken']}")
    if r.get("replies"):
        parts.append(f"replies: {names(r['replies'])}")
    return "; ".join(parts)


def retract(topic: str, reason: str | None, as_json: bool = False) -> int:
    args: dict[str, Any] = {"topic": topic}
    if reason is not None:
        args["reason"] = reason
    try:
        result = _call("retract", args)
    except CommandError as exc:
        return _fail("retract", str(exc), exc.code)
    if as_json:
        _print_json(result)
    else:
        print(retracted_summary(result))
    return 0


def answer(question_id: str, text: str | None, option: int | None, decline: str | None, scope: str | None,
           as_json: bool = False) -> int:
    """`agent-bridge answer ID TEXT | --option N | --decline REASON [--scope SCOPE]`."""
    given = [
        name
        for name, value in (("TEXT", text), ("--option", option), ("--decline", decline))
        if value is not None
    ]
    if len(given) != 1:
        return _fail("answer", "give exactly one of TEXT, --option N or --decline REASON"
                     + (f" (got {' and '.join(given)})" if given else ""), BAD_ARGUMENTS)
    args: dict[str, Any] = {"questionId": question_id}
    if decline is not None:
        if scope is not None:
            return _fail("answer", "--scope: a declined question records no decision", BAD_ARGUMENTS)
        args["decline"] = decline
    elif option is not None:
        args["option"] = option
    else:
        args["text"] = text
    if scope is not None:
        try:  # a bad argument is refused here (exit 2), before a broker is started for it
            domain.parse_scope(scope)
        except domain.InputError as exc:
            return _fail("answer", str(exc), BAD_ARGUMENTS)
        args["scope"] = scope
    return _record_decision("answer", args, as_json, answered_summary)


def _call(op: str, args: dict[str, Any]) -> Any:
    try:
        return broker_call(op, **args)
    except OSError as exc:
        raise CommandError(f"{type(exc).__name__}: {exc}") from None


# --- the summaries people read (the dashboard shows the same results itself) -----------


def _told(notified: list[str], *, later: str) -> str:
    if notified:
        return f"told {names(notified)}"
    return f"no session in scope is connected; {later}"


def decided_summary(result: dict[str, Any], replaced: dict[str, Any] | None = None) -> str:
    """`Recorded db for project /w/app (supersedes "MySQL" by claude-app); told claude-app, codex-app.`"""
    d = result["decision"]
    supersedes = ""
    if replaced is not None:
        supersedes = f" (supersedes {_quoted(replaced['text'])} by {visible(replaced['author']['name'])})"
    elif d.get("supersedes"):
        supersedes = f" (supersedes revision {visible(d['supersedes'])})"
    told = _told(
        result.get("deliveredTo") or [], later="sessions that start later see it in their start note"
    )
    return f"Recorded {visible(d['topic'])} for {scope_words(d['scope'])}{supersedes}; {told}."


def sent_summary(result: dict[str, Any]) -> str:
    again = " (sent before with this message id: nothing new was sent)" if result.get("duplicate") else ""
    if "messages" in result:  # `*`
        ids = ", ".join(visible(m["id"]) for m in result["messages"])
        return f"Sent to {names(result['recipients'])}{again}; messages {ids}."
    m = result["message"]
    to = visible((m.get("to") or {}).get("name") or "?")
    if again:
        return f"Sent to {to}{again}; message {m['id']}."
    if result.get("recipientConnected"):
        return f"Sent to {to} (connected); message {m['id']}."
    seen = result.get("recipientLastSeen")
    gone = f"last seen {when(seen)}" if seen else "never seen connected"
    return f"Queued for {to} (not connected, {gone}); it gets it when it connects. Message {m['id']}."


def retracted_summary(result: dict[str, Any]) -> str:
    r = result["retraction"]
    reason = f" ({visible(r['reason'])})" if r.get("reason") else ""
    told = _told(result.get("notified") or [], later="sessions that start later no longer see it")
    return f"Retracted {visible(r['topic'])}{reason}; {told}."


def answered_summary(result: dict[str, Any]) -> str:
    """`Answered "Which database?" (0199…): recorded db for project /w/app; told claude-app.
    Asked by: codex-app.`"""
    q = result["question"]
    asked = f" Sent to {names(result['askersTold'])}, who asked." if result.get("askersTold") else (
        " Nobody who asked is still known.")
    if result.get("decision") is None:
        return f"Declined {_quoted(q['question'])} ({visible(q['id'])}).{asked}"
    d = result["decision"]
    told = _told(
        result.get("deliveredTo") or [], later="sessions that start later see it in their start note"
    )
    return (f"Answered {_quoted(q['question'])} ({visible(q['id'])}): recorded {visible(d['topic'])} for "
            f"{scope_words(d['scope'])}; {told}.{asked}")


def _quoted(text: str, limit: int = 60) -> str:
    one = " ".join(text.split())
    return "\u201c" + visible(one if len(one) <= limit else one[: limit - 1] + "…") + "\u201d"


def _superseded(decision_id: str | None) -> dict[str, Any] | None:
    """The revision a new one replaced, read from bridge.db (None when it cannot be read)."""
    if not decision_id:
        return None
    from agent_bridge.store import queries, reader

    try:
        with reader.reading(paths.db_path(paths.home())) as conn:
            found = None if conn is None else queries.decision_by_id(conn, decision_id)
    except Exception:  # noqa: BLE001 - only a nicer summary is lost; the decision is recorded
        return None
    return None if found is None else found.to_json()


# --- sessions and forget -------------------------------------------------------------


def parse_duration(text: str) -> int:
    """`90s`, `30m`, `12h`, `7d`, `2w` -> milliseconds."""
    match = DURATION.match(text)
    if not match:
        raise CommandError(
            f"--gone-for: expected a number and a unit s, m, h, d or w (e.g. 7d), got {text!r}", BAD_ARGUMENTS
        )
    ms = float(match.group(1)) * UNIT_MS[match.group(2)]
    if not ms <= DURATION_MAX_MS:  # (also inf, from a number too long for a float)
        raise CommandError(
            f"--gone-for: at most {DURATION_MAX_MS // UNIT_MS['d']}d (100 years), got {text!r}", BAD_ARGUMENTS
        )
    return int(ms)


def list_sessions(home: Path) -> list[dict[str, Any]]:
    """Every known session as the `peers` tool's objects (with `state` and `stateSince`) plus
    `lastSeen` and `unacknowledged`, connected ones first. Read-only: the broker, when it runs,
    is asked only who is connected."""
    from agent_bridge.common import marks
    from agent_bridge.store import federation_queries, queries, reader

    try:
        connected = set(blocking.call(home, "connected", timeout=5.0))
    except (blocking.BrokerUnavailable, RemoteError, OSError, TypeError):
        connected = set()  # no broker (or an older one): nobody is connected
    with reader.reading(paths.db_path(home)) as conn:
        if conn is None:
            return []
        peers = queries.list_peers(conn)
        unacked = queries.unacked_counts(conn)
        team = federation_queries.remote_sessions(conn, time.time_ns() // 1_000_000)
    out = []
    for p in peers:
        on = p.id in connected
        state = marks.session_state(home, p.host_session_id, connected=on, last_seen=p.last_seen_at)
        item = {**p.public(), "connected": on, **state.to_json(), "lastSeen": p.last_seen_at}
        item["unacknowledged"] = unacked.get(p.id, 0)
        out.append({**item, "machine": None} if team else item)
    for r in team:  # the team's other machines' sessions (SPEC §10), as `peers` lists them
        out.append({"id": r.id, "name": r.address, "agent": r.agent, "project": r.project,
                    "hostSessionId": None, "kind": r.kind, "machine": r.machine,
                    "connected": r.state != "offline", "state": r.state, "stateSince": r.last_heard,
                    "lastSeen": r.last_heard, "unacknowledged": 0})
    out.sort(key=lambda s: (not s["connected"], -int(s["lastSeen"] or 0), s["name"]))
    return out


def sessions(as_json: bool) -> int:
    from agent_bridge.store.migration import SchemaError

    try:
        found = list_sessions(paths.home())
        asked = 0 if as_json else open_question_count(paths.home())
    except SchemaError as exc:
        return _fail("sessions", str(exc))
    if as_json:
        _print_json(found)
        return 0
    if asked:
        print(f"{asked} open question{'s' if asked != 1 else ''} for you: see `agent-bridge questions`.")
    if not found:
        print("No sessions.")
        return 0
    now = time.time_ns() // 1_000_000
    for s in found:
        state = "connected" if s["connected"] else f"gone, last seen {age(now - int(s['lastSeen'] or 0))} ago"
        if s["connected"] and s["state"]:
            state += f", {s['state']} for {age(now - int(s['stateSince'] or now))}"
        waiting = f", {s['unacknowledged']} unacknowledged" if s["unacknowledged"] else ""
        print(f"{visible(s['name']):<24} {visible(s['agent']):<8} {s['kind']:<11} {state}{waiting}")
        host = f"  host {visible(s['hostSessionId'])}" if s["hostSessionId"] else ""
        print(f"    {visible(s['project'])}  id {visible(s['id'])}{host}")
    return 0


def forget(addresses: list[str], gone_for: str | None, as_json: bool) -> int:
    if bool(addresses) == (gone_for is not None):
        return _fail("forget", "give session names/ids, or --gone-for DURATION (not both)", BAD_ARGUMENTS)
    try:
        args: dict[str, Any] = (
            {"sessions": addresses} if addresses else {"goneForMs": parse_duration(gone_for or "")}
        )
        result = _call("forget", args)
    except CommandError as exc:
        return _fail("forget", str(exc), exc.code)
    if as_json:
        _print_json(result)
        return 0
    forgotten = result.get("forgotten", [])
    if not forgotten:
        print("Nothing to forget.")
    for item in forgotten:
        s, dropped = item["session"], item["dropped"]
        print(f"Forgot {visible(s['name'])} ({visible(s['id'])}); {len(dropped)} queued message(s) dropped"
              + (":" if dropped else "."))
        for m in dropped:
            sender = (m.get("from") or {}).get("name") or "?"
            text = " ".join(str(m.get("text", "")).split())
            text = text[:120] + ("…" if len(text) > 120 else "")
            print(f"    [{visible(m.get('kind'))}] from {visible(sender)}: {visible(text)}")
    return 0


# --- questions ------------------------------------------------------------------------


def open_question_count(home: Path) -> int:
    from agent_bridge.store import question_queries, reader

    with reader.reading(paths.db_path(home)) as conn:
        return 0 if conn is None else question_queries.open_count(conn)


def questions(include_closed: bool, as_json: bool) -> int:
    """`agent-bridge questions [--all] [--json]`: read-only, oldest first."""
    from agent_bridge.store import question_queries, reader
    from agent_bridge.store.migration import SchemaError

    try:
        with reader.reading(paths.db_path(paths.home())) as conn:
            found = (
                [] if conn is None else question_queries.list_questions(conn, include_closed=include_closed)
            )
    except SchemaError as exc:
        return _fail("questions", str(exc))
    if as_json:
        _print_json([q.to_json() for q in found])
        return 0
    if not found:
        print("No questions." if include_closed else "No open questions.")
        return 0
    for q in found:
        state = "" if q.open else f"  ({q.state})"
        askers = names([a.name or "?" for a in q.asked_by])
        print(f"{visible(q.id)}  from {askers}  {when(q.created_at)}  for {scope_words(q.scope)}{state}")
        print(f"    {visible(q.question)}")
        if q.topic:
            print(f"    topic: {visible(q.topic)}")
        if q.context:
            print(f"    context: {visible(q.context)}")
        for n, option in enumerate(q.options, start=1):
            mark = " (recommended)" if q.recommended == n - 1 else ""
            print(f"    {n}. {visible(option)}{mark}")
        if q.state == "answered":
            print(f"    answered: decision {visible(q.decision_id)}")
        elif q.state == "declined":
            print(f"    declined: {visible(q.reason)}")
    if not include_closed:
        print("Answer with `agent-bridge answer ID TEXT`, `--option N` or `--decline REASON`.")
    return 0


# --- jobs (SPEC §4.7) -------------------------------------------------------------------


def jobs(every: bool, as_json: bool) -> int:
    """`agent-bridge jobs [--all] [--json]`: read-only (works with the broker down), oldest first."""
    from agent_bridge.store import job_queries, reader
    from agent_bridge.store.migration import SchemaError

    try:
        with reader.reading(paths.db_path(paths.home())) as conn:
            found = [] if conn is None else job_queries.jobs(conn, every=every)
    except SchemaError as exc:
        return _fail("jobs", str(exc))
    if as_json:
        _print_json([j.to_json() for j in found])
        return 0
    if not found:
        print("No jobs." if every
              else "No running or queued jobs (`agent-bridge jobs --all` lists ended ones).")
        return 0
    now = int(time.time() * 1000)
    for j in found:
        ran = "" if j.started_at is None else f", ran {age(max(0, (j.ended_at or now) - j.started_at))}"
        parent = visible(j.parent.name or "?")
        print(f"{visible(j.name)}  {j.state}  {j.agent}, {j.access}{ran}  for {parent}")
        print(f"    {visible(j.title)}")
        if j.last_step:
            print(f"    last step: {visible(j.last_step)}")
        if j.branch:
            print(f"    branch {visible(j.branch)} in {visible(j.worktree or '')}")
        print(f"    id {j.id}")
    return 0


def jobs_cancel(job_id: str, as_json: bool = False) -> int:
    """`agent-bridge jobs cancel ID`: a queued job ends at once, a running one is stopped."""
    try:
        result = _call("job_cancel", {"jobId": job_id})
    except CommandError as exc:
        return _fail("jobs cancel", str(exc), exc.code)
    if as_json:
        _print_json(result)
        return 0
    j = result["job"]
    if j["state"] == "running":
        print(f"Stopping {visible(j['name'])}: its process group gets SIGTERM, then SIGKILL; "
              "its parent gets the cancelled result.")
    else:
        print(f"{visible(j['name'])} is {j['state']}.")
    return 0

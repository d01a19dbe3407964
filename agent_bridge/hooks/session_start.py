"""`agent-bridge hook session-start --agent HOST` (SPEC §4.5).

Adds a short note to the new session's context: its bridge identity in one line, then the
current pinned owner decisions that apply to its folder. Reads bridge.db directly, read-only, so
the note is there before any broker runs; reports the host identity to the broker when one runs,
else leaves it in `<home>/reports/` for the next one.

Output: the host's documented SessionStart answer (`Host.session_start_output` in
agent_bridge/hosts; for Claude Code and Codex alike
`{"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "..."}}`).

Any failure (malformed stdin, no database, a locked or newer database, anything else): no note,
exit 0, one line in broker.log. A hook never breaks a session start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_bridge import hosts
from agent_bridge.common import domain, paths, procinfo
from agent_bridge.hooks import common

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agent_bridge.common.rows import Decision

EVENT = "SessionStart"
READ_BUSY_MS = 300  # a locked database costs the session start at most this long, then no note


def main(agent: str) -> int:
    home = paths.home()
    try:
        host, chain = hosts.current_host()  # first: before anything in the chain detaches
        answer: dict[str, Any] | None = None
        try:
            hook = common.read_input()
        except common.SessionIdError as exc:  # the decisions are still readable: a note without identity
            common.log(home, f"session-start ({agent})", f"identity not reported: {exc}")
            hook = exc.hook
        else:
            answer = report_identity(home, agent, hook, host, chain)
        session = answer.get("session") if answer else None
        note = build_note(home, agent, hook, session if isinstance(session, dict) else None)
        if note is None:
            return 0
        common.emit((hosts.by_name(agent) or hosts.DEFAULT).session_start_output(note))
    except Exception as exc:  # noqa: BLE001 - whatever it is, the session must start
        common.log(home, f"session-start ({agent})", f"no note: {type(exc).__name__}: {exc}")
    return 0


def report_identity(
    home: Path, agent: str, hook: common.HookInput, host: procinfo.Proc | None, chain: list[procinfo.Proc]
) -> dict[str, Any] | None:
    """The broker's answer to `identify`, or None (the report is left for the next broker)."""
    args = common.identify_args(agent, hook, EVENT, host, chain)
    try:
        return common.broker_request(home, "identify", args)
    except OSError as exc:  # no broker, and the identity report cannot be left (read-only, full disk)
        common.log(home, f"session-start ({agent})", f"identity not reported: {exc}")
        return None  # the decisions are still readable: the note goes on without it


def build_note(home: Path, agent: str, hook: common.HookInput, session: dict[str, Any] | None) -> str | None:
    """The note, or None (after logging why) when there is no database to read."""
    from agent_bridge.store import queries, reader

    db = paths.db_path(home)
    with reader.reading(db, busy_timeout_ms=READ_BUSY_MS) as conn:
        if conn is None:
            common.log(home, f"session-start ({agent})", f"no note: no database at {db} yet")
            return None
        if session is None and hook.session_id:
            found = queries.peer_by_host_session(conn, hook.session_id)
            session = None if found is None else found.public()
        addresses = {hook.session_id} if hook.session_id else set()
        if session is not None:
            addresses.update(
                a for a in (session.get("id"), session.get("name"), session.get("hostSessionId")) if a
            )
        key = None
        if queries.has_keyed_decisions(conn):  # another machine's project decisions: by the folder's origin
            from agent_bridge.common.projectkey import project_key

            key = project_key(hook.cwd)
        shown, total = queries.note_decisions(
            conn, hook.cwd, caller_addresses=addresses, limit=domain.NOTE_TOPICS, project_key=key
        )
    return render_note(agent, hook.cwd, session, shown, total)


def identity_line(agent: str, cwd: str, session: dict[str, Any] | None) -> str:
    """The session's bridge identity: its name, the address other sessions use. Short on
    purpose: the note is paid for in context at every session start (bench/bench_context_cost)."""
    if session is not None:
        return f"agent-bridge: you are {session.get('name')}."
    # Not known yet (Claude Code runs this hook before its MCP server connects): the name is
    # the broker's to give when it does (another session may hold the folder's usual one),
    # so the note names none rather than a guess that can be wrong.
    return (
        "agent-bridge: this session joins when its agent-bridge MCP server connects; `whoami` gives its name."
    )


def plugin_hook(env: Any) -> bool:
    """Whether this hook is the plugin's (hosts.plugin): Claude Code and Codex give a plugin's hooks
    CLAUDE_PLUGIN_ROOT (NOTES.md, "Plugins")."""
    return bool(env.get("CLAUDE_PLUGIN_ROOT"))


def render_note(
    agent: str, cwd: str, session: dict[str, Any] | None, shown: Sequence[Decision], total: int
) -> str:
    """Identity and which tools to message with (one line), then one `topic: text` line per decision
    (newest first, texts cut at 160 characters with …), then how many more there are and where to find
    them."""
    identity = (
        f"{identity_line(agent, cwd, session)} "
        f"{(hosts.by_name(agent) or hosts.DEFAULT).tools_sentence(plugin=plugin_hook(os.environ))}"
    )
    if not shown:
        return identity
    lines = [f"{identity} Owner decisions, newest first:"]
    lines.extend(d.line(domain.NOTE_TEXT_MAX) for d in shown)
    rest = total - len(shown)
    lines.append(
        f"{rest} more; the `decisions` tool lists them."
        if rest
        else "No more; the `decisions` tool lists all."
    )
    return "\n".join(lines)

"""`agent-bridge hook post-tool-use --agent HOST` (SPEC §3 "Reach" item 1: while the agent works).

Runs after every tool call. When the session has unacknowledged **active** messages and the
broker is up, hands them to the model as the host's PostToolUse answer
`{"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "..."}}`
(`Host.post_tool_use_output`), which both hosts put into the model's next request of the same
turn (seen with Claude Code 2.1.332, a system message after the tool result, and Codex 0.171.0, a
developer message after the call's output). Fetch, write, then acknowledge, as the Stop hook:
`agent_bridge.hooks.handover`.

Cheap when nothing waits, which is nearly always: it reads bridge.db read-only (as the
SessionStart hook does) and returns before it looks at its ancestors or talks to the broker,
unless a message with a hop below the maximum waits for this host session id. The broker then
applies its own hop limit and leaves out what the session's MCP server is showing right now.
A session whose host session id the bridge has not learned yet is left to its Stop hook.

Any failure: no output, exit 0, one line in broker.log. A hook never breaks its host.

Host documentation: Claude Code "Hooks reference" (https://code.claude.com/docs/en/hooks#posttooluse):
stdin `session_id`, `transcript_path`, `cwd`, `hook_event_name`, `tool_name`, `tool_input`,
`tool_response`; Codex "Hooks" (https://developers.openai.com/codex/hooks): the same, plus
`turn_id`, `tool_use_id` (post_tool_use.command.output.schema.json has `additionalContext`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agent_bridge.common import paths

EVENT = "PostToolUse"
READ_BUSY_MS = 200  # a locked database costs the tool call at most this long, then no delivery this time
# as hooks.common.STDIN_MAX (checked by tests/hooks): read past it, parse_input refuses it
STDIN_MAX = 8 << 20
# With nothing waiting (nearly always) the hook imports no more than `paths` and the store's
# reader: `common`, `domain`, `hosts` and the client cost milliseconds at every tool call.


def main(agent: str, raw: bytes | None = None) -> int:
    """`raw`: the hook input, when hooks.quick has read it already."""
    home = paths.home()
    try:
        raw = sys.stdin.buffer.read(STDIN_MAX + 1) if raw is None else raw
        if not waiting(home, raw):
            return 0
        from agent_bridge import hosts
        from agent_bridge.hooks import common, handover

        host, chain = hosts.current_host()
        hook = common.parse_input(raw)
        target = hosts.by_name(agent) or hosts.DEFAULT
        deferred = None
        wake = False
        if target.defers_ack:  # the host's plugin acknowledges once the host took the text (hooks.ack)
            def deferred(text: str, ids: list[str], peer: object) -> None:
                common.emit({**target.post_tool_use_output(text), "ids": ids, "peer": peer})
            # the plugin's hand-over at the session's idle starts a turn with it: a wake, recorded
            # for the senders' receipts (`sent`: requested, confirmed once acknowledged)
            wake = plugin_wake(raw)
        handover.hand_over(home, agent, EVENT, hook, host, chain,
                           lambda text: common.emit(target.post_tool_use_output(text)), wake=wake,
                           deferred=deferred)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the tool call's turn goes on
        paths.append_log(home, f"hook post-tool-use ({agent}): nothing handed over: "
                         + " ".join(f"{type(exc).__name__}: {exc}".split()))
    return 0


def plugin_wake(raw: bytes) -> bool:
    """Whether a host's plugin runs this hook to wake its idle session (hosts.opencode_plugin:
    `hook_event_name` "Stop", at `session.idle`), not after a tool call."""
    try:
        data = json.loads(raw)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("hook_event_name") == "Stop"


def waiting(home: Path, raw: bytes) -> bool:
    """Whether an active message may wait for the session in this hook input: the read-only
    check, before anything costlier. Malformed input is left to `common.parse_input` to name."""
    try:
        data = json.loads(raw)
    except ValueError:
        return True  # let parse_input say what is wrong with it
    session_id = data.get("session_id") if isinstance(data, dict) else None
    if not isinstance(session_id, str) or not session_id.strip():
        return True
    session_id = session_id.strip()
    from agent_bridge.store import reader

    conn = reader.open_readonly(paths.db_path(home), busy_timeout_ms=READ_BUSY_MS)
    if conn is None:
        return False  # no database: no message can wait
    try:
        return reader.active_waiting(conn, session_id)
    finally:
        conn.close()

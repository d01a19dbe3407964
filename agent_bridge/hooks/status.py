"""`agent-bridge hook status --agent HOST`: a host's plugin reports its session busy or idle.

opencode runs no UserPromptSubmit or Stop hook; its plugin (hosts.opencode_plugin) sees the
session's `session.status` events (`busy` while a turn runs, `idle` after it, an abort too) and
runs this with `{"session_id", "cwd", "status": "busy"|"idle"}` on stdin. The mark is the one the
UserPromptSubmit and Stop hooks keep for Claude Code and Codex (hooks.wake, read by
common.marks), so `peers`, `agent-bridge sessions` and the dashboard show the session's state.

Any failure: exit 0, one line in broker.log.
"""

from __future__ import annotations

from agent_bridge import hosts
from agent_bridge.common import jsonlimit, paths
from agent_bridge.hooks import common, wake

STATES = ("busy", "idle")


def main(agent: str) -> int:
    home = paths.home()
    try:
        host, chain = hosts.current_host()  # first: before anything in the chain detaches
        raw = common.read_raw()
        hook = common.parse_input(raw)
        data = jsonlimit.loads(raw)
        state = data.get("status") if isinstance(data, dict) else None
        if state not in STATES:
            raise common.HookInputError(f"status: expected one of {', '.join(STATES)}, got {state!r}")
        launched = wake.launch_stamp(host, chain)
        if state == "busy":
            wake.mark_busy(home, hook, launched)
        else:
            wake.mark_idle(home, hook, launched)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the host goes on
        common.log(home, f"status ({agent})", f"not marked: {type(exc).__name__}: {exc}")
    return 0

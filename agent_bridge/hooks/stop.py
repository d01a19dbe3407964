"""`agent-bridge hook stop --agent HOST` (SPEC §4.5, §3 "Reach" item 2).

When the session has unacknowledged **active** messages and the broker is up, answers with the
host's Stop output that hands them to the model (`Host.stop_output`: Claude Code from 2.1.163 takes
`hookSpecificOutput.additionalContext`, which continues the turn without an error label; before
that, and on Codex, the block decision `{"decision": "block", "reason": ...}`), the messages framed
as coming from another agent session (SPEC §3 "Framing"). Fetch, write, then acknowledge: see
`agent_bridge.hooks.handover`, shared with the PostToolUse hook. Passive messages (hop >= hop
limit, and every decision notification) never keep a session going. Otherwise, and on any
failure: exit 0 silently (one line in broker.log for a failure).

Host documentation: Claude Code "Hooks reference" (https://code.claude.com/docs/en/hooks#stop):
`decision: "block"` needs a `reason`, which Claude reads as its next instruction; the input's
`stop_hook_active` is true when the session already continues because of a Stop hook. Codex
"Hooks" (https://developers.openai.com/codex/hooks) and stop.command.output.schema.json: the same
`decision`/`reason` fields. `stop_hook_active` needs no special case here: what a Stop showed is
acknowledged, so a second Stop continues only for messages that arrived since.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent_bridge import hosts
from agent_bridge.common import paths, procinfo
from agent_bridge.hooks import common, handover

EVENT = "Stop"


def main(agent: str) -> int:
    home = paths.home()
    try:
        host, chain = hosts.current_host()  # first: before anything in the chain detaches
        raw = common.read_raw()
        hook = common.parse_input(raw)
        target = hosts.by_name(agent) or hosts.DEFAULT
        wrote = False

        def write(text: str) -> None:
            nonlocal wrote
            common.emit(target.stop_output(text, hook))
            wrote = True

        try:
            handover.hand_over(home, agent, EVENT, hook, host, chain, write)
        finally:
            arm_waiter(home, agent, hook, raw, host, chain, busy=wrote or target.prompt_queued(hook))
    except Exception as exc:  # noqa: BLE001 - whatever it is, the session must be able to stop
        common.log(home, f"stop ({agent})", f"no block: {type(exc).__name__}: {exc}")
    return 0


def arm_waiter(home: Path, agent: str, hook: common.HookInput, raw: bytes, host: procinfo.Proc | None,
               chain: list[procinfo.Proc], *, busy: bool, interrupted: bool = False) -> None:
    """The turn ended (a Stop, or an Interrupt): mark the session for its idle-wake waiter, and
    start the waiter where the host does not (Codex). `busy`: what the Stop handed over continues
    the turn, or a prompt typed meanwhile runs next (its UserPromptSubmit hook has already run),
    so the next Stop ends it. `interrupted`: the person cut the turn short (the session is idle,
    and the host may not take a wake then: `Host.wakes_after_interrupt`)."""
    target = hosts.by_name(agent) or hosts.DEFAULT
    if not ((hook.prompt_id or target.spawned_waiter) and target.runs_waiter(hook, os.environ)):
        return
    from agent_bridge.hooks import wake

    launched = wake.launch_stamp(host, chain)
    if busy:
        wake.mark_busy(home, hook, launched)
    else:
        wake.mark_idle(home, hook, launched, interrupted=interrupted)  # the waiter may hand over now
    if target.spawned_waiter:
        front = wake.front_of(host)
        if front is not None or not target.wakes_only_in_front(os.environ):
            wake.spawn(agent, raw, host, front)

"""`agent-bridge hook user-prompt-submit --agent HOST` (Claude Code): a turn starts.

Marks the session busy for its idle-wake waiter (`agent_bridge.hooks.wake`): while a turn runs,
a waiting message is the PostToolUse and Stop hooks' to hand over (as additionalContext, with no
error label), not the waiter's. The mark says when the host started this hook, so that a Stop
hook of the previous turn still running (Claude Code runs this hook for a prompt typed meanwhile)
does not mark the new turn idle. Its own Stop hook does. Prints nothing
(Claude Code would add UserPromptSubmit output to the model's context); writes one small file;
talks to nobody. Any failure: exit 0, one line in broker.log.

Host documentation: Claude Code "Hooks reference" (https://code.claude.com/docs/en/hooks#userpromptsubmit):
stdin `session_id`, `transcript_path`, `cwd`, `hook_event_name`, `prompt`; 2.1.332 adds `prompt_id`,
which in the TUI is the previous prompt's (seen), so it cannot name the turn.
"""

from __future__ import annotations

from agent_bridge import paths
from agent_bridge.hooks import common


def main(agent: str) -> int:
    home = paths.home()
    try:
        from agent_bridge import procinfo
        from agent_bridge.hooks import wake

        host, chain = procinfo.current_host()  # first: before anything in the chain detaches
        hook = common.read_input()
        wake.mark_busy(home, hook, wake.launch_stamp(host, chain))
    except Exception as exc:  # noqa: BLE001 - whatever it is, the prompt goes to the model
        common.log(home, f"user-prompt-submit ({agent})", f"not marked: {type(exc).__name__}: {exc}")
    return 0

"""`agent-bridge hook interrupt --agent HOST`: the person cut the running turn short (Esc).

Codex 0.171.0 runs its Interrupt hooks then, and no Stop hook (seen in its TUI): without this the
session would stay marked busy (so `peers` says) until the next prompt. So the session is marked
idle ("interrupted") and its waiter armed, as at a Stop that handed nothing over
(`agent_bridge.hooks.stop.arm_waiter`). Nothing is handed over here: the person just stopped the
turn. Codex 0.171.0 runs no turn for a message `codex queue` adds after an interruption (seen in
its TUI: queued, not run), so its waiter leaves such a session's messages to the next turn's hooks
(`Host.wakes_after_interrupt`) rather than acknowledge what nobody was shown.

Any failure: exit 0, one line in broker.log. Prints nothing.
"""

from __future__ import annotations

from agent_bridge import hosts
from agent_bridge.common import paths
from agent_bridge.hooks import common


def main(agent: str) -> int:
    home = paths.home()
    try:
        from agent_bridge.hooks import stop

        host, chain = hosts.current_host()  # first: before anything in the chain detaches
        raw = common.read_raw()
        hook = common.parse_input(raw)
        stop.arm_waiter(home, agent, hook, raw, host, chain, busy=False, interrupted=True)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the host goes on
        common.log(home, f"interrupt ({agent})", f"not marked idle: {type(exc).__name__}: {exc}")
    return 0

"""`agent-bridge hook ack --agent HOST`: acknowledge messages a host's plugin handed over.

For a host whose hook answers are read by a plugin inside the host (opencode,
hosts.opencode_plugin), the PostToolUse hook prints the messages with their ids and does not
acknowledge them (`Host.defers_ack`): the plugin adds the text to the tool's result, and once
the host has stored that result it runs this command with `{"session_id", "ids", "peer"}` on
stdin (SPEC §3, "What shown means": acknowledged after the host took it, never before). An
acknowledgement the broker cannot take now is left in the ledger for it (hooks.handover).

Any failure: exit 0, one line in broker.log; what was not acknowledged is offered again, marked
as a repeat.
"""

from __future__ import annotations

from agent_bridge.common import jsonlimit, paths
from agent_bridge.hooks import common, handover

EVENT = "ack"
IDS_MAX = 1000  # ids one acknowledgement may name (a hand-over names a few)
ID_MAX = 100  # characters of one message id (a uuid has 36)


def main(agent: str) -> int:
    home = paths.home()
    try:
        data = jsonlimit.loads(common.read_raw())
        if not isinstance(data, dict):
            raise common.HookInputError("ack input must be a JSON object")
        session_id, ids, peer = data.get("session_id"), data.get("ids"), data.get("peer")
        if not isinstance(session_id, str) or not 0 < len(session_id.strip()) <= common.SESSION_ID_MAX:
            raise common.HookInputError("ack input has no session_id string")
        if not isinstance(ids, list) or not 0 < len(ids) <= IDS_MAX or not all(
            isinstance(i, str) and 0 < len(i) <= ID_MAX for i in ids
        ):
            raise common.HookInputError(f"ack input: ids must be 1..{IDS_MAX} message id strings")
        peer_id = peer if isinstance(peer, str) else None
        handover.acknowledge(home, f"ack ({agent})", session_id.strip(), peer_id, ids)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the host goes on
        common.log(home, f"ack ({agent})", f"nothing acknowledged: {type(exc).__name__}: {exc}")
    return 0

"""Every op's handler, each in the module of its domain, registered with the broker's table
(broker.state: `session_op`, `control_op`) as its module loads; checked here against the
protocol's op table (ipc.protocol.OPS) when the broker loads: a handler missing or one too
many stops it. The sessions' connections import this module, so the broker they serve has them all."""

from __future__ import annotations

from agent_bridge.broker.ops import decisions as ops_decisions
from agent_bridge.broker.ops import hooks as ops_hooks
from agent_bridge.broker.ops import jobs, questions
from agent_bridge.broker.ops import messages as ops_messages
from agent_bridge.broker.ops import sessions as ops_sessions
from agent_bridge.broker.state import check_handlers

MODULES = (ops_messages, ops_decisions, ops_sessions, ops_hooks, questions, jobs)

check_handlers()

"""`agent-bridge up` with a stopwatch around the broker's request handler (benchmarks only).

`Broker.handle` is what the broker does for one request once its frame is read: argument
checks, the store transaction on the store's worker thread, waking delivery tasks. Its time
per op is the broker-side time; the `status` control request returns (and resets) it under
`benchTimings` as {op: [nanoseconds, ...]}. Everything else is the unmodified broker.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from agent_bridge.broker import state as broker_module

_timings: dict[str, list[int]] = {}
_handle = broker_module.Broker.handle
_status = broker_module.Broker.status


async def timed_handle(self: Any, session: Any, op: str, args: dict[str, Any]) -> Any:
    start = time.perf_counter_ns()
    try:
        return await _handle(self, session, op, args)
    finally:
        _timings.setdefault(op, []).append(time.perf_counter_ns() - start)


def status_with_timings(self: Any) -> dict[str, Any]:
    out = _status(self)
    out["benchTimings"] = {op: list(values) for op, values in _timings.items()}
    _timings.clear()
    return out


broker_module.Broker.handle = timed_handle  # type: ignore[method-assign]
broker_module.Broker.status = status_with_timings  # type: ignore[method-assign]

if __name__ == "__main__":
    from agent_bridge.cli.main import main

    sys.exit(main(["up"]))

"""waiters: 200 idle sessions each holding a wake waiter (`wait_active`, as `agent-bridge hook
wake` holds it) cost the broker at most 2 % of a core with no traffic, and one `send` wakes
exactly one of them (SPEC §3 "Reach", issue 33 "Waiters at scale").

A real broker (`agent-bridge up`), 200 sessions it knows by host session id (recorded in
bridge.db before it starts), one `wait_active` per session from threads over the real socket.
Measured: the broker's CPU over a quiet window with the waiters held, against the same window
with none held (the same-run baseline); then one `agent-bridge send` to one session: how many
waiters woke, and how many passes (each one query) the broker ran for it. --quick: 20 sessions,
a 1 s window.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c  # noqa: E402

TARGET_PCT = 2.0
SENDS = 100  # messages to a session without a waiter, with and without the others' waiters held
SETTLE = 3.0  # seconds after the broker is ready before anything is measured


def cpu_pct(pid: int, seconds: float) -> float:
    before, start = c.cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (c.cpu_seconds(pid) - before) / (time.monotonic() - start)


def main() -> None:
    from agent_bridge.common import paths
    from agent_bridge.ipc import blocking
    from agent_bridge.store.writer import Store

    args = c.parse_args(__doc__ or "")
    count, window = (20, 1.0) if args.quick else (200, 10.0)
    with c.temp_home() as home:
        env = c.bench_env(home)
        paths.ensure_home(home)
        store = Store.open(home / "bridge.db")
        sessions = [f"hs-bench-wait-{n}" for n in range(count)]
        for n, hsid in enumerate(sessions):
            store.create_peer(agent="claude", name=f"claude-w{n}", project="/w/bench", kind="interactive",
                              host_session_id=hsid, now=1)
        store.create_peer(agent="codex", name="codex-other", project="/w/bench", kind="interactive",
                          host_session_id="hs-bench-other", now=1)
        store.close()

        def send_cost() -> float:
            """The broker's CPU ms per message sent to a session that holds no waiter."""
            before = c.cpu_seconds(broker.pid)
            for n in range(SENDS):
                blocking.call(home, "send", to="codex-other", text=f"traffic {n}")
            return 1000 * (c.cpu_seconds(broker.pid) - before) / SENDS

        with c.BrokerProcess(home, env) as broker:
            # the broker loads the sessions' MCP side on a thread once sessions stop joining
            # (broker.root._preload_mcp): half a second of CPU that is not the waiters'
            time.sleep(SETTLE)
            idle = cpu_pct(broker.pid, window)  # nobody waits
            alone = send_cost()
            answers: dict[str, Any] = {}

            def wait(hsid: str) -> None:
                try:
                    answers[hsid] = blocking.call(home, "wait_active", timeout=90, hostSessionId=hsid,
                                                  timeoutMs=60_000)
                except (OSError, blocking.BrokerUnavailable) as exc:
                    answers[hsid] = type(exc).__name__

            threads = [threading.Thread(target=wait, args=(h,), daemon=True) for h in sessions]
            for t in threads:
                t.start()
            while blocking.call(home, "status")["waiters"] < count:
                time.sleep(0.05)
            held = cpu_pct(broker.pid, window)
            beside = send_cost()  # every commit: one pass for all the waiters
            before = blocking.call(home, "status")["waiterPasses"]
            target = sessions[count // 2]
            subprocess.run([*c.CLI, "send", target, "wake up"], env=env, check=True, capture_output=True)
            threads[count // 2].join(timeout=30)
            time.sleep(0.5)  # anything else woken would have answered by now
            woken = [h for h, a in answers.items() if a == {"active": True}]
            status = blocking.call(home, "status")
            passes = status["waiterPasses"] - before
    c.log(f"waiters: {count} held; broker {held:.2f} % of a core (none held: {idle:.2f} %); "
          f"one send woke {len(woken)} with {passes} pass(es); broker CPU per send {beside:.2f} ms with "
          f"them held, {alone:.2f} ms without")
    c.report(
        "waiters",
        value=held,
        unit=f"% of a core (broker CPU, {count} idle waiters held, no traffic)",
        baseline=TARGET_PCT,
        target=f"<= {TARGET_PCT} % of a core with {count} waiters; one send wakes exactly one",
        ok=held <= TARGET_PCT and woken == [target],
        n=count,
        p50=held,
        p99=held,
        quick=args.quick,
        details={"idle_pct_no_waiters": idle, "woken_by_one_send": len(woken), "passes_for_the_send": passes,
                 "still_held": status["waiters"], "window_s": window,
                 "send_cpu_ms_no_waiters": alone, "send_cpu_ms_with_waiters": beside},
    )


if __name__ == "__main__":
    main()

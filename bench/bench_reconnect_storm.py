"""reconnect_storm: 200 sessions reconnecting after a broker restart (SPEC §9).

200 sessions connect through the IPC client library (each with its own host session id, as
identified sessions do), and reconnect the way the relay does (`relay.connector.keep_connected`):
when the connection drops, look for the broker in broker.json and retry with the same backoff
(50 ms doubling to 2 s, `relay.keeper`), a backoff that ends early once broker.json is written
anew (`relay.connector.broker_looks`, a look every BROKER_LOOK; a tree without it sleeps the
backoff out). The broker (a real `agent-bridge up`) is then restarted: SIGTERM, wait for it to
exit, start a new one.

Measured per restart: from SIGTERM to the 200th session's `hello` being answered by the new
broker. Baseline, the same restart: from SIGTERM to the new broker answering `ping` (its own
stop and start, with nobody reconnecting yet counted). Target: all 200 reconnected within 2 s
(median over the restarts). Broker RSS with the 200 sessions connected is reported.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

TARGET_S = 2.0
BACKOFF_START, BACKOFF_MAX = 0.05, 2.0  # relay.keeper's, for a tree without that module


def read_backoff() -> tuple[float, float]:
    """The relay's own constants, so this follows the product if they change."""
    try:
        from agent_bridge.relay import keeper

        return keeper.BACKOFF_START, keeper.BACKOFF_MAX
    except ImportError:
        return BACKOFF_START, BACKOFF_MAX


def read_looks() -> Callable[[Path, float, Callable[[], float]], Iterator[float]] | None:
    """The relay's backoff that ends at a new broker.json (relay.connector.broker_looks), or
    None for a tree whose relay sleeps its backoff out."""
    try:
        from agent_bridge.relay import connector

        return connector.broker_looks
    except (ImportError, AttributeError):
        return None


async def drive(home: Path, broker: c.BrokerProcess, sessions: int, restarts: int) -> dict:
    import trio

    from agent_bridge.common import paths
    from agent_bridge.ipc.client import BrokerGone, open_bridge_client
    from agent_bridge.ipc.protocol import RemoteError

    backoff_start, backoff_max = read_backoff()
    looks = read_looks()
    connected_at: dict[int, int] = {}  # session -> when its latest hello was answered (ns)
    generation: dict[int, int] = {}  # session -> broker pid it is connected to
    changed = trio.Event()

    def broker_socket() -> tuple[int, str] | None:
        record = paths.read_broker_json(home)
        if not record or not isinstance(record.get("pid"), int) or not paths.pid_alive(record["pid"]):
            return None
        return record["pid"], record["socket"]

    async def session(i: int) -> None:
        nonlocal changed
        backoff = backoff_start
        while True:
            found = broker_socket()
            if found is not None:
                pid, sock = found
                try:
                    async with open_bridge_client(sock, c.hello("/bench/storm", i)) as (client, pushes):
                        connected_at[i], generation[i] = time.perf_counter_ns(), pid
                        changed.set()
                        changed = trio.Event()
                        backoff = backoff_start
                        async for _frame in pushes:
                            pass
                except (BrokerGone, RemoteError, OSError):
                    pass
            if looks is None:
                await trio.sleep(backoff)
            else:  # the relay's own pauses, slept by this task
                for pause in looks(home, backoff, trio.current_time):
                    await trio.sleep(pause)
            backoff = min(backoff * 2, backoff_max)

    async def all_on(pid: int) -> None:
        with trio.fail_after(60):
            while sum(1 for g in generation.values() if g == pid) < sessions:
                await changed.wait()

    storms: list[int] = []
    readies: list[int] = []
    rss = []
    async with trio.open_nursery() as nursery:
        for i in range(sessions):
            nursery.start_soon(session, i)
        await all_on(broker.pid)
        for _ in range(restarts):
            await trio.sleep(0.3)  # let the broker settle (every delivery task idle)
            rss.append(broker.rss_mb())
            start = time.perf_counter_ns()
            await trio.to_thread.run_sync(broker.stop)
            broker.spawn()
            await trio.to_thread.run_sync(broker.wait_ready)
            readies.append(time.perf_counter_ns() - start)
            await all_on(broker.pid)
            storms.append(max(connected_at.values()) - start)
        rss.append(broker.rss_mb())
        nursery.cancel_scope.cancel()
    return {"storms": storms, "readies": readies, "rss": rss}


def main() -> None:
    args = c.parse_args(__doc__ or "")
    sessions, restarts = (10, 2) if args.quick else (200, 7)
    import trio

    with c.temp_home() as home:
        env = c.bench_env(home)
        broker = c.BrokerProcess(home, env)
        broker.start()
        try:
            c.log(f"reconnect_storm: {sessions} sessions, {restarts} restarts")
            out = trio.run(drive, home, broker, sessions, restarts)
        finally:
            broker.stop()
    value = c.median(out["storms"]) / 1e9
    base = c.median(out["readies"]) / 1e9
    c.report(
        "reconnect_storm",
        value=value,
        unit="s (broker SIGTERM → all sessions connected to the new broker, median)",
        baseline=base,
        target=f"value <= {TARGET_S:g} s (baseline: SIGTERM → new broker answering ping)",
        ok=value <= TARGET_S,
        n=len(out["storms"]),
        p50=value,
        p99=c.percentile(out["storms"], 99) / 1e9,
        quick=args.quick,
        details={
            "sessions": sessions,
            "broker_rss_mb": max(out["rss"]),
            "reconnect_after_ready_s": c.median(
                [s - r for s, r in zip(out["storms"], out["readies"], strict=True)]
            )
            / 1e9,
        },
    )


if __name__ == "__main__":
    main()

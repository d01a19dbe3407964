"""instructions: the broker's instructions per message, counted by valgrind's callgrind (a
reading the machine's load barely moves), for this tree against a base revision.

    python bench/instructions.py [--base REV] [--path broker|relay] [--runs N] [--rounds N] [--per-round N]

Needs `valgrind` (Debian's package; not part of CI). Each run starts a broker of one tree under
callgrind with counting off, connects the sessions of the path (`broker`: two bridge-protocol
sessions, the sender with WINDOW sends in flight and the receiver acknowledging what it holds, as
bench_message_throughput's broker-only rounds; `relay`: two real `agent-bridge mcp` relays, its
relay rounds), runs one warm-up round, waits SETTLE seconds (the broker's MCP side imports on a
thread after its start, slowly under callgrind), then counts the measured rounds alone
(`callgrind_control -i on`, then a dump at their end), one count per thread. Runs alternate
between the trees, each a child process with `PYTHONPATH=<tree>` (bench/compare.py's worktree and
venv view), so the client library is the tree's own, as in compare.py.

Prints one JSON line: for each tree the median over its runs of the event loop's thread
(`loop`, the first thread) and of the whole process (`all`), in instructions per message, and
`ratio` (current / base, lower is better) for both.

Why: on a shared 2-core machine a same-run rate moves 20 % between rounds of one tree (stop 57
read 5,090 to 9,948 messages/s within one bench run); a count of instructions moves about 2 %.
What it does not see: time spent waiting (a thread's wake-ups, fsyncs) and the cost of an
instruction (a cache miss counts as one). Under callgrind the broker runs ~50 times slower, so
more sends arrive per commit than natively, and work paced by the clock (the search indexer, the
owner's alerts) falls on fewer messages: compare the loop's count across trees, and read the
other threads' with that in mind (docs/performance.md, stop 57).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

WINDOW = 16  # sends in flight, as bench_message_throughput
TEXT = "status: build green on main, 42 tests added; next I take the migration review. " * 2
SETTLE = 40.0  # seconds between the warm-up round and the counted ones
RUN_TIMEOUT = 1800  # seconds one run may take


def callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def counts(folder: Path, pid: int) -> list[int]:
    """The instructions each thread executed while counting, in the threads' order."""
    out = []
    for dump in sorted(folder.glob(f"cg.{pid}.1-*")):  # the first dump, one file per thread
        for line in dump.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(("totals:", "summary:")):
                out.append(int(line.split()[1]))
                break
    return out


async def broker_path(socket: str, rounds: int, per_round: int, count: Any) -> None:
    """bench_message_throughput's broker-only windowed rounds: the first uncounted."""
    import bench_message_throughput as b
    import trio

    from agent_bridge.ipc.client import open_bridge_client

    acked: set[str] = set()
    progress = trio.Event()

    def on_acked(ids: list[str]) -> None:
        nonlocal progress
        acked.update(ids)
        progress.set()
        progress = trio.Event()

    async def receiver(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with open_bridge_client(socket, c.hello("/bench/receiver", 1)) as (client, pushes):
            task_status.started(client)
            await b.acknowledge(client, pushes, on_acked)

    async with trio.open_nursery() as nursery:
        to = (await nursery.start(receiver)).hello["session"]["name"]
        async with open_bridge_client(socket, c.hello("/bench/sender", 2)) as (sender, _):
            async def one(sent: list[str], slots: trio.Semaphore) -> None:
                try:
                    sent.append((await sender.request("send", to=to, text=TEXT))["message"]["id"])
                finally:
                    slots.release()

            for r in range(rounds + 1):
                if r == 1:
                    count("on")
                sent: list[str] = []
                slots = trio.Semaphore(WINDOW)
                async with trio.open_nursery() as senders:
                    for _ in range(per_round):
                        await slots.acquire()
                        senders.start_soon(one, sent, slots)
                with trio.fail_after(600):
                    while not acked.issuperset(sent):
                        await progress.wait()
            count("off")
        nursery.cancel_scope.cancel()


async def relay_path(env: dict[str, str], rounds: int, per_round: int, count: Any) -> None:
    """bench_message_throughput's relay rounds (two relays, WINDOW sends in flight): the first
    uncounted."""
    import bench_message_throughput as b
    import trio

    async with c.open_relay(env, "bench-sender", b.PROJECT) as sender, \
            c.open_relay(env, "bench-receiver", b.PROJECT) as receiver:
        path = b.RelayPath(sender, receiver, "bench-receiver")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(path.receive)
            for r in range(rounds + 1):
                if r == 1:
                    count("on")
                await path.round(per_round, WINDOW)
            await trio.sleep(1.0)  # the acknowledgements of the last round, recorded after their grace
            count("off")
            nursery.cancel_scope.cancel()


def one_run(path: str, rounds: int, per_round: int, settle: float) -> dict[str, Any]:
    """In a child process whose agent_bridge is the tree's: one broker under callgrind."""
    import trio

    with c.temp_home() as home:
        dumps = home.parent / "callgrind"
        dumps.mkdir()
        env = c.bench_env(home)
        command = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--instr-atstart=no",
                   f"--callgrind-out-file={dumps}/cg.%p", c.PYTHON, "-m", "agent_bridge", "up"]
        with c.BrokerProcess(home, env, command) as broker:
            record = broker.wait_ready(timeout=600)
            warmed = False

            def count(state: str) -> None:
                nonlocal warmed
                if state == "on":
                    time.sleep(settle)  # the loop waits too: nothing runs meanwhile
                    callgrind_control("-i", "on", str(broker.pid))
                    warmed = True
                else:
                    callgrind_control("-d", str(broker.pid))
                    callgrind_control("-i", "off", str(broker.pid))

            if path == "broker":
                trio.run(broker_path, record["socket"], rounds, per_round, count)
            else:
                trio.run(relay_path, env, rounds, per_round, count)
            assert warmed
            threads = counts(dumps, broker.pid)
    messages = rounds * per_round
    return {"loop": threads[0] / messages, "all": sum(threads) / messages,
            "threads": [t / messages for t in threads]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default="8cd758e")
    parser.add_argument("--path", choices=("broker", "relay"), default="broker")
    parser.add_argument("--runs", type=int, default=2, help="runs of each tree, alternating")
    parser.add_argument("--rounds", type=int, default=2, help="counted rounds of each run")
    parser.add_argument("--per-round", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=SETTLE)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.path, args.rounds, args.per_round, args.settle)))
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("instructions: needs valgrind (apt install valgrind)")
    import compare

    readings: dict[str, list[dict[str, Any]]] = {"base": [], "current": []}
    with compare.worktree(args.base) as base_tree, tempfile.TemporaryDirectory(prefix="abins-") as scratch:
        python = compare.interpreter(Path(scratch))
        trees = {"base": base_tree, "current": compare.CURRENT}
        for run in range(args.runs):
            for side in ("base", "current") if run % 2 == 0 else ("current", "base"):
                c.log(f"instructions run {run + 1}/{args.runs}: {side}")
                env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
                env["PYTHONPATH"] = str(trees[side])
                done = subprocess.run(
                    [str(python), __file__, "--one", "--path", args.path, "--rounds", str(args.rounds),
                     "--per-round", str(args.per_round), "--settle", str(args.settle)],
                    env=env, cwd=scratch, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                )
                if done.returncode != 0:
                    raise SystemExit(f"instructions: a run of {side} failed:\n{done.stderr[-3000:]}")
                readings[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    out: dict[str, Any] = {"bench": f"instructions:{args.path}", "unit": "instructions per message",
                           "better": "lower", "base_rev": args.base}
    for key in ("loop", "all"):
        base = statistics.median(r[key] for r in readings["base"])
        current = statistics.median(r[key] for r in readings["current"])
        out[key] = {"base": round(base), "current": round(current), "ratio": round(current / base, 4),
                    "runs": {side: [round(r[key]) for r in rs] for side, rs in readings.items()}}
    out["threads"] = {side: [[round(t) for t in r["threads"]] for r in rs] for side, rs in readings.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""decide_fanout: broker-side time per `decide` with 50 connected sessions in scope (SPEC §9).

A real broker process (bench/_timed_broker.py: `agent-bridge up` with a stopwatch around the
request handler) and 50 sessions connected through the IPC client library, all in one project;
one of them decides. Every session acknowledges its notification as it arrives, and the next
decide starts only when all 50 are acknowledged, so each decide meets an idle broker.

Baseline, interleaved with the decides: a bare APSW transaction writing the same rows (1
decision, 50 messages, 50 receipts, 50 decision_deliveries) into a database of the same schema
and settings, ids made beforehand: the SQLite floor. Target: broker time ≤ 3× the baseline
(medians). The client round trip through IPC is reported too (p50/p99).
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

TARGET_RATIO = 3.0
TEXT = "Use PostgreSQL 16 for every service; keep migrations in plain SQL, reviewed by the owner."


class BareBaseline:
    """The same rows as one decide, written by hand in one APSW transaction."""

    def __init__(self, path: Path, sessions: int) -> None:
        import apsw

        from agent_bridge.store.migration import migrate
        from agent_bridge.store.opening import apply_bestpractice

        apply_bestpractice()
        self.conn = apsw.Connection(str(path))
        self.conn.execute("PRAGMA synchronous = NORMAL")
        migrate(self.conn)
        self.peers = [str(uuid.uuid4()) for _ in range(sessions)]
        with self.conn:
            self.conn.executemany(
                "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, "
                "host_session_id) "
                "VALUES (?, ?, 'claude', '/bench/project', 'interactive', 1, 1, ?)",
                [(p, f"claude-project-{i}", f"bench-host-{i}") for i, p in enumerate(self.peers)],
            )
        self.i = 0

    def run(self) -> int:
        """One transaction; returns its duration in ns."""
        conn, peers = self.conn, self.peers
        self.i += 1
        decision_id = str(uuid.uuid4())
        message_ids = [str(uuid.uuid4()) for _ in peers]
        topic = f"topic-{self.i % 20}"
        body = f"Pinned owner decision for {{\"project\":\"/bench/project\"}}: {topic}: {TEXT}"
        now = int(time.time() * 1000)
        start = time.perf_counter_ns()
        with conn:
            conn.execute(
                "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, scope_project, "
                "author_id, "
                "author_name, author_agent, created_at, source_message_id, supersedes) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    decision_id,
                    topic,
                    TEXT,
                    TEXT.lower(),
                    '{"project":"/bench/project"}',
                    "project",
                    "/bench/project",
                    peers[0],
                    "claude-project-0",
                    "claude",
                    now,
                    None,
                    None,
                ),
            )
            conn.executemany(
                "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
                "VALUES (?, ?, ?, ?, 100, NULL, ?)",
                [(m, peers[0], p, body, now) for m, p in zip(message_ids, peers, strict=True)],
            )
            conn.executemany(
                "INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)",
                list(zip(message_ids, peers, strict=True)),
            )
            conn.executemany(
                "INSERT INTO decision_deliveries(decision_id, host_key, peer_id, message_id, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                [
                    (decision_id, f"bench-host-{i}", p, m, now)
                    for i, (m, p) in enumerate(zip(message_ids, peers, strict=True))
                ],
            )
        return time.perf_counter_ns() - start

    def close(self) -> None:
        self.conn.close()


async def drive(socket_path: str, sessions: int, decides: int, warmup: int, baseline: BareBaseline) -> dict:
    import trio

    from agent_bridge.ipc.client import open_bridge_client

    project = "/bench/project"
    acked = 0
    progress = trio.Event()
    rtts: list[int] = []
    bases: list[int] = []
    delivered_counts: list[int] = []

    async def session(i: int, ready: trio.Event, task_status=trio.TASK_STATUS_IGNORED) -> None:
        nonlocal acked, progress
        async with open_bridge_client(socket_path, c.hello(project, i)) as (client, pushes):
            task_status.started(client)
            async for frame in pushes:
                if frame.get("push") == "message":
                    await client.request("ack", ids=[frame["message"]["id"]])
                    acked += 1
                    progress.set()
                    progress = trio.Event()

    async with trio.open_nursery() as nursery:
        clients = []
        for i in range(sessions):
            clients.append(await nursery.start(session, i, trio.Event()))
        decider = clients[0]
        expected = 0
        for i in range(warmup + decides):
            start = time.perf_counter_ns()
            answer = await decider.request("decide", topic=f"topic-{i % 20}", text=TEXT)
            rtt = time.perf_counter_ns() - start
            expected += sessions
            delivered_counts.append(len(answer["deliveredTo"]))
            with trio.fail_after(60):
                while acked < expected:
                    await progress.wait()
            base = baseline.run()  # interleaved: one bare transaction after every decide
            if i >= warmup:
                rtts.append(rtt)
                bases.append(base)
        nursery.cancel_scope.cancel()
    return {"rtts": rtts, "bases": bases, "delivered": delivered_counts}


def main() -> None:
    args = c.parse_args(__doc__ or "")
    sessions, decides, warmup = (5, 5, 1) if args.quick else (50, 150, 15)
    import trio

    from agent_bridge.ipc import blocking

    with c.temp_home() as home:
        env = c.bench_env(home)
        broker = c.BrokerProcess(home, env, [c.PYTHON, str(c.BENCH_DIR / "_timed_broker.py")])
        baseline = BareBaseline(home.parent / "baseline.db", sessions)
        with broker:
            record = broker.wait_ready()
            blocking.call(home, "status")  # resets the broker's timings
            c.log(f"decide_fanout: {sessions} sessions, {decides} decides")
            out = trio.run(drive, record["socket"], sessions, decides, warmup, baseline)
            timings = blocking.call(home, "status")["benchTimings"]
        baseline.close()
    broker_ns = timings.get("decide", [])[warmup:]
    assert len(broker_ns) == decides, (len(broker_ns), decides)
    assert all(d == sessions for d in out["delivered"]), "every decide reaches every session"
    value = c.ms(c.median(broker_ns))
    base = c.ms(c.median(out["bases"]))
    ratio = value / base
    c.report(
        "decide_fanout",
        value=value,
        unit="ms (broker-side, median)",
        baseline=base,
        target=f"ratio <= {TARGET_RATIO:g} (broker time per decide / bare APSW transaction of the same rows)",
        ok=ratio <= TARGET_RATIO,
        n=len(broker_ns),
        p50=value,
        p99=c.ms(c.percentile(broker_ns, 99)),
        quick=args.quick,
        details={
            "sessions": sessions,
            "baseline_p99_ms": c.ms(c.percentile(out["bases"], 99)),
            "rtt_p50_ms": c.ms(c.percentile(out["rtts"], 50)),
            "rtt_p99_ms": c.ms(c.percentile(out["rtts"], 99)),
            "ack_p50_ms": c.ms(c.percentile(timings.get("ack", []), 50)),
        },
    )


if __name__ == "__main__":
    main()

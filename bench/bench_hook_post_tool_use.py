"""hook_post_tool_use: wall time of the PostToolUse hook with nothing waiting, as `install`
registers it for the user (`python -I -S .../agent_bridge/hooks/quick.py post-tool-use`, whose
first look is the broker's post box, broker.feeds.postbox) (SPEC §3 "Reach" item 1, §9).

The hook runs after every tool call, so what it costs when no active message waits is what every
session pays all day. It runs as the hosts run it: the installed `agent-bridge` script, a
PostToolUse input on stdin (a tool response of a few kilobytes), against a bridge.db holding 200
sessions and 10,000 messages, the measured session's among them all acknowledged but for 20
passive decision notices (the check must pass over them without asking the broker). A broker runs
(the common case); the hook must not contact it, which the benchmark checks: with the broker
stopped, no identity report is left behind.

Baseline, interleaved run for run: `python3 -I -S -c pass` with the same interpreter.
Target: hook wall time <= 1.3x the baseline (medians). The hook must not import trio, mcp, quart or
hypercorn (checked with -X importtime). Also reported: the whole hook, `agent-bridge hook
post-tool-use` (what a project's files name), which reads bridge.db instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402
from bench_hook_session_start import heavy_imports_of, run  # noqa: E402

TARGET_RATIO = 1.3
BASELINE = [c.PYTHON, "-I", "-S", "-c", "pass"]
SESSION = "bench-post-tool-use"


def build(db: Path, sessions: int, messages: int) -> str:
    """The measured session's project folder, after filling the database."""
    from agent_bridge.common import domain
    from agent_bridge.store.messages import Outgoing
    from agent_bridge.store.writer import Store

    store = Store.open(db)
    try:
        peers = [
            store.create_peer(
                agent="claude",
                name=f"claude-p{i}",
                project=f"/work/p{i}",
                kind="interactive",
                host_session_id=SESSION if i == 0 else f"hs-{i}",
                now=1,
            )
            for i in range(sessions)
        ]
        sender = peers[-1]
        per_batch = 500
        for start in range(0, messages, per_batch):
            batch = [
                Outgoing(peers[(start + k) % sessions].id, f"message {start + k}", 1, None)
                for k in range(per_batch)
            ]
            sent = store.send_messages(sender.id, batch, now=2 + start)
            by_peer: dict[str, list[str]] = {}
            for m in sent:
                by_peer.setdefault(m.to_id, []).append(m.id)
            for peer_id, ids in by_peer.items():
                store.ack(peer_id, ids, now=3 + start)
        for k in range(20):  # passive notices: unacknowledged, never handed over
            store.send_messages(
                sender.id, [Outgoing(peers[0].id, f"notice {k}", domain.HOP_MAX, None)], now=10**6 + k
            )
    finally:
        store.close()
    return peers[0].project


def main() -> None:
    args = c.parse_args(__doc__ or "")
    sessions, messages, runs = (10, 200, 3) if args.quick else (200, 10_000, 25)
    with c.temp_home() as home:
        home.mkdir(parents=True, mode=0o700)
        project = build(home / "bridge.db", sessions, messages)
        cwd = home.parent
        env = c.bench_env(home)
        stdin = json.dumps(
            {
                "session_id": SESSION,
                "transcript_path": None,
                "cwd": project,
                "hook_event_name": "PostToolUse",
                "tool_name": "Bash",
                "tool_input": {"command": "ls -la"},
                "tool_response": {"stdout": "x" * 4000, "stderr": "", "interrupted": False},
                "tool_use_id": "toolu_1",
            }
        ).encode()
        import shlex

        from agent_bridge.hosts.edits import hook_command

        whole = [*c.CLI, "hook", "post-tool-use", "--agent", "claude"]
        hook = shlex.split(hook_command([str(Path(c.CLI[0]).absolute())], "post-tool-use", "claude", {}))
        assert "quick.py" in " ".join(hook), hook

        _, out, err = run(hook, env, stdin, cwd)
        assert out == b"" and err == b"", (out, err)
        assert not (home / "reports").exists(), "the hook went past its read-only check"
        heavy = heavy_imports_of(hook, env, stdin, cwd)

        times: list[int] = []
        base: list[int] = []
        whole_times: list[int] = []
        with c.BrokerProcess(home, env):
            assert (home / "pending" / "ready").exists(), "the broker keeps no post box"
            run(hook, env, stdin, cwd)  # warm the file cache
            for _ in range(runs):
                times.append(run(hook, env, stdin, cwd)[0])
                base.append(run(BASELINE, env, b"", cwd)[0])
                whole_times.append(run(whole, env, stdin, cwd)[0])
        c.log(f"hook_post_tool_use: {sessions} sessions, {messages} messages, {runs} runs")
    value, baseline = c.median(times), c.median(base)
    c.report(
        "hook_post_tool_use",
        value=c.ms(value),
        unit="ms (wall time, median, nothing waiting)",
        baseline=c.ms(baseline),
        target=f"ratio <= {TARGET_RATIO:g} (hook / python3 -I -S -c pass), no trio/mcp/quart/hypercorn "
               f"import",
        ok=value / baseline <= TARGET_RATIO and not heavy,
        n=len(times),
        p50=c.ms(c.percentile(times, 50)),
        p99=c.ms(c.percentile(times, 99)),
        quick=args.quick,
        details={
            "sessions": sessions,
            "messages": messages,
            "heavy_imports": ",".join(heavy) or "none",
            "whole_hook_ms": c.ms(c.median(whole_times)),
            "whole_hook_ratio": round(c.median(whole_times) / baseline, 2),
        },
    )


if __name__ == "__main__":
    main()

"""job_start: from a `delegate` call to the job's first model request, as a ratio to the bare host
CLI started the same way without the bridge (SPEC §9 "Delegation"; issue 32).

Real Claude Code and Codex CLIs (tests/hosts/clis.py pins them) against the scripted model
servers of tests/hosts, offline, in one world whose HOME has no bridge installed (a job gets the
bridge on its command line, whatever install did). Per host, n runs each (5; 1 with --quick),
interleaved so that both sides see the same machine:

- bare: `codex exec --json …` / `claude -p --output-format stream-json …` with the job's own
  access flags, the same task on stdin, spawned here; timed from the spawn to its first request.
- job: `delegate(agent, task)` through a raw `agent-bridge mcp` session; timed from writing the
  call to the job's first request. That includes the tool call, the broker's checks, the job's
  MCP server and hooks (Claude Code waits for its MCP servers before the first request).

The request's time is taken by the model server as it arrives. `value` is the larger of the two
hosts' ratios of medians; the target is <= 1.2. Wall-clock on a shared machine: a benchmark,
never a test.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common as c  # noqa: E402

from agent_bridge.hosts.claude import READ_DENIED  # noqa: E402
from tests.hosts import clis  # noqa: E402
from tests.hosts.conftest import CLAUDE_OFFLINE_ENV, World, open_world, plan, poll_until  # noqa: E402
from tests.hosts.models import ModelServer  # noqa: E402

TARGET = 1.2


def first_request_after(model: ModelServer, known: int) -> float:
    """When the first request after the `known` ones arrived (monotonic seconds)."""
    poll_until(lambda: len(model.requests) > known, "the first model request", timeout=120)
    with model.lock:
        return model.requests[known].at


def bare(world: World, agent: str, task: str) -> float:
    if agent == "codex":
        model: ModelServer = world.codex_model
        argv = [str(world.host_bin / "codex"), "exec", "--json", "--skip-git-repo-check",
                "-c", 'sandbox_mode="read-only"', "-c", 'approval_policy="never"', "-"]
        env = {**world.base_env(), "CODEX_HOME": str(world.codex_home), "FAKE_MODEL_KEY": "test-key"}
    else:
        model = world.claude_model
        argv = [str(world.host_bin / "claude"), "-p", "--output-format", "stream-json", "--verbose",
                "--strict-mcp-config", "--disallowedTools", *READ_DENIED, "--permission-mode", "default",
                "--session-id", str(uuid.uuid4())]
        env = {**world.base_env(), **CLAUDE_OFFLINE_ENV, "ANTHROPIC_BASE_URL": model.url,
               "MCP_CONNECTION_NONBLOCKING": "0", "CLAUDE_CODE_TMPDIR": str(world.root / "tmp")}
    with model.lock:
        known = len(model.requests)
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=world.project, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None
    proc.stdin.write(task.encode("utf-8"))
    proc.stdin.close()
    took = first_request_after(model, known) - started
    proc.wait(timeout=120)
    return took


def job(world: World, session: c.McpSession, agent: str, task: str) -> float:
    model = world.codex_model if agent == "codex" else world.claude_model
    with model.lock:
        known = len(model.requests)
    started = time.monotonic()
    answer = session.tool("delegate", agent=agent, task=task)
    took = first_request_after(model, known) - started
    job_id = answer["job"]["id"]
    poll_until(lambda: session.tool("job", id=job_id)["job"]["state"] == "finished", "the job's end",
               timeout=120)
    return took


def main() -> None:
    args = c.parse_args(__doc__ or "")
    runs = 1 if args.quick else 5
    try:
        host_bin = clis.ensure()
    except clis.Missing as exc:  # one JSON line all the same, saying why nothing was measured
        c.report("job_start", value=0.0, unit="ratio", baseline=TARGET, target="real host CLIs needed",
                 ok=False, n=0, p50=0.0, p99=0.0, quick=args.quick, details={"missing": str(exc)})
        return
    times: dict[str, dict[str, list[float]]] = {a: {"bare": [], "job": []} for a in ("codex", "claude")}
    with open_world(host_bin) as world:
        world.bridge("uninstall", "--claude", "--codex")
        world.restart_broker(world.job_env())
        env = {**world.base_env(), "AGENT_BRIDGE_HOME": str(world.bridge_home)}
        session = c.McpSession(env, f"bench-{uuid.uuid4().hex[:6]}", str(world.project))
        try:
            for i in range(runs + 1):  # the first round warms the hosts' caches; not counted
                for agent in ("codex", "claude"):
                    task = plan() + f" bench {agent} {i}"
                    pair = (bare(world, agent, task), job(world, session, agent, task))
                    if i:
                        times[agent]["bare"].append(pair[0])
                        times[agent]["job"].append(pair[1])
        finally:
            session.close()
    ratios = {a: c.median(t["job"]) / c.median(t["bare"]) for a, t in times.items()}
    value = max(ratios.values())
    c.log(f"job_start: {runs} runs per host")
    job_ms = [t * 1000 for a in times for t in times[a]["job"]]
    c.report(
        "job_start",
        value=value,
        unit="ratio (delegate -> job's first model request) / (bare CLI spawn -> first request), worse host",
        baseline=TARGET,
        target=f"<= {TARGET} on each host",
        ok=value <= TARGET,
        n=runs,
        p50=c.median(job_ms),
        p99=c.percentile(job_ms, 99),
        quick=args.quick,
        details={
            "claude_version": clis.CLAUDE_VERSION,
            "codex_version": clis.CODEX_VERSION,
            **{f"{a}_ratio": r for a, r in ratios.items()},
            **{f"{a}_{side}_p50_ms": c.median(t[side]) * 1000 for a, t in times.items() for side in t},
        },
    )


if __name__ == "__main__":
    main()

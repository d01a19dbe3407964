"""context_cost: what an agent pays in context for agent-bridge (SPEC §9).

1. The `tools/list` result of a real `agent-bridge mcp` process (all tools, their descriptions
   and input schemas), read as raw JSON-RPC from its stdout and measured as compact UTF-8 JSON
   bytes: what a host puts into the model's context at every session start. Budget 3,200 bytes
   for every tool (SPEC §9).
2. The SessionStart note of a real `agent-bridge hook session-start` run for a known session in a
   project with five long decisions (4,000-character texts, so every line is cut at 160
   characters): its `additionalContext` in UTF-8 bytes. Budget 1,200 bytes: the five decision lines
   SPEC §4.5 allows (about 900 bytes here), the identity, the sentence naming the bridge's tools
   for the host (SPEC §4.5, about 160 bytes) and the "more" line.

Sizes are deterministic, so the baseline is the budget itself: ratio = tools/list bytes / 3,200
(≤ 1 passes); the note's bytes and ratio are in `details`. `ok` needs both within budget.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

TOOLS_BUDGET = 3200  # every tool (SPEC §9)
NOTE_BUDGET = 1200
PROJECT = "/home/dev/src/game-client"
LONG_DECISIONS = [
    ("camera", "Hold the right mouse button to look around; releasing it returns the cursor. "),
    ("database", "PostgreSQL 16 for every service, one schema per service, migrations in plain SQL. "),
    ("release branch", "Release from main only, tagged vX.Y.Z after the full test suite passes in CI. "),
    (
        "error reporting",
        "Errors go to the structured log and to Sentry, never to stdout; no PII in messages. ",
    ),
    ("input remapping", "Every action is remappable from the settings screen, saved per user profile. "),
]


def compact(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def tools_list(env: dict[str, str], cwd: Path) -> dict:
    """initialize + tools/list as raw JSON-RPC over stdio: the result exactly as sent."""
    proc = subprocess.Popen(
        [*c.CLI, "mcp", "--agent", "claude", "--project", PROJECT],
        env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def rpc(obj: dict) -> dict | None:
        proc.stdin.write(compact(obj) + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        if "id" not in obj:
            return None
        while True:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise RuntimeError("agent-bridge mcp closed stdout")
            msg = json.loads(line)
            if msg.get("id") == obj["id"]:
                return msg

    try:
        rpc(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "1"},
                },
            }
        )
        rpc({"jsonrpc": "2.0", "method": "notifications/initialized"})
        answer = rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert answer is not None and "result" in answer, answer
    return answer["result"]


def note(home: Path, env: dict[str, str], cwd: Path) -> str:
    from agent_bridge.common import domain, paths
    from agent_bridge.common.domain import SessionView
    from agent_bridge.store.writer import Store

    paths.ensure_home(home)
    store = Store.open(paths.db_path(home))
    try:
        peer = store.create_peer(
            agent="claude",
            name="claude-game-client",
            project=PROJECT,
            kind="interactive",
            host_session_id="bench-note-session",
            now=1,
        )
        view = SessionView(peer.id, peer.name, PROJECT, "bench-note-session")
        for i, (topic, text) in enumerate(LONG_DECISIONS):
            long_text = (text * (domain.TEXT_MAX // len(text) + 1))[: domain.TEXT_MAX].strip()
            store.record_decision(
                author=view,
                author_agent="claude",
                topic=topic,
                text=long_text,
                scope={"project": PROJECT},
                source_message_id=None,
                recipients=[],
                now=1000 + i,
            )
    finally:
        store.close()
    stdin = compact({"session_id": "bench-note-session", "cwd": PROJECT, "hook_event_name": "SessionStart",
                     "source": "startup", "transcript_path": None})
    proc = subprocess.run([*c.CLI, "hook", "session-start", "--agent", "claude"], env=env, input=stdin,
                          capture_output=True, cwd=cwd, timeout=60, check=True)
    return json.loads(proc.stdout)["hookSpecificOutput"]["additionalContext"]


def main() -> None:
    args = c.parse_args(__doc__ or "")
    with c.temp_home() as home:
        env = c.bench_env(home)
        cwd = home.parent
        note_text = note(home, env, cwd)
        with c.BrokerProcess(home, env):
            result = tools_list(env, cwd)
    tools_bytes = len(compact(result))
    note_bytes = len(note_text.encode("utf-8"))
    per_tool = {
        f"{t['name']}_bytes": len(compact(t)) for t in result.get("tools", [])
    }
    descriptions = sum(len((t.get("description") or "").encode()) for t in result.get("tools", []))
    c.report(
        "context_cost",
        value=tools_bytes,
        unit="bytes (tools/list result, compact JSON)",
        baseline=TOOLS_BUDGET,
        target=f"tools/list <= {TOOLS_BUDGET} bytes and SessionStart note (5 long decisions) <= "
               f"{NOTE_BUDGET} bytes",
        ok=tools_bytes <= TOOLS_BUDGET and note_bytes <= NOTE_BUDGET,
        n=1,
        p50=tools_bytes,
        p99=tools_bytes,
        quick=args.quick,
        details={
            "note_bytes": note_bytes,
            "note_ratio": note_bytes / NOTE_BUDGET,
            "tools": len(result.get("tools", [])),
            "description_bytes": descriptions,
            **per_tool,
        },
    )


if __name__ == "__main__":
    main()

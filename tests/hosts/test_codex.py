"""Real Codex sessions (`codex exec`, `codex exec resume`) on the bridge, as the model saw them."""

from __future__ import annotations

import json
import re

import pytest

from tests.hosts.conftest import BRIDGE_TOOLS, HostRun, World, codex_messages, codex_outputs, plan

pytestmark = pytest.mark.slow

# What `codex exec` reports about the bridge's MCP server or hooks that must never appear.
CODEX_BAD = re.compile(r"deprecated|agent.bridge|agent_bridge|hook|mcp|traceback", re.I)
# Reported on every run, about the test setup itself: the one-run hook trust these tests pass
# on the command line, the scripted model's unknown name, PATH helpers refused under /tmp.
DEPRECATED = "is deprecated"
CODEX_SETUP_LINES = ("--dangerously-bypass-hook-trust", "Model metadata for", "could not create PATH aliases",
                     "Reading additional input from stdin")


def thread_of(run: HostRun) -> str:
    return next(e["thread_id"] for e in run.events if e.get("type") == "thread.started")


def codex_complaints(run: HostRun) -> list[str]:
    """Error items of the JSON event stream and stderr lines that mention the bridge, its
    hooks or its MCP server (the setup's own lines aside)."""
    lines = [str(e["item"].get("message")) for e in run.events
             if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "error"]
    lines += run.err.splitlines()
    return [line for line in lines if CODEX_BAD.search(line) and not any(s in line for s in CODEX_SETUP_LINES)]


def namespace_tools(body: dict) -> set[str]:
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and tool.get("name") == "mcp__agent_bridge":
            return {t.get("name") for t in tool.get("tools") or ()}
    return set()


def test_note_tools_and_thread_id(world: World) -> None:
    """The SessionStart note is a developer message; the six tools arrive as the
    `mcp__agent_bridge` namespace and work; the bridge knows the session by Codex's thread id."""
    run = world.codex(plan(("whoami", {}), ("peers", {}), ("decide", {"topic": "ci", "text": "GitHub Actions"}),
                           ("decisions", {}), ("inbox", {}))).wait()
    thread = thread_of(run)
    requests = world.codex_model.of_session(thread)
    assert requests, "Codex sent no request for its thread"
    first = requests[0].body
    assert any(t.startswith("agent-bridge:") for t in codex_messages(first, "developer")), codex_messages(first, "developer")
    assert namespace_tools(first) == set(BRIDGE_TOOLS)
    outputs = codex_outputs(requests[-1].body)
    assert len(outputs) == 5, outputs
    whoami = json.loads(outputs[0][0])
    assert whoami["hostSessionId"] == thread and whoami["kind"] == "interactive"
    assert json.loads(outputs[2][0])["decision"]["text"] == "GitHub Actions"
    assert [d["topic"] for d in json.loads(outputs[3][0])] == ["ci"]
    assert [m["kind"] for m in json.loads(outputs[4][0])] == ["decision"]  # the notice of its own decision
    assert [p["hostSessionId"] for p in world.peers()] == [thread]
    assert [c for c in codex_complaints(run) if DEPRECATED not in c] == []


def test_codex_says_nothing_about_the_setup(world: World) -> None:
    """Not even the deprecation warning for `[features].codex_hooks`, which Codex 0.171
    prints on every run when `install` wrote that key."""
    run = world.codex(plan(("whoami", {}))).wait()
    assert codex_complaints(run) == []


def test_job_override_gives_a_job_session(world: World) -> None:
    """The README's `-c mcp_servers.agent-bridge.args=[…, "--job"]` for `codex exec`."""
    override = 'mcp_servers.agent-bridge.args=["mcp","--agent","codex","--job"]'
    run = world.codex(plan(("whoami", {})), extra=("-c", override)).wait()
    whoami = json.loads(codex_outputs(world.codex_model.of_session(thread_of(run))[-1].body)[0][0])
    assert whoami["kind"] == "job" and whoami["hostSessionId"] == thread_of(run)

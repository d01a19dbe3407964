"""Real Codex sessions (`codex exec`, `codex exec resume`) on the bridge, as the model saw them."""

from __future__ import annotations

import json
import re

import pytest

from tests.hosts.conftest import BRIDGE_TOOLS, HostRun, World, codex_messages, codex_outputs, plan
from tests.hosts.models import GATE

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
    return [
        line for line in lines if CODEX_BAD.search(line) and not any(s in line for s in CODEX_SETUP_LINES)
    ]


def namespace_tools(body: dict) -> set[str]:
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and tool.get("name") == "mcp__agent_bridge":
            return {t.get("name") for t in tool.get("tools") or ()}
    return set()


def test_note_tools_and_thread_id(world: World) -> None:
    """The SessionStart note is a developer message; the six tools arrive as the
    `mcp__agent_bridge` namespace and work; the bridge knows the session by Codex's thread id."""
    run = world.codex(
        plan(
            ("whoami", {}),
            ("peers", {}),
            ("decide", {"topic": "ci", "text": "GitHub Actions"}),
            ("decisions", {}),
            ("inbox", {}),
        )
    ).wait()
    thread = thread_of(run)
    requests = world.codex_model.of_session(thread)
    assert requests, "Codex sent no request for its thread"
    first = requests[0].body
    assert any(t.startswith("agent-bridge:") for t in codex_messages(first, "developer")), codex_messages(
        first, "developer"
    )
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


def test_message_reaches_a_working_exec_between_tool_calls(world: World) -> None:
    """Path 1 on Codex: a message sent while `codex exec` is in the middle of its tool calls is
    in the model's next request of the same turn, as the PostToolUse hook's developer message
    beside the call, and acknowledged."""
    run = world.codex(plan(("whoami", {}), (GATE, {"gate": "codex-works"}), ("peers", {}), ("whoami", {})))
    world.codex_model.wait_reached("codex-works")
    name = next(p["name"] for p in world.peers() if p["agent"] == "codex")
    world.claude(
        plan(
            ("send", {"to": name, "text": "claude here: the schema changed"}),
        ),
        tag="sender",
    ).wait()
    with world.codex_model.lock:
        sent = len(world.codex_model.requests)
    world.codex_model.open_gate("codex-works")
    run.wait()
    thread = thread_of(run)
    requests = world.codex_model.of_session(thread)
    before = [r for r in requests if requests.index(r) < sent]
    after = requests[len(before):]
    assert not any("the schema changed" in r.text for r in before)
    assert "the schema changed" in after[0].text, [r.text[-1500:] for r in after]
    developer = [t for t in codex_messages(after[0].body, "developer") if "the schema changed" in t]
    assert developer and "not from the user" in developer[0], codex_messages(after[0].body, "developer")
    # Codex 0.171 puts the hook's developer message between the MCP call and its output.
    items = [i for i in after[0].body["input"] if isinstance(i, dict)]
    last_call = max(i for i, item in enumerate(items) if item.get("type") == "function_call")
    assert [item.get("type") for item in items[last_call:]] == [
        "function_call",
        "message",
        "function_call_output",
    ]
    assert "the schema changed" in json.dumps(items[last_call + 1])
    assert len(after) == 2  # the turn went on: the whoami call, then its last answer
    assert [r["ackedAt"] is not None for r in world.receipts(thread)] == [True]
    assert [c for c in codex_complaints(run) if DEPRECATED not in c] == []


def test_message_reaches_codex_at_its_stop_as_a_block(world: World) -> None:
    """Path 2 on Codex 0.171: no additionalContext on Stop, so the hook blocks with the message
    as the reason, which Codex gives the model as a user message in a hook prompt."""
    run = world.codex(plan(("whoami", {}), (GATE, {"gate": "codex-ends"})))
    world.codex_model.wait_reached("codex-ends")
    name = next(p["name"] for p in world.peers() if p["agent"] == "codex")
    world.claude(plan(("send", {"to": name, "text": "claude here: ship it"}),), tag="sender").wait()
    world.codex_model.open_gate("codex-ends")
    run.wait()
    thread = thread_of(run)
    seen = [r for r in world.codex_model.of_session(thread) if "claude here: ship it" in r.text]
    assert seen, "the message never reached the Codex model"
    users = [t for t in codex_messages(seen[0].body, "user") if "ship it" in t]
    assert users and "<hook_prompt" in users[0], codex_messages(seen[0].body, "user")
    assert [r["ackedAt"] is not None for r in world.receipts(thread)] == [True]

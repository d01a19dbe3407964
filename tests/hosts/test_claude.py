"""Real Claude Code sessions (`claude -p`, `--resume`) on the bridge, as the model saw them."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.hosts.conftest import (
    BRIDGE_TOOLS,
    CLAUDE_BAD_LOG,
    HostRun,
    World,
    claude_note,
    claude_system_texts,
    claude_tool_names,
    plan,
    result_text,
    tool_results,
)
from tests.hosts.models import GATE

pytestmark = pytest.mark.slow


def assert_clean_log(run: HostRun, *expected: str) -> None:
    """Nothing in Claude Code's debug log about the bridge's MCP server or hooks going wrong
    (but lines naming one of `expected`: the tool errors a test asked for)."""
    bad = [line for line in run.log_text.splitlines()
           if CLAUDE_BAD_LOG.search(line) and not any(e in line for e in expected)]
    assert not bad, "\n".join(bad[:20])


def hook_responses(run: HostRun, event: str) -> list[dict]:
    return [e for e in run.events if e.get("subtype") == "hook_response" and e.get("hook_event") == event]


def test_note_tools_and_session_id(world: World) -> None:
    """The SessionStart note is a system message; the six tools are listed and work; the
    bridge knows the session by Claude Code's own session id."""
    sid = str(uuid.uuid4())
    steps = plan(("whoami", {}), ("peers", {}), ("decide", {"topic": "db", "text": "PostgreSQL 16"}),
                 ("decisions", {}), ("send", {"to": "nobody-here", "text": "hi"}), ("inbox", {}))
    run = world.claude(steps, session_id=sid).wait()
    requests = world.claude_model.of_session(sid)
    assert requests, "Claude Code sent no request for its session"
    first = requests[0].body
    assert claude_note(first).startswith("agent-bridge:"), claude_system_texts(first)
    assert {f"mcp__agent-bridge__{t}" for t in BRIDGE_TOOLS} <= claude_tool_names(first)

    results = tool_results(requests[-1].body)
    assert len(results) == 6, results
    whoami, peers, decided, listed, sent, inbox = (json_or_text(r) for r in results)
    assert whoami["hostSessionId"] == sid
    assert [p["hostSessionId"] for p in peers] == [sid]
    assert decided["decision"]["topic"] == "db" and decided["deliveredTo"] == [whoami["name"]]
    assert [d["topic"] for d in listed] == ["db"]
    assert results[4].get("is_error") and "nobody-here" in result_text(results[4]), sent
    assert [m["kind"] for m in inbox] == ["decision"]  # the notice of its own decision
    assert [p["hostSessionId"] for p in world.peers()] == [sid]
    assert_clean_log(run, "nobody-here", "tool=mcp__agent-bridge__send")


def json_or_text(block: dict) -> object:
    content = block.get("content")
    text = content[0].get("text", "") if isinstance(content, list) and content else result_text(block)
    try:
        return json.loads(text)
    except ValueError:
        return text


def test_message_reaches_a_working_session_through_its_stop_hook(world: World) -> None:
    """Two sessions in one folder: B sends while A works; A's Stop hook hands the message to
    A's model (as "Stop hook feedback"), and Claude Code records the hook as a success. B's
    SessionStart note names no other session's name."""
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    run_a = world.claude(plan(("whoami", {}), (GATE, {"gate": "a-works"})), session_id=a, tag="a")
    world.claude_model.wait_reached("a-works")
    run_b = world.claude(plan(("whoami", {}), ("send", {"to": a, "text": "B here: use port 8080"})),
                         session_id=b, tag="b").wait()
    world.claude_model.open_gate("a-works")
    run_a.wait()

    seen_by_a = [r for r in world.claude_model.of_session(a) if "use port 8080" in r.text]
    assert seen_by_a, "the message never reached A's model"
    assert "Stop hook feedback" in seen_by_a[0].text
    # Claude Code labels every blocking Stop hook "Stop hook error" in its terminal (its word
    # for any block); what the hook controls is that its run succeeded with a valid answer.
    stops = hook_responses(run_a, "Stop")
    assert [(s.get("outcome"), s.get("exit_code")) for s in stops][:1] == [("success", 0)], stops
    assert json.loads(stops[0]["stdout"])["decision"] == "block"
    assert "Successfully parsed and validated hook JSON output" in run_a.log_text
    assert_clean_log(run_a)
    assert_clean_log(run_b)

    b_requests = world.claude_model.of_session(b)
    b_name = json_or_text(tool_results(b_requests[-1].body)[0])["name"]
    a_name = next(p["name"] for p in world.peers() if p["hostSessionId"] == a)
    assert b_name != a_name
    note = claude_note(b_requests[0].body)
    assert note.startswith("agent-bridge:")
    assert a_name not in note.replace(b_name, ""), note  # names only itself, if anything

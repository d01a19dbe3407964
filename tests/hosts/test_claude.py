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
    requests = world.claude_model.turns_of(sid)
    assert requests, "Claude Code sent no request for its session"
    first = requests[0].body
    assert claude_note(first).startswith("agent-bridge:"), claude_system_texts(first)
    # Claude Code 2.1.332 defers MCP tools: listed by name in a system message, loaded by ToolSearch.
    assert all(f"mcp__agent-bridge__{t}" in requests[0].text for t in BRIDGE_TOOLS)
    assert not {f"mcp__agent-bridge__{t}" for t in BRIDGE_TOOLS} & claude_tool_names(first)

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


def test_message_reaches_a_session_at_its_stop_without_an_error_label(world: World) -> None:
    """Path 2. Two sessions in one folder: B sends while A waits for its model's last answer;
    A's Stop hook hands the message to A's model as additionalContext (Claude Code 2.1.163+):
    no "blocking error" naming the hook's command line, and the hook ran as a success. B's
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
    assert "Stop hook additional context" in seen_by_a[0].text
    assert "blocking error" not in seen_by_a[0].text and "hook stop --agent" not in seen_by_a[0].text
    # Two Stop handlers ran: the Stop hook and the waiter, which leaves at once under `claude -p`.
    stops = hook_responses(run_a, "Stop")
    assert {(s.get("outcome"), s.get("exit_code")) for s in stops} == {("success", 0)}, stops
    answers = [json.loads(s["stdout"]) for s in stops if s.get("stdout", "").strip()]
    assert [a["hookSpecificOutput"]["hookEventName"] for a in answers] == ["Stop"], stops
    assert "Successfully parsed and validated hook JSON output" in run_a.log_text
    assert_clean_log(run_a)
    assert_clean_log(run_b)
    assert [r["ackedAt"] is not None for r in world.receipts(a)] == [True]

    b_requests = world.claude_model.turns_of(b)
    b_name = json_or_text(tool_results(b_requests[-1].body)[0])["name"]
    a_name = next(p["name"] for p in world.peers() if p["hostSessionId"] == a)
    assert b_name != a_name
    note = claude_note(b_requests[0].body)
    assert note.startswith("agent-bridge:")
    assert a_name not in note.replace(b_name, ""), note  # names only itself, if anything


def test_message_reaches_a_working_session_between_tool_calls(world: World) -> None:
    """Path 1. B sends while A is in the middle of a run of tool calls: the PostToolUse hook of
    A's next tool call hands the message over, and A's model has it in its very next request of
    the same turn (a system message after the tool result), not at the turn's end."""
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    run_a = world.claude(plan(("whoami", {}), (GATE, {"gate": "a-works"}), ("peers", {}), ("whoami", {})),
                         session_id=a, tag="a")
    world.claude_model.wait_reached("a-works")
    world.claude(
        plan(
            ("send", {"to": a, "text": "B here: the schema changed"}),
        ),
        session_id=b,
        tag="b",
    ).wait()
    sent = len(world.claude_model.turns_of(a))
    world.claude_model.open_gate("a-works")
    run_a.wait()

    requests = world.claude_model.turns_of(a)
    before, after = requests[:sent], requests[sent:]
    # The request held at the gate was answered with A's next tool call (its ToolSearch for
    # `peers`); the request that carries that call's result is the first after the send.
    assert not any("the schema changed" in r.text for r in before)
    assert "the schema changed" in after[0].text, [r.text[-2000:] for r in after]
    contexts = [t for t in claude_system_texts(after[0].body) if "the schema changed" in t]
    assert contexts and contexts[0].startswith("PostToolUse:"), claude_system_texts(after[0].body)
    assert "hook additional context" in contexts[0] and "not from the user" in contexts[0]
    assert len(after) >= 3  # the turn went on: peers, whoami, then its last answer
    posts = hook_responses(run_a, "PostToolUse")
    assert (
        all(p.get("exit_code") == 0 for p in posts)
        and sum("the schema changed" in p.get("stdout", "") for p in posts) == 1
    )
    assert [r["ackedAt"] is not None for r in world.receipts(a)] == [True]
    assert not any(
        "Stop hook" in r.text and "the schema changed" in r.text.split("Stop hook", 1)[1] for r in after
    )
    assert_clean_log(run_a)


def test_note_after_compaction_and_tools_found_by_search(world: World) -> None:
    """Path 4: the SessionStart hook also runs when Claude Code compacts a session, so the
    decisions survive compaction; and a model searching the deferred tools with the words a
    user would use finds the bridge's tools."""
    sid = str(uuid.uuid4())
    searches = plan(
        ("ToolSearch", {"query": "message another agent session"}),
        ("ToolSearch", {"query": "inbox"}),
        ("ToolSearch", {"query": "owner decision"}),
    )
    run = world.claude(searches, session_id=sid).wait()
    found = []
    for block in tool_results(world.claude_model.turns_of(sid)[-1].body, with_searches=True):
        content = block.get("content")
        found.append(
            {c.get("tool_name") for c in content if isinstance(c, dict)}
            if isinstance(content, list)
            else set()
        )
    assert len(found) == 3, found
    assert "mcp__agent-bridge__send" in found[0], found
    assert "mcp__agent-bridge__inbox" in found[1], found
    assert {"mcp__agent-bridge__decisions", "mcp__agent-bridge__decide"} <= found[2], found
    assert_clean_log(run)

    world.bridge("decide", "db", "PostgreSQL 16", "--scope", "all")
    compact = world.claude("/compact", resume=sid, tag="compact").wait()
    started = [
        e
        for e in compact.events
        if e.get("subtype") == "hook_response" and e.get("hook_name") == "SessionStart:compact"
    ]
    assert len(started) == 1 and started[0].get("exit_code") == 0, started
    note = json.loads(started[0]["stdout"])["hookSpecificOutput"]["additionalContext"]
    assert note.startswith("agent-bridge: you are ") and "db: PostgreSQL 16" in note
    assert any(e.get("subtype") == "compact_boundary" for e in compact.events)
    before = len(world.claude_model.turns_of(sid))
    world.claude("go on", resume=sid, tag="after").wait()
    first_after = world.claude_model.turns_of(sid)[before]
    # The compacted conversation keeps the note of the compaction; the resume adds its own.
    assert first_after.text.count("SessionStart hook additional context: agent-bridge") == 2
    assert first_after.text.count("db: PostgreSQL 16") == 2
    assert_clean_log(compact)

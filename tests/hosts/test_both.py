"""Claude Code and Codex on one bridge: messages and decisions cross between the hosts, a
working session gets a message through its Stop hook, a finished one after it is resumed."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.hosts.conftest import World, claude_note, codex_messages, plan
from tests.hosts.models import GATE
from tests.hosts.test_claude import assert_clean_log
from tests.hosts.test_codex import DEPRECATED, codex_complaints, thread_of

pytestmark = pytest.mark.slow


def test_messages_and_decisions_cross_between_the_hosts(world: World) -> None:
    claude_id, claude_later = str(uuid.uuid4()), str(uuid.uuid4())

    # A Claude Code session records a decision and keeps working while a Codex session starts,
    # sends it a message and records a decision of its own.
    claude = world.claude(
        plan(("decide", {"topic": "deploy", "text": "Fly.io"}), (GATE, {"gate": "claude-works"})),
        session_id=claude_id,
        tag="claude",
    )
    world.claude_model.wait_reached("claude-works")
    codex = world.codex(plan(("send", {"to": claude_id, "text": "codex here: tests pass"}),
                             ("decide", {"topic": "ci", "text": "Buildkite"}))).wait()
    world.claude_model.open_gate("claude-works")
    claude.wait()
    thread = thread_of(codex)

    codex_first = world.codex_model.of_session(thread)[0].body
    assert any("deploy: Fly.io" in t for t in codex_messages(codex_first, "developer")), \
        "Claude Code's decision is not in the Codex session's SessionStart note"
    to_claude = [r for r in world.claude_model.of_session(claude_id) if "codex here: tests pass" in r.text]
    assert to_claude and "Stop hook additional context" in to_claude[0].text, (
        "the message never reached Claude Code's model"
    )

    # Both sessions have finished. A new Claude Code session sees Codex's decision at its
    # start and sends a message to each of them.
    later = world.claude(plan(("send", {"to": thread, "text": "for codex after its run"}),
                              ("send", {"to": claude_id, "text": "for claude after its run"})),
                         session_id=claude_later, tag="later").wait()
    note = claude_note(world.claude_model.turns_of(claude_later)[0].body)
    assert "ci: Buildkite" in note and "deploy: Fly.io" in note, note

    # Resumed, each gets the message sent while it was gone.
    resumed_claude = world.claude("resumed: go on", resume=claude_id, tag="resumed")
    resumed_codex = world.codex("resumed: go on", resume=thread).wait()
    resumed_claude.wait()
    assert any("for claude after its run" in r.text for r in world.claude_model.turns_of(claude_id)[-2:])
    # A resumed session is known: its note names it, truly.
    name = next(p["name"] for p in world.peers() if p["hostSessionId"] == claude_id)
    resumed_first = next(r for r in world.claude_model.turns_of(claude_id) if "resumed: go on" in r.text)
    assert claude_note(resumed_first.body).startswith(f"agent-bridge: you are {name}."), claude_note(
        resumed_first.body
    )
    codex_seen = [r for r in world.codex_model.of_session(thread) if "for codex after its run" in r.text]
    assert codex_seen, "the message never reached the resumed Codex session's model"
    assert any("for codex after its run" in t for t in codex_messages(codex_seen[0].body, "user"))

    # One bridge session per host session, known by the host's own id.
    assert sorted(p["hostSessionId"] for p in world.peers()) == sorted([claude_id, claude_later, thread])
    for run in (claude, later, resumed_claude):
        assert_clean_log(run)
    for run in (codex, resumed_codex):
        assert [c for c in codex_complaints(run) if DEPRECATED not in c] == []
    assert json.loads(codex.out.splitlines()[0])["type"] == "thread.started"

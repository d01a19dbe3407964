"""Owner questions with the real hosts (SPEC §4.6, issue 26): a `codex exec` job asks the owner
with `ask_owner`; the owner, typing in an interactive Claude Code session (its TUI, in tmux), is
shown the question beside the prompt (the UserPromptSubmit hook) and answers from the command
line; the job's resumed thread gets the answer as an active message, and the Claude Code session
gets the decision notice and sees the decision in its next SessionStart note."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.hosts.conftest import (
    World,
    claude_note,
    codex_messages,
    codex_outputs,
    plan,
    poll_until,
    result_text,
    tool_results,
)
from tests.hosts.test_claude_tui import exit_tui, ready
from tests.hosts.test_codex import DEPRECATED, codex_complaints, thread_of

# serial: the owner types in Claude Code's TUI under tmux, shares the machine with no
# other test (nox runs these in its second pass).
pytestmark = [pytest.mark.slow, pytest.mark.serial]

QUESTION = "Which queue should the jobs service use?"


def test_a_job_asks_the_owner_answers_and_both_sessions_keep_the_decision(world: World) -> None:
    sid = str(uuid.uuid4())
    tui = world.claude_tui(sid)
    poll_until(lambda: ready(world, tui, sid), "the TUI's prompt and its MCP server")

    # A headless job asks: the answer comes at once, with the question's id.
    job = world.codex(
        plan(
            ("ask_owner", {"question": QUESTION, "topic": "Queue", "options": ["Redis", "SQS"]}),
        ),
        tag="job",
    ).wait()
    thread = thread_of(job)
    asked = json.loads(codex_outputs(world.codex_model.of_session(thread)[-1].body)[0][0])
    question = asked["question"]
    assert asked["current"] is None and question["state"] == "open" and question["topic"] == "queue"
    assert [a["name"] for a in question["askedBy"]] == [
        p["name"] for p in world.peers() if p["hostSessionId"] == thread
    ]

    # The owner types in the interactive session: the question is beside the prompt, once.
    before = len(world.claude_model.turns_of(sid))
    tui.type(plan(("whoami", {})))
    poll_until(lambda: len(world.claude_model.turns_of(sid)) > before + 1, "the typed turn's requests")
    typed = world.claude_model.turns_of(sid)[before]
    assert "Open questions from your other sessions" in typed.text and question["id"] in typed.text, (
        typed.text[-3000:]
    )
    assert not any("Open questions" in r.text for r in world.claude_model.turns_of(sid)[:before])
    assert "Redis" in typed.text and "not from the user" in typed.text
    poll_until(lambda: "done." in tui.screen(), "the typed turn to end")

    # The owner answers from the command line: a pinned decision, the asker told.
    answered = json.loads(world.bridge("answer", question["id"], "--option", "1", "--json").stdout)
    decision = answered["decision"]
    assert decision["sourceMessageId"] == question["id"] and decision["author"]["id"] == "cli"
    assert (decision["topic"], decision["text"]) == ("queue", "Redis")
    claude_name = next(p["name"] for p in world.peers() if p["hostSessionId"] == sid)
    assert answered["deliveredTo"] == [claude_name]  # the interactive session in scope, connected
    assert answered["askersTold"] == [question["askedBy"][0]["name"]]

    # The interactive session: the decision notice (passive: it waits for the session's inbox).
    count = len(world.claude_model.of_session(sid))
    tui.type(plan(("inbox", {})))
    poll_until(
        lambda: any(
            decision["id"] in result_text(b)
            for r in world.claude_model.of_session(sid)[count:]
            for b in tool_results(r.body)
        ),
        "the decision notice in the inbox",
    )
    poll_until(lambda: "done." in tui.screen(), "the inbox turn to end")
    # ... and in its next SessionStart note (after /clear, which starts the session over).
    with world.claude_model.lock:
        cleared_at = len(world.claude_model.requests)
    tui.type("/clear")
    tui.type(plan(("whoami", {})))

    def note_after_clear() -> str | None:
        with world.claude_model.lock:
            later = list(world.claude_model.requests[cleared_at:])
        notes = [claude_note(r.body) for r in later]
        return next((n for n in notes if "queue: Redis" in n), None)

    note = poll_until(note_after_clear, "a SessionStart note with the answer's decision after /clear")
    assert "queue: Redis" in note
    exit_tui(world, tui)

    # The job's thread, resumed: the answer, as an active message naming the question and the decision.
    resumed = world.codex("resumed: go on", resume=thread, tag="resumed").wait()
    seen = [r for r in world.codex_model.of_session(thread) if "The owner answered your question" in r.text]
    assert seen, "the answer never reached the resumed thread's model"
    carrying = [t for role in ("user", "developer") for t in codex_messages(seen[0].body, role)
                if "The owner answered your question" in t]
    assert carrying and question["id"] in carrying[0] and decision["id"] in carrying[0], carrying
    assert "not from the user" in carrying[0]
    poll_until(lambda: all(r["ackedAt"] for r in world.receipts(thread)), "the answer acknowledged")
    for run in (job, resumed):
        assert [c for c in codex_complaints(run) if DEPRECATED not in c] == []

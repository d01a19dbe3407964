"""The owner's slash commands in the real Claude Code (SPEC §4.6 "Owner commands inside the
sessions"): `agent-bridge install` wrote them (tests/hosts/conftest.py), and `claude -p
"/agent-bridge:NAME ARGS"` in the default permission mode runs the CLI through the command's `!`
block, allowed by its own `allowed-tools`. The model is handed the CLI's output with the request
to show it; what the owner typed reaches the CLI as typed, never read by a shell; a command that
fails shows its one-line error to the owner, and the model gets nothing.

Codex 0.171 has no custom prompts (agent_bridge/hosts/slash.py), so install writes nothing there; its
TUI's shell mode (`!agent-bridge …`) is what the README offers instead."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from agent_bridge.store import reader
from tests.hosts.conftest import AGENT_BRIDGE, World, plan, poll_until, result_text, tool_results

pytestmark = pytest.mark.slow

TRICKY = "rebase on main, then \"ship\" it's $(touch pwned) `touch pwned2` $HOME"
SHOW = "Show the owner the output above exactly as printed"


def user_texts(body: dict[str, Any]) -> list[str]:
    found = []
    for message in body.get("messages") or ():
        if message.get("role") != "user":
            continue
        content = message.get("content")
        for block in [content] if isinstance(content, str) else content or ():
            text = block if isinstance(block, str) else block.get("text") if isinstance(block, dict) else None
            if isinstance(text, str):
                found.append(text)
    return found


def shown(world: World, sid: str) -> str:
    """What the model was handed for the slash command: the text before our request to show it."""
    requests = world.claude_model.turns_of(sid)
    assert requests, "the model got no request"
    (text,) = [t for t in user_texts(requests[0].body) if SHOW in t]
    return text.split(SHOW)[0]


def test_the_owners_commands_run_in_claude_code_and_show_the_clis_output(world: World) -> None:
    target = str(uuid.uuid4())
    world.claude("hello", session_id=target).wait()  # a session to write to

    sid = str(uuid.uuid4())
    world.claude(f"/agent-bridge:send {target} {TRICKY}", session_id=sid, skip_permissions=False).wait()
    with reader.reading(world.bridge_home / "bridge.db") as conn:
        assert conn is not None
        rows = conn.execute(
            "SELECT m.id, m.body, f.name FROM messages m JOIN peers p ON p.id = m.to_peer "
            "JOIN peers f ON f.id = m.from_peer WHERE p.host_session_id = ?", (target,)).fetchall()
    assert len(rows) == 1, f"no message stored for the send; the model was shown: {shown(world, sid)!r}"
    (message_id, body, sender) = rows[0]
    assert (body, sender) == (TRICKY, "cli")  # verbatim, from the owner
    assert not list(world.root.rglob("pwned*"))  # no shell read what was typed
    output = shown(world, sid)
    assert output.startswith("Queued for claude-proj") and message_id in output, output  # send's summary

    sid = str(uuid.uuid4())
    world.claude('/agent-bridge:decide "build system" make, not cmake', session_id=sid,
                 skip_permissions=False).wait()
    assert shown(world, sid).startswith("Recorded build system for project ")
    (decision,) = json.loads(world.bridge("decisions", "build system", "--json").stdout)
    assert decision["text"] == "make, not cmake"

    sid = str(uuid.uuid4())
    world.claude("/agent-bridge:questions --all", session_id=sid, skip_permissions=False).wait()
    assert shown(world, sid).strip() == "No questions."

    sid = str(uuid.uuid4())
    world.claude("/agent-bridge:inbox", session_id=sid, skip_permissions=False).wait()
    assert shown(world, sid).strip() == "No messages to the owner yet."

    sid = str(uuid.uuid4())
    world.claude("/agent-bridge:jobs", session_id=sid, skip_permissions=False).wait()
    assert shown(world, sid).startswith("No running or queued jobs")


def test_a_failing_command_shows_its_error_and_asks_the_model_nothing(world: World) -> None:
    sid = str(uuid.uuid4())
    run = world.claude("/agent-bridge:answer 0000dead --option 1", session_id=sid,
                       skip_permissions=False).wait()
    assert world.claude_model.of_session(sid) == []
    assert "agent-bridge answer: no question has id '0000dead'" in run.out


def test_the_model_cannot_run_the_owners_commands(world: World) -> None:
    """They act as the owner (author `cli`): a model that calls one with its Skill tool is refused
    (`disable-model-invocation`), and nothing is recorded."""
    sid = str(uuid.uuid4())
    world.claude(plan(("Skill", {"skill": "agent-bridge:decide", "args": "db use sqlite"})),
                 session_id=sid).wait()
    results = [b for r in world.claude_model.of_session(sid) for b in tool_results(r.body)]
    assert results and results[0].get("is_error") is True
    assert "disable-model-invocation" in result_text(results[0])
    assert json.loads(world.bridge("decisions", "--json").stdout) == []


@pytest.mark.serial  # Codex's TUI under tmux (see tests/hosts/test_codex_tui.py)
def test_codex_0171_has_no_custom_prompts_to_install(world: World) -> None:
    """Why install writes no Codex prompts: Codex removed custom prompts in 0.117, and 0.171's TUI
    refuses `/prompts:NAME` for a prompt file where older releases read them (`$CODEX_HOME/prompts`).
    Should a Codex release take them again, this fails, and the prompts can be added."""
    folder = world.codex_home / "prompts"
    folder.mkdir()
    (folder / "ping.md").write_text("---\ndescription: ping\n---\nSAY PONG-MARKER $ARGUMENTS\n")
    tui = world.codex_tui()
    poll_until(lambda: "Ask Codex" in tui.screen(), "the Codex TUI", timeout=90)
    tui.type("/prompts:ping now")
    poll_until(lambda: "Unrecognized command '/prompts:ping'" in tui.screen(), "Codex's answer", timeout=30)
    assert not any("PONG-MARKER" in r.text for r in world.codex_model.requests)

    # What the README offers instead: Codex's shell mode runs the command in the session.
    tui.type(f"!{AGENT_BRIDGE} questions")

    pressed = [time.monotonic()]

    def ran() -> bool:
        if "You ran" in tui.screen():
            return True
        if time.monotonic() - pressed[-1] > 1:  # the first Enter may only have closed a popup
            tui.tmux("send-keys", "Enter")
            pressed.append(time.monotonic())
        return False

    poll_until(ran, "the shell command to run", timeout=30)
    poll_until(lambda: "No open questions." in tui.screen(), "its output on the screen", timeout=30)
    assert not any("PONG-MARKER" in r.text for r in world.codex_model.requests)

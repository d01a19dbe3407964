"""The interactive Claude Code (its TUI, in tmux) on the bridge: a Stop delivery shows no error
label on the screen (path 2), and an idle session is woken by a message with no keystroke
(path 3, the asyncRewake waiter). Only an interactive session can be idle."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from agent_bridge.hooks import wake
from tests.hooks.conftest import waiter_locks_held
from tests.hosts.conftest import Tui, World, claude_system_texts, plan, poll_until
from tests.hosts.models import GATE

# serial: a TUI under tmux, read from its screen as a person would, shares the machine with no
# other test (nox runs these in its second pass).
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def ready(world: World, tui: Tui, sid: str) -> bool:
    """The prompt is on the screen and the session's MCP server has joined the bridge (before
    that, Claude Code 2.1.332 drops what is typed)."""
    return "bypass permissions" in tui.screen() and any(p["hostSessionId"] == sid for p in world.peers())


def waiters_held(world: World) -> int:
    """How many idle-wake waiters hold their session's lock (one waits per session)."""
    return waiter_locks_held(world.bridge_home)


def bridge_processes(world: World) -> list[str]:
    """Command lines of agent-bridge hook and MCP processes of this world still running."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if (
            ("hook" in cmd or " mcp" in cmd)
            and "agent-bridge" in cmd
            and str(world.bridge_home).encode() in env
        ):
            found.append(cmd)
    return found


def session_mark(world: World, sid: str) -> str:
    """The session's mark for its waiter: "busy …" while a turn runs, "idle …" once the turn's
    Stop hook has finished (agent_bridge.hooks.wake)."""
    return wake.read_mark(world.bridge_home, sid)


def exit_tui(world: World, tui: Tui) -> None:
    tui.type("/exit")
    poll_until(lambda: not tui.running(), "Claude Code to exit")
    poll_until(lambda: not bridge_processes(world), "no agent-bridge hook or MCP process left", timeout=30)


def test_idle_session_is_woken_by_a_message_and_a_stop_delivery_has_no_error_label(world: World) -> None:
    sid = str(uuid.uuid4())
    tui = world.claude_tui(sid)
    poll_until(lambda: ready(world, tui, sid), "the TUI's prompt and its MCP server")

    # Path 2: a message arrives while the turn runs; the Stop hook hands it over as
    # additionalContext: the screen shows no "Stop hook reported a problem".
    tui.type(plan(("whoami", {}), (GATE, {"gate": "works"})))
    world.claude_model.wait_reached("works")
    world.bridge("send", sid, "while you work: the schema changed")
    world.claude_model.open_gate("works")
    poll_until(lambda: any("the schema changed" in r.text for r in world.claude_model.of_session(sid)),
               "the message at the Stop")
    seen = next(r for r in world.claude_model.of_session(sid) if "the schema changed" in r.text)
    assert "Stop hook additional context" in seen.text and "blocking error" not in seen.text
    poll_until(lambda: "done." in tui.screen() and world.receipts(sid) and all(
        r["ackedAt"] for r in world.receipts(sid)), "the turn to end, the message acknowledged")
    screen = tui.screen()
    assert "reported a problem" not in screen and "hook error" not in screen.lower(), screen

    # Path 1 with the waiter armed: a message sent in the middle of a typed turn's tool calls is
    # the PostToolUse hook's (a system message in the next request), not the waiter's.
    poll_until(lambda: waiters_held(world) == 1, "the waiter armed at the Stop")
    tui.type(plan(("whoami", {}), (GATE, {"gate": "busy"}), ("peers", {}), ("whoami", {})))
    world.claude_model.wait_reached("busy")
    second_turn = session_mark(world, sid)  # its UserPromptSubmit hook ran before its first request
    assert wake.is_busy(second_turn), second_turn  # not the first turn's "idle …" (a late Stop hook's)
    known = len(world.claude_model.turns_of(sid))
    world.bridge("send", sid, "mid-turn: rebase first")
    world.claude_model.open_gate("busy")
    poll_until(
        lambda: any("rebase first" in r.text for r in world.claude_model.of_session(sid)),
        "the mid-turn message",
    )
    requests = world.claude_model.turns_of(sid)
    first = next(k for k, r in enumerate(requests) if "rebase first" in r.text)
    assert first == known, "not in the next request after the send"
    contexts = [t for t in claude_system_texts(requests[first].body) if "rebase first" in t]
    assert contexts and contexts[0].startswith("PostToolUse:"), requests[first].text[-3000:]
    assert "Stop hook feedback" not in requests[first].text
    poll_until(lambda: all(r["ackedAt"] for r in world.receipts(sid)), "the mid-turn message acknowledged")

    # Path 3: the session is idle (its turn ended, the waiter armed at its Stop). A message
    # wakes it: a new turn with no keystroke, the message in the model's request, through the
    # waiter. The turn has ended when its Stop hook has marked it idle: its "done." is on the
    # screen before that (and the first turn's two "done." were there before it began).
    poll_until(lambda: waiters_held(world) == 1 and session_mark(world, sid).startswith("idle "),
               "the second turn's Stop hook finished, the waiter armed")
    before = len(world.claude_model.turns_of(sid))
    started = time.monotonic()
    world.bridge("send", sid, "idle wake: are you there?")
    sent = time.monotonic()
    woke = poll_until(lambda: next((r for r in world.claude_model.turns_of(sid)[before:]
                                    if "are you there?" in r.text), None), "the idle session woken")
    woke_at = time.monotonic()
    print(f"\nreach (Claude Code TUI, idle, asyncRewake): {woke_at - sent:.3f} s after send returned "
          f"({woke_at - started:.3f} s after it was called)")
    assert "not from the user" in woke.text
    # The waiter's (Claude Code queues its stderr as a new turn's message), not a hook's additionalContext.
    carrying = [json.dumps(m, ensure_ascii=False) for m in woke.body.get("messages") or ()
                if "are you there?" in json.dumps(m, ensure_ascii=False)]
    assert carrying and "Stop hook feedback" in carrying[0] and "additional context" not in carrying[0], (
        carrying
    )
    poll_until(lambda: all(r["ackedAt"] for r in world.receipts(sid)), "the wake acknowledged")
    # The sender's receipts (`agent-bridge sent`, as the sent tool): the waiter's wake confirmed,
    # the messages shown while the session worked were never a wake.
    woken = {r["text"]: r["woken"] for r in json.loads(world.bridge("sent", "--json").stdout)}
    assert woken == {"idle wake: are you there?": "confirmed", "mid-turn: rebase first": None,
                     "while you work: the schema changed": None}, woken
    poll_until(
        lambda: "are you there?" in tui.screen() or "done." in tui.screen(), "the woken turn on screen"
    )
    # After the woken turn's Stop, one waiter again (not one per Stop).
    poll_until(lambda: waiters_held(world) == 1 and len(world.claude_model.turns_of(sid)) > before,
               "the next waiter armed")
    exit_tui(world, tui)
    assert waiters_held(world) == 0
    # Claude Code ends its waiter with SIGTERM as it exits: the session's mark and waiter lock
    # still go with it (nothing of the session is left in <home>/waiters/).
    leftover = [p for p in (wake.session_mark(world.bridge_home, sid), wake.lock_path(world.bridge_home, sid))
                if p.exists()]
    assert leftover == [], leftover


def test_a_turn_cut_short_with_esc_counts_as_idle(world: World) -> None:
    """Esc runs no hook in Claude Code 2.1.332 (no Stop): the session stays marked busy, but the
    transcript says the turn was interrupted, so the waiter (armed at the previous Stop) wakes
    the session with a message that arrives after the Esc."""
    sid = str(uuid.uuid4())
    tui = world.claude_tui(sid)
    poll_until(lambda: ready(world, tui, sid), "the TUI's prompt and its MCP server")
    tui.type(plan(("whoami", {})))
    poll_until(lambda: waiters_held(world) == 1 and session_mark(world, sid).startswith("idle "),
               "the first turn's Stop, the waiter armed")
    tui.type(plan(("whoami", {}), (GATE, {"gate": "esc"}), ("whoami", {})))
    world.claude_model.wait_reached("esc")
    assert wake.is_busy(session_mark(world, sid))
    tui.tmux("send-keys", "Escape")
    poll_until(lambda: "Interrupted" in tui.screen(), "the turn cut short")
    world.claude_model.open_gate("esc")
    assert wake.is_busy(session_mark(world, sid))  # no hook ran: the mark still says busy
    before = len(world.claude_model.turns_of(sid))
    world.bridge("send", sid, "after your Esc: the build is red")
    woke = poll_until(lambda: next((r for r in world.claude_model.turns_of(sid)[before:]
                                    if "the build is red" in r.text), None), "the session woken after Esc")
    assert "not from the user" in woke.text
    poll_until(lambda: all(r["ackedAt"] for r in world.receipts(sid)), "the wake acknowledged")
    exit_tui(world, tui)

"""The interactive Codex (its TUI, in tmux) on the bridge: an idle session is woken by a message
with no keystroke and no setting (path 3: the waiter its Stop hook starts runs `codex queue
--resume`), only while the TUI runs (`agent_bridge.hooks.wake.front_of`); a turn cut short with
Esc counts as idle (its Interrupt hook); and after `/compact` the SessionStart note, with the
current decisions, is back (path 4)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agent_bridge.hooks import wake
from tests.hosts.conftest import GATE_STEP, Tui, World, codex_messages, plan, poll_until
from tests.hosts.test_claude_tui import waiters_held

# serial: a TUI under tmux, read from its screen as a person would, shares the machine with no
# other test (nox runs these in its second pass).
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def tui_ready(world: World, tui: Tui, count: int = 1) -> None:
    poll_until(
        lambda: (
            (world.bridge_home / "bridge.db").exists()
            and len([p for p in world.peers() if p["agent"] == "codex"]) >= count
            and "Ask Codex" in tui.screen()
        ),
        "the TUI and its MCP server",
        timeout=90,
    )


def test_idle_codex_session_is_woken_by_default_and_a_closed_one_waits_for_its_resume(world: World) -> None:
    """No AGENT_BRIDGE_CODEX_WAKE: the waiter wakes the idle TUI. After `/quit` the waiter ends with
    the TUI (the app-server daemon, which would run a queued turn unwatched, runs on), and a
    message then is not queued into Codex: it arrives at the first turn of `codex resume`."""
    tui = world.codex_tui()
    tui_ready(world, tui)
    tui.type(plan(("whoami", {})))
    poll_until(
        lambda: "done." in tui.screen() and waiters_held(world) == 1, "the turn ended, the waiter waiting"
    )
    thread = next(p["hostSessionId"] for p in world.peers() if p["agent"] == "codex")
    assert thread
    for i in range(2):  # the waiter goes on waiting after a wake: one per session
        text = f"idle codex {i}: the deploy is done"
        before = len(world.codex_model.of_session(thread))
        world.bridge("send", thread, text)
        sent = time.monotonic()
        woke = poll_until(
            lambda text=text, before=before: next(
                (r for r in world.codex_model.of_session(thread)[before:] if text in r.text), None
            ),
            "the idle session woken",
        )
        print(f"\nreach (Codex TUI, idle, codex queue): {time.monotonic() - sent:.3f} s after send returned")
        users = [t for t in codex_messages(woke.body, "user") if text in t]
        assert users and "not from the user" in users[0], codex_messages(woke.body, "user")
        poll_until(lambda: all(r["ackedAt"] for r in world.receipts(thread)), "the wake acknowledged")
        # the sender's receipt (`agent-bridge sent`): `codex queue` took it, the wake is confirmed
        (receipt,) = [r for r in json.loads(world.bridge("sent", "--json").stdout) if r["text"] == text]
        assert (receipt["state"], receipt["woken"]) == ("acknowledged", "confirmed"), receipt
        poll_until(
            lambda i=i: waiters_held(world) == 1 and tui.screen().count("done.") >= 2 + i, "idle again"
        )

    tui.type("/quit")
    poll_until(lambda: not tui.running(), "Codex to exit")
    poll_until(lambda: waiters_held(world) == 0, "the waiter ended with the TUI")
    assert world.leftovers(), "the app-server daemon runs on (it would run a queued turn)"
    before = len(world.codex_model.of_session(thread))
    world.bridge("send", thread, "while you were away: tests are green")
    time.sleep(3)  # (a look for the opposite: nothing queued a turn into the daemon)
    assert len(world.codex_model.of_session(thread)) == before
    (receipt,) = [r for r in json.loads(world.bridge("sent", "--json").stdout)
                  if "while you were away" in r["text"]]
    assert receipt["state"] != "acknowledged" and receipt["woken"] is None, receipt

    again = world.codex_tui(resume=thread)
    poll_until(lambda: "Ask Codex" in again.screen() or "done." in again.screen(), "the resumed TUI")
    submit(again, plan(("whoami", {}), ("whoami", {})), lambda: asked_since(world, thread, before))
    arrived = poll_until(
        lambda: request_with(world, thread, before, "tests are green"),
        "the message at the resumed session's first turn",
    )
    assert "not from the user" in arrived.text
    poll_until(lambda: all(r["ackedAt"] for r in world.receipts(thread)), "acknowledged once shown")
    again.type("/quit")
    poll_until(lambda: not again.running(), "Codex to exit")


def asked_since(world: World, thread: str, before: int) -> bool:
    return len(world.codex_model.of_session(thread)) > before


def request_with(world: World, thread: str, before: int, text: str) -> Any:
    """The first model request of `thread` since the first `before` that carries `text`."""
    return next((r for r in world.codex_model.of_session(thread)[before:] if text in r.text), None)


def submit(tui: Tui, text: str, sent: Any) -> None:
    """Type `text` and press Enter until `sent()` holds: a TUI of `codex resume` 0.171 drops an
    Enter that comes while it loads the thread (seen), and an Enter in an empty prompt does nothing."""
    tui.type(text)
    last = time.monotonic()

    def done() -> bool:
        nonlocal last
        if sent():
            return True
        if time.monotonic() - last > 3:
            tui.tmux("send-keys", "Enter")
            last = time.monotonic()
        return False

    poll_until(done, "the prompt submitted")


def test_a_codex_turn_cut_short_with_esc_is_idle_and_its_message_waits_for_its_next_turn(
    world: World,
) -> None:
    """Esc during a turn runs Codex's Interrupt hook (no Stop): the session is marked idle (so
    `peers` says), and its waiter armed. Codex 0.171 runs no turn for a message queued after an
    interruption (seen), so the waiter leaves a message to the next turn's hooks: unacknowledged
    until the person's next prompt, whose turn shows it."""
    tui = world.codex_tui()
    tui_ready(world, tui)
    tui.type(plan(("whoami", {}), GATE_STEP("esc"), ("whoami", {})))
    world.codex_model.wait_reached("esc")
    thread = next(p["hostSessionId"] for p in world.peers() if p["agent"] == "codex")
    assert wake.is_busy(wake.read_mark(world.bridge_home, thread))
    assert waiters_held(world) == 0  # the first turn runs: no Stop has armed a waiter yet
    tui.tmux("send-keys", "Escape")
    poll_until(lambda: "interrupted" in tui.screen(), "the turn cut short")
    poll_until(lambda: waiters_held(world) == 1, "the waiter the Interrupt hook armed")
    assert wake.read_mark(world.bridge_home, thread).startswith("idle interrupted "), "not idle after Esc"
    sessions = json.loads(world.bridge("sessions", "--json").stdout)
    assert [s.get("state") for s in sessions if s.get("hostSessionId") == thread] == ["idle"], sessions
    world.codex_model.open_gate("esc")
    before = len(world.codex_model.of_session(thread))
    world.bridge("send", thread, "after your Esc: look at the logs")
    time.sleep(3)  # (a look for the opposite: the waiter queued nothing Codex would not run)
    assert len(world.codex_model.of_session(thread)) == before
    assert not any(r["ackedAt"] for r in world.receipts(thread))
    submit(tui, plan(("whoami", {}), ("whoami", {})), lambda: asked_since(world, thread, before))
    shown = poll_until(
        lambda: request_with(world, thread, before, "look at the logs"),
        "the message in the next turn",
    )
    assert "not from the user" in shown.text
    poll_until(lambda: all(r["ackedAt"] for r in world.receipts(thread)), "acknowledged once shown")
    tui.type("/quit")
    poll_until(lambda: not tui.running(), "Codex to exit")


def test_note_after_compaction(world: World) -> None:
    """Path 4 on Codex: `/compact` in the TUI has the model summarise (a user message "You are
    performing a CONTEXT CHECKPOINT COMPACTION"), drops the conversation, the startup note with it,
    and Codex 0.171.0 runs the SessionStart hooks with source `compact` at the start of the next
    turn: the bridge's note, with a decision made since the session started, is a developer
    message of that turn's first request. A second SessionStart hook beside the bridge's records
    what Codex passed (the bridge's note is the same for every source)."""
    hooks_file = world.codex_home / "hooks.json"
    hooks = json.loads(hooks_file.read_text(encoding="utf-8"))
    seen = world.root / "session-start.jsonl"
    hooks["hooks"]["SessionStart"].append(
        {"hooks": [{"type": "command", "command": f"cat >> {seen}; echo >> {seen}"}]}
    )
    hooks_file.write_text(json.dumps(hooks), encoding="utf-8")

    def sources() -> list[str]:
        lines = seen.read_text(encoding="utf-8").splitlines() if seen.exists() else []
        return [json.loads(line)["source"] for line in lines if line.strip()]

    tui = world.codex_tui()  # trusts every hook in hooks.json, the recorder too
    poll_until(
        lambda: (
            (world.bridge_home / "bridge.db").exists()
            and any(p["agent"] == "codex" for p in world.peers())
            and "Ask Codex" in tui.screen()
        ),
        "the TUI and its MCP server",
        timeout=90,
    )
    tui.type(plan(("whoami", {})))
    poll_until(lambda: "done." in tui.screen(), "the first turn's answer")
    thread = next(p["hostSessionId"] for p in world.peers() if p["agent"] == "codex")
    assert thread
    first = world.codex_model.of_session(thread)[0]
    assert [t for t in codex_messages(first.body, "developer") if t.startswith("agent-bridge:")], (
        "no startup note"
    )
    assert "PostgreSQL 16" not in first.text

    world.bridge("decide", "db", "PostgreSQL 16", "--scope", "all")
    # "done." shows before the turn ends (its Stop hooks, the bridge's among them, still run), and
    # Codex 0.171.0 refuses `/compact` until then: "'/compact' is disabled while a task is in
    # progress". The turn's end is the "Worked for …" line it puts under the answer.
    poll_until(lambda: "Worked for" in tui.screen(), "the first turn's end")
    tui.type("/compact")
    poll_until(lambda: "Context compacted" in tui.screen(), "the compaction")
    summarised = [
        r for r in world.codex_model.of_session(thread) if "CONTEXT CHECKPOINT COMPACTION" in r.text
    ]
    assert len(summarised) == 1
    assert sources() == ["startup"]  # not at the compaction itself: at the next turn

    before = len(world.codex_model.of_session(thread))
    tui.type("go on")
    after = poll_until(
        lambda: next((r for r in world.codex_model.of_session(thread)[before:] if "go on" in r.text), None),
        "the first request after the compaction",
    )
    assert "Another language model started to solve this problem" in after.text  # the compacted history
    notes = [t for t in codex_messages(after.body, "developer") if t.startswith("agent-bridge:")]
    assert len(notes) == 1, notes  # the startup note went with the compacted history
    assert notes[0].startswith("agent-bridge: you are ") and "db: PostgreSQL 16" in notes[0], notes
    assert sources() == ["startup", "compact"]

    poll_until(lambda: tui.screen().count("done.") >= 2, "the turn after the compaction ended")
    tui.type("/quit")
    poll_until(lambda: not tui.running(), "Codex to exit")

"""The interactive Codex (its TUI, in tmux) on the bridge: an idle session is woken by a message
with no keystroke (path 3: the waiter its Stop hook starts runs `codex queue --resume`), where
the user declared it (AGENT_BRIDGE_CODEX_WAKE=1; see `agent_bridge.hosts.codex.Codex.runs_waiter`);
and after `/compact` the SessionStart note, with the current decisions, is back (path 4)."""

from __future__ import annotations

import json
import time

import pytest

from tests.hosts.conftest import World, codex_messages, plan, poll_until
from tests.hosts.test_claude_tui import waiters_held

pytestmark = pytest.mark.slow


def test_idle_codex_session_is_woken_by_a_message(world: World) -> None:
    """With AGENT_BRIDGE_CODEX_WAKE=1 declared where Codex runs."""
    tui = world.codex_tui(env={"AGENT_BRIDGE_CODEX_WAKE": "1"})
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
    # The waiter's host is the app-server daemon, which outlives the TUI (and keeps the thread: a
    # message queued now would run a turn there). Hence AGENT_BRIDGE_CODEX_WAKE; open_world ends
    # the daemon, and the waiter with it.
    assert waiters_held(world) == 1


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

"""The interactive Codex (its TUI, in tmux) on the bridge: an idle session is woken by a message
with no keystroke (path 3: the waiter its Stop hook starts runs `codex queue --resume`), where
the user declared it (AGENT_BRIDGE_CODEX_WAKE=1; see `agent_bridge.hosts.codex.Codex.runs_waiter`)."""

from __future__ import annotations

import time

import pytest

from tests.hosts.conftest import World, codex_messages, plan, poll_until
from tests.hosts.test_claude_tui import waiters_held

pytestmark = pytest.mark.slow


def test_idle_codex_session_is_woken_by_a_message(world: World) -> None:
    """With AGENT_BRIDGE_CODEX_WAKE=1 declared where Codex runs."""
    tui = world.codex_tui(env={"AGENT_BRIDGE_CODEX_WAKE": "1"})
    poll_until(lambda: (world.bridge_home / "bridge.db").exists() and any(p["agent"] == "codex" for p in world.peers())
               and "Ask Codex" in tui.screen(), "the TUI and its MCP server", timeout=90)
    tui.type(plan(("whoami", {})))
    poll_until(lambda: "done." in tui.screen() and waiters_held(world) == 1, "the turn ended, the waiter waiting")
    thread = next(p["hostSessionId"] for p in world.peers() if p["agent"] == "codex")
    assert thread
    for i in range(2):  # the waiter goes on waiting after a wake: one per session
        text = f"idle codex {i}: the deploy is done"
        before = len(world.codex_model.of_session(thread))
        world.bridge("send", thread, text)
        sent = time.monotonic()
        woke = poll_until(lambda text=text, before=before: next(
            (r for r in world.codex_model.of_session(thread)[before:] if text in r.text), None), "the idle session woken")
        print(f"\nreach (Codex TUI, idle, codex queue): {time.monotonic() - sent:.3f} s after send returned")
        users = [t for t in codex_messages(woke.body, "user") if text in t]
        assert users and "not from the user" in users[0], codex_messages(woke.body, "user")
        poll_until(lambda: all(r["ackedAt"] for r in world.receipts(thread)), "the wake acknowledged")
        poll_until(lambda i=i: waiters_held(world) == 1 and tui.screen().count("done.") >= 2 + i, "idle again")

    tui.type("/quit")
    poll_until(lambda: not tui.running(), "Codex to exit")
    # The waiter's host is the app-server daemon, which outlives the TUI (and keeps the thread: a
    # message queued now would run a turn there). Hence AGENT_BRIDGE_CODEX_WAKE; open_world ends
    # the daemon, and the waiter with it.
    assert waiters_held(world) == 1

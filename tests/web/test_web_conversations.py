"""The dashboard shows conversations as their senders follow them (SPEC §3 "Conversations agents
can rely on", §6): each session busy, idle or offline from the hooks' marks, each message's
receipt (shown, read, woken). A real bridge.db written by the broker's Store, marks written by the
hooks' own code, the real app on a real socket, and the page in headless Chromium."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from test_web_browser import BROWSER_TIMEOUT, chromium_page
from webfixtures import TIMEOUT, start_dashboard

from agent_bridge.hooks import common, wake
from agent_bridge.store.ids import now_ms
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.writer import Store

pytestmark = pytest.mark.slow


def build(home: Path) -> dict[str, Any]:
    """Three sessions (one busy by its mark, one with no mark, one gone) and three messages:
    one read, one whose wake was requested and never led to it being shown (long ago), one
    queued."""
    store = Store.open(home / "bridge.db")
    try:
        now = now_ms()
        busy = store.create_peer(agent="claude", name="claude-busy", project="/w/p", kind="interactive",
                                 host_session_id="hs-busy", now=now)
        quiet = store.create_peer(agent="codex", name="codex-quiet", project="/w/p", kind="interactive",
                                  host_session_id="hs-quiet", now=now)
        gone = store.create_peer(agent="codex", name="codex-gone", project="/w/p", kind="interactive",
                                 host_session_id=None, now=now - 60_000)
        read, woken, waiting = store.send_messages(busy.id, [
            Outgoing(quiet.id, "read this", 1, None),
            Outgoing(quiet.id, "wake up", 1, None),
            Outgoing(gone.id, "for later", 1, None),
        ], now=now - 60_000)
        store.ack(quiet.id, [read.id], now=now - 50_000)
        store.offer(quiet.id, [woken.id], now=now - 40_000, wake=True)  # a waiter fetched it, then died
    finally:
        store.close()
    hook = common.HookInput("hs-busy", "/w/p", "", False, "", "p-1")
    wake.mark_busy(home, hook, None)  # its UserPromptSubmit hook: a turn runs
    return {"live": {busy.id, quiet.id}, "read": read.id, "woken": woken.id, "waiting": waiting.id}


async def test_sessions_and_receipts_in_the_api_and_the_page(nursery: trio.Nursery, web_home: Path) -> None:
    made = build(web_home)
    with trio.fail_after(BROWSER_TIMEOUT):
        running = await start_dashboard(nursery, web_home, live=made["live"])
        with trio.fail_after(TIMEOUT):
            async with running.client() as client:
                sessions = (await client.get("/api/sessions")).json()["sessions"]
                messages = (await client.get("/api/messages")).json()["messages"]
        states = {s["name"]: (s["state"], s["stateSince"] is not None) for s in sessions}
        assert states == {"claude-busy": ("busy", True), "codex-quiet": (None, False),
                          "codex-gone": ("offline", True)}
        receipts = {m["id"]: m["receipt"] for m in messages}
        assert (receipts[made["read"]]["state"], receipts[made["read"]]["woken"]) == ("acknowledged", None)
        assert receipts[made["woken"]] == {"state": "queued", "shownAt": None, "acknowledgedAt": None,
                                           "woken": "unconfirmed"}
        assert receipts[made["waiting"]]["state"] == "queued"
        problems = await trio.to_thread.run_sync(partial(drive, running.url), abandon_on_cancel=True)
    assert problems == []


def drive(url: str) -> list[str]:
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 1200, 900) as (_, _, page):
        page.goto(url)
        busy = page.locator("#sessions li", has_text="claude-busy")
        expect(busy.locator(".tag.busy")).to_have_text("busy")
        quiet = page.locator("#sessions li", has_text="codex-quiet")
        expect(quiet.locator(".tag.busy, .tag.idle")).to_have_count(0)  # no hooks marked it
        items = page.locator("#messages li")
        expect(items.filter(has_text="read this").locator(".msg-foot")).to_contain_text("read")
        expect(items.filter(has_text="wake up").locator(".msg-foot")).to_contain_text(
            "not shown yet · a wake was not confirmed"
        )
        expect(items.filter(has_text="for later").locator(".msg-foot")).to_contain_text("not shown yet")
    return problems


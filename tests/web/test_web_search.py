"""The dashboard's search (SPEC §4.6 "Search", §6): GET /api/search?q= on the real app over a real
socket, with the broker up or down, under the read rules; and the search box in headless Chromium,
whose results mark the matched words, open a decision's history and follow new messages live."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio
from test_web_browser import ARTIFACTS, BROWSER_TIMEOUT, chromium_page
from webfixtures import TIMEOUT, Facts, Running, build_database, build_old_database, start_dashboard

from agent_bridge.store import schema
from agent_bridge.store.ids import now_ms
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.writer import Store


def nox_results(facts: Facts) -> list[tuple[str, str]]:
    """What "nox" finds in the fixture database, newest first: the reply, then both revisions of
    `build / ci` (the notice that carried the second one to codex is not a result of its own)."""
    reply = facts.messages[1]
    revisions = facts.history("build / ci")
    return [("message", reply["id"]), *(("decision", d["id"]) for d in revisions)]


async def test_search_answers_newest_first_with_who_and_when(dashboard: Running, facts: Facts) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            response = await client.get("/api/search", params={"q": "NOX"})
    assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
    body = response.json()
    assert (body["query"], body["more"]) == ("NOX", False)
    assert [(r["kind"], r["id"]) for r in body["results"]] == nox_results(facts)
    reply, current, old = body["results"]
    assert reply["from"]["name"] == "codex-proj" and reply["to"]["name"] == "claude-proj"
    assert reply["createdAt"] == facts.messages[1]["createdAt"]
    assert reply["snippet"] == facts.messages[1]["text"]
    assert (current["topic"], current["state"], old["state"]) == ("build / ci", "current", "superseded")
    assert set(reply) == {"kind", "id", "from", "to", "topic", "state", "createdAt", "snippet", "highlights"}


@pytest.mark.parametrize(
    ("params", "says"),
    [({}, "at least one word"), ({"q": "  "}, "at least one word"), ({"q": "?!"}, "at least one word"),
     ({"q": "x" * 513}, "at most 512 characters")],
)
async def test_a_bad_query_is_400_with_one_line(
    dashboard: Running, params: dict[str, str], says: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            response = await client.get("/api/search", params=params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith("query: ") and says in error and "\n" not in error


@pytest.mark.parametrize("q", ['"nox', "NEAR(nox tox", "nox OR", "text: nox", "nox*", "^nox", "-nox"])
async def test_search_syntax_is_plain_words(dashboard: Running, facts: Facts, q: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            response = await client.get("/api/search", params={"q": q})
    assert response.status_code == 200, response.text
    found = [(r["kind"], r["id"]) for r in response.json()["results"]]
    assert found in ([], nox_results(facts))  # words only: "nox" found, "OR", "NEAR", "text" never operators


async def test_search_reads_with_the_broker_down_and_without_a_database(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with trio.fail_after(TIMEOUT):
        running = await start_dashboard(nursery, home, standalone=True)
        async with running.client() as client:
            empty = await client.get("/api/search", params={"q": "nox"})
            assert empty.status_code == 200 and empty.json()["results"] == []
            assert not (home / "bridge.db").exists()  # reads never create it
            facts = build_database(home)
            found = await client.get("/api/search", params={"q": "nox"})
            assert [(r["kind"], r["id"]) for r in found.json()["results"]] == nox_results(facts)
        async with running.client(cookie=False) as stranger:
            denied = await stranger.get("/api/search", params={"q": "nox"})
            assert denied.status_code == 403 and denied.json() == {"error": "forbidden"}


async def test_a_database_from_before_the_index_is_503_with_what_to_do(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    build_old_database(home, schema.STEPS.index(schema.V_SEARCH))
    with trio.fail_after(TIMEOUT):
        running = await start_dashboard(nursery, home, standalone=True)
        async with running.client() as client:
            response = await client.get("/api/search", params={"q": "hi"})
    assert response.status_code == 503
    assert "no search index yet" in response.json()["error"] and "agent-bridge up" in response.json()["error"]


# --- the search box in headless Chromium -------------------------------------------------------


def drive_search(running: Running, facts: Facts, add_message) -> list[str]:
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 1280, 900) as (_browser, _context, page):
        page.goto(running.url)
        expect(page.locator("#decisions-body tr")).to_have_count(len(facts.current()))
        expect(page.locator("#search-card")).to_be_hidden()
        page.locator("#search-q").fill("nox")
        items = page.locator("#search-results li")
        expect(items).to_have_count(3)
        expect(page.locator("#search-count")).to_have_text("3")
        assert [items.nth(i).get_attribute("data-id") for i in range(3)] == [i for _, i in nox_results(facts)]
        expect(items.nth(0)).to_contain_text("codex-proj → claude-proj")
        expect(items.nth(0).locator(".msg-text")).to_have_text(facts.messages[1]["text"])
        expect(items.nth(0).locator("mark")).to_have_text(["nox"])  # the matched word, marked
        expect(items.nth(1).locator(".tag.current")).to_have_text("current")
        expect(items.nth(2).locator(".tag.old")).to_have_text("superseded")
        # A decision's topic opens its history.
        items.nth(2).get_by_role("button", name="build / ci").click()
        expect(page.locator("#history")).to_be_visible()
        expect(page.locator("#history-topic")).to_have_text("build / ci")
        # New words, new results; a new message that matches shows up without a reload.
        page.locator("#search-q").fill("tox nox")
        expect(items).to_have_count(2)
        add_message("Reminder: nox and never tox, as decided")
        expect(items).to_have_count(3)
        expect(items.nth(0).locator(".msg-text")).to_have_text("Reminder: nox and never tox, as decided")
        expect(items.nth(0).locator("mark")).to_have_text(["nox", "tox"])
        page.screenshot(path=str(ARTIFACTS / "dashboard-search.png"), full_page=True)
        # Words with nothing to search for: the reason, in the card.
        page.locator("#search-q").fill("?!")
        expect(page.locator("#search-error")).to_contain_text("query: give at least one word")
        expect(items).to_have_count(0)
        page.get_by_role("button", name="Close search results").click()
        expect(page.locator("#search-card")).to_be_hidden()
        expect(page.locator("#search-q")).to_have_value("")
    return problems


async def test_the_search_box_in_headless_chromium(dashboard: Running, facts: Facts) -> None:
    def add_message(text: str) -> None:
        """A message a session sends (the broker's writer; this dashboard runs without one)."""
        store = Store.open(dashboard.home / "bridge.db")
        try:
            claude, codex = facts.peers["claude-proj"]["id"], facts.peers["codex-proj"]["id"]
            store.send_messages(codex, [Outgoing(claude, text, 1, None)], now_ms())
        finally:
            store.close()

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with trio.fail_after(BROWSER_TIMEOUT):
        problems = await trio.to_thread.run_sync(
            partial(drive_search, dashboard, facts, add_message), abandon_on_cancel=True
        )
    assert problems == []

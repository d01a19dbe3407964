"""The dashboard page end to end in headless Chromium (Debian's chromium, driven by Playwright).

Playwright's sync API runs on a worker thread (it brings its own event loop); the dashboard runs
on the test's Trio loop, on a real socket.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio
from webfixtures import OTHER, Facts, Running, start_dashboard

from agent_bridge import domain
from agent_bridge.store.writer import Store, now_ms
from agent_bridge.web.standalone import write_open_page

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
BROWSER_TIMEOUT = 120  # seconds for the whole browser session (Chromium start included)
STEP_TIMEOUT_MS = 15_000  # each Playwright wait


def drive_browser(running: Running, facts: Facts, open_page: Path, screenshot: Path) -> list[str]:
    """Use the page as a person would; returns what the browser complained about (console errors,
    CSP violations, page errors)."""
    from playwright.sync_api import expect, sync_playwright

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-US",
                                          timezone_id="UTC")
            context.set_default_timeout(STEP_TIMEOUT_MS)
            expect.set_options(timeout=STEP_TIMEOUT_MS)
            page = context.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))

            # The tokenized URL: the cookie is set and the token leaves the address bar.
            page.goto(running.url)
            assert page.url == running.base + "/"
            assert page.evaluate("document.cookie") == ""  # HttpOnly: scripts cannot read it
            rows = page.locator("#decisions-body tr")
            expect(rows).to_have_count(len(facts.current()))
            expect(rows.first).to_contain_text("PostgreSQL 17 everywhere.")
            expect(page.locator("#decisions-body")).to_contain_text("Use nox sessions for CI, never tox.")
            expect(page.locator("#mode")).to_have_text("broker running")
            expect(page.locator("#sessions li")).to_have_count(len(facts.peers))
            expect(page.locator("#sessions li").first).to_contain_text("claude-proj")
            expect(page.locator("#sessions li").first).to_contain_text("connected")
            expect(page.locator("#messages li")).to_have_count(3)
            expect(page.locator("#messages")).to_contain_text("codex-proj → claude-proj")

            # Search (case-insensitive, topic or text), then clear it.
            page.fill("#q", "NOX")
            expect(rows).to_have_count(1)
            expect(rows.first).to_contain_text("build / ci")
            page.fill("#q", "no such decision")
            expect(rows).to_have_count(0)
            expect(page.locator("#decisions-empty")).to_have_text("No decisions match this search.")
            page.fill("#q", "")
            expect(rows).to_have_count(len(facts.current()))

            # Scope filter: global only; a project (its own plus global); a bad folder is explained.
            page.select_option("#scope-kind", "all")
            expect(rows).to_have_count(2)
            page.select_option("#scope-kind", "project")
            page.fill("#scope-value", OTHER)
            expect(rows).to_have_count(3)
            expect(page.locator("#decisions-body")).to_contain_text("Hold to look")
            page.fill("#scope-value", "relative/folder")
            expect(page.locator("#filter-error")).to_contain_text("relative")
            page.select_option("#scope-kind", "")
            expect(rows).to_have_count(len(facts.current()))
            expect(page.locator("#filter-error")).to_be_hidden()

            # History of a topic with slashes in it, then of one with two revisions.
            page.get_by_role("button", name="/leading//slashes", exact=True).click()
            expect(page.locator("#history")).to_be_visible()
            expect(page.locator("#history-topic")).to_have_text("/leading//slashes")
            expect(page.locator("#history-list li")).to_have_count(1)
            page.get_by_role("button", name="build / ci", exact=True).click()
            expect(page.locator("#history-topic")).to_have_text("build / ci")
            revisions = page.locator("#history-list li")
            expect(revisions).to_have_count(2)
            expect(revisions.nth(0)).to_contain_text("current")
            expect(revisions.nth(0)).to_contain_text("Use nox sessions for CI, never tox.")
            expect(revisions.nth(1)).to_contain_text("superseded")
            expect(revisions.nth(1)).to_contain_text("Use nox for CI.")
            expect(page.locator("tr.selected")).to_contain_text("build / ci")
            assert page.url.endswith("#topic=build%20%2F%20ci")

            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(screenshot), full_page=True)

            # A reload keeps the open history (it lives in the fragment, never sent to the server).
            page.reload()
            expect(page.locator("#history-topic")).to_have_text("build / ci")

            # Data is text, never markup: a decision full of HTML shows up literally.
            hostile = "<img src=x onerror=alert(1)><script>alert(2)</script><b>bold?</b>"
            record_hostile_decision(running.home, facts, hostile)
            page.click("#refresh")
            expect(rows.first).to_contain_text(hostile)
            assert page.locator("#decisions-body img, #decisions-body script, #decisions-body b").count() == 0
            page.get_by_role("button", name="<b>topic</b>", exact=True).click()
            expect(page.locator("#history-topic")).to_have_text("<b>topic</b>")

            # Without the cookie: the dashboard's 403 page.
            stranger = browser.new_context().new_page()
            response = stranger.goto(running.base + "/")
            assert response is not None and response.status == 403
            expect(stranger.locator("body")).to_contain_text("agent-bridge dashboard")

            # `--open` goes through a file:// redirect page (the token stays off the browser's argv);
            # arriving from another origin still ends on the page, logged in.
            opener = browser.new_context().new_page()
            opener.goto(open_page.as_uri())
            opener.wait_for_url(running.base + "/")
            expect(opener.locator("#decisions-body tr").first).to_be_visible()
        finally:
            browser.close()
    return problems


def record_hostile_decision(home: Path, facts: Facts, text: str) -> None:
    store = Store.open(home / "bridge.db")
    try:
        author = facts.peers["claude-proj"]
        view = domain.SessionView(author["id"], author["name"], author["project"], author["hostSessionId"])
        store.record_decision(author=view, author_agent="claude", topic="<b>topic</b>", text=text, scope="all",
                              source_message_id=None, recipients=[], now=now_ms())
    finally:
        store.close()


async def test_dashboard_page_in_headless_chromium(nursery: trio.Nursery, web_home: Path, facts: Facts) -> None:
    with trio.fail_after(BROWSER_TIMEOUT):
        running = await start_dashboard(nursery, web_home, live={facts.peers["claude-proj"]["id"]})
        open_page = write_open_page(web_home, running.url)
        screenshot = ARTIFACTS / "dashboard.png"
        problems = await trio.to_thread.run_sync(
            partial(drive_browser, running, facts, open_page, screenshot), abandon_on_cancel=True
        )
    # The one failed load expected is the 400 answering the relative folder typed in the filter.
    assert [p for p in problems if "the server responded with a status of 400" not in p] == []
    assert screenshot.stat().st_size > 10_000

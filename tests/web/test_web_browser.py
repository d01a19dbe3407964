"""The dashboard page end to end in headless Chromium (Debian's chromium, driven by Playwright).

Playwright's sync API runs on a worker thread (it brings its own event loop); the dashboard runs
on the test's Trio loop, on a real socket.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from webfixtures import OTHER, PROJECT, BrokerInProcess, Facts, Running, start_dashboard

from agent_bridge.common import domain
from agent_bridge.dashboard.standalone import write_open_page
from agent_bridge.ipc import blocking
from agent_bridge.store.ids import now_ms
from agent_bridge.store.writer import Store

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


@contextmanager
def chromium_page(problems: list[str], width: int, height: int, *, dialogs: bool = False) -> Iterator[Any]:
    """Debian's Chromium, headless, one context of that viewport (UTC, en-US) and one page whose
    console errors and page errors (and, with `dialogs`, any dialog, dismissed) go to `problems`:
    yields (browser, context, page); the browser is closed afterwards."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": width, "height": height}, locale="en-US", timezone_id="UTC"
            )
            context.set_default_timeout(STEP_TIMEOUT_MS)
            expect.set_options(timeout=STEP_TIMEOUT_MS)
            page = context.new_page()
            page.on(
                "console",
                lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            if dialogs:
                page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
            yield browser, context, page
        finally:
            browser.close()


def drive_browser(running: Running, facts: Facts, open_page: Path, screenshot: Path) -> list[str]:
    """Use the page as a person would; returns what the browser complained about (console errors,
    CSP violations, page errors)."""
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 1440, 900, dialogs=True) as (browser, context, page):

        # The tokenized URL: the cookie is set and the token leaves the address bar.
        page.goto(running.url)
        assert page.url == running.base + "/"
        assert page.evaluate("document.cookie") == ""  # HttpOnly: scripts cannot read it
        rows = page.locator("#decisions-body tr")
        expect(rows).to_have_count(len(facts.current()))
        expect(rows.first).to_contain_text("PostgreSQL 17 everywhere.")
        expect(page.locator("#decisions-body")).to_contain_text("Use nox sessions for CI, never tox.")
        expect(page.locator("#mode")).to_have_text("broker running")
        expect(page.locator("#live")).to_have_text("live")

        # Sessions: the connected one first; the gone ones folded away, with their age.
        expect(page.locator("#sessions li")).to_have_count(1)
        expect(page.locator("#sessions li").first).to_contain_text("claude-proj")
        expect(page.locator("#sessions li").first).to_contain_text("connected")
        expect(page.locator("#gone-summary")).to_contain_text(f"{len(facts.peers) - 1} gone sessions")
        expect(page.locator("#gone-sessions li").first).not_to_be_visible()
        page.click("#gone-summary")
        expect(page.locator("#gone-sessions li")).to_have_count(len(facts.peers) - 1)
        expect(page.locator("#gone-sessions")).to_contain_text("codex-proj")
        # seen 2h46 ago
        expect(page.locator("#gone-sessions li").first).to_contain_text(re.compile(r"gone 3 h"))

        # Receipts: the one decision queued for a session is pending, and highlighted.
        ci_row = rows.filter(has_text="Use nox sessions for CI, never tox.")
        expect(ci_row).to_have_class("has-pending")
        expect(ci_row.locator(".receipt-summary")).to_have_text("1 of 1 pending")
        expect(ci_row.locator(".receipt.pending")).to_contain_text("codex-proj")
        expect(rows.filter(has_text="Hold to look")).not_to_have_class("has-pending")
        expect(rows.filter(has_text="Hold to look").locator("td.delivered")).to_have_text(
            "none yet: no session in scope was connected; "
            "sessions that start later see it in their start note"
        )
        # Scopes in words, not JSON.
        expect(rows.filter(has_text="Hold to look").locator(".scope")).to_have_text(
            f"sessions in {OTHER}"
        )
        expect(ci_row.locator(".scope")).to_have_text("everyone (all sessions)")
        expect(rows.filter(has_text="Espresso only").locator(".scope")).to_have_text("session codex-proj")
        expect(page.locator("#decisions-body")).not_to_contain_text("{")

        # Messages: conversation and notices apart; active vs passive against the hop limit.
        expect(page.locator("#messages li")).to_have_count(3)
        expect(page.locator("#messages")).to_contain_text("codex-proj → claude-proj")
        page.get_by_role("button", name="Notices", exact=True).click()
        expect(page.locator("#messages li")).to_have_count(1)
        notice = page.locator("#messages li").first
        expect(notice).to_contain_text("decision notice")
        expect(notice.locator(".tag.passive")).to_have_text("passive")
        expect(notice).to_contain_text("Decision “build / ci” for everyone (all sessions)")
        expect(notice).to_contain_text("waits until the session checks its messages")  # plain words
        expect(notice).not_to_contain_text("hop 100")
        page.get_by_role("button", name="Conversation", exact=True).click()
        expect(page.locator("#messages li")).to_have_count(2)
        expect(page.locator("#messages .tag.active")).to_have_count(2)
        expect(page.locator("#messages")).not_to_contain_text("decision notice")
        page.get_by_role("button", name="All", exact=True).click()
        expect(page.locator("#messages li")).to_have_count(3)

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
        # Before any input: no error, and the known project folders are offered.
        expect(page.locator("#scope-value")).to_be_visible()
        expect(page.locator("#filter-error")).to_be_hidden()
        suggested = page.locator("#projects option")
        assert set(suggested.evaluate_all("options => options.map(o => o.value)")) >= {PROJECT, OTHER}
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
        expect(page.locator("#history-list > li")).to_have_count(1)
        page.get_by_role("button", name="build / ci", exact=True).click()
        expect(page.locator("#history-topic")).to_have_text("build / ci")
        revisions = page.locator("#history-list > li")
        expect(revisions).to_have_count(2)
        expect(revisions.nth(0)).to_contain_text("current")
        expect(revisions.nth(0)).to_contain_text("Use nox sessions for CI, never tox.")
        expect(revisions.nth(1)).to_contain_text("superseded")
        expect(revisions.nth(1)).to_contain_text("Use nox for CI.")
        expect(revisions.nth(0).locator(".receipt.pending")).to_contain_text("codex-proj")
        expect(revisions.nth(1).locator(".rev-receipts")).to_contain_text("none yet")
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

        # Without the cookie: the dashboard's 403 page, styled, saying how to get a fresh URL.
        stranger = browser.new_context(viewport={"width": 400, "height": 700}).new_page()
        stranger.on("console", lambda m: problems.append(f"403 page console {m.type}: {m.text}")
                    if m.type == "error" and "403" not in m.text else None)
        response = stranger.goto(running.base + "/")
        assert response is not None and response.status == 403
        expect(stranger.locator("h1")).to_contain_text("not valid")
        expect(stranger.locator("body")).to_contain_text("run agent-bridge dashboard in a terminal")
        # styled
        assert stranger.locator("main").evaluate("m => getComputedStyle(m).borderRadius") == "10px"
        assert_no_horizontal_scroll(stranger)
        stranger.screenshot(path=str(screenshot.with_name("dashboard-403.png")), full_page=True)

        # `--open` goes through a file:// redirect page (the token stays off the browser's argv);
        # arriving from another origin still ends on the page, logged in.
        opener = browser.new_context().new_page()
        opener.goto(open_page.as_uri())
        opener.wait_for_url(running.base + "/")
        expect(opener.locator("#decisions-body tr").first).to_be_visible()
    return problems


def assert_no_horizontal_scroll(page) -> None:
    widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], f"the page scrolls sideways: {widths}"


def record_hostile_decision(home: Path, facts: Facts, text: str) -> None:
    store = Store.open(home / "bridge.db")
    try:
        author = facts.peers["claude-proj"]
        view = domain.SessionView(author["id"], author["name"], author["project"], author["hostSessionId"])
        store.record_decision(
            author=view,
            author_agent="claude",
            topic="<b>topic</b>",
            text=text,
            scope="all",
            source_message_id=None,
            recipients=[],
            now=now_ms(),
        )
    finally:
        store.close()


async def test_dashboard_page_in_headless_chromium(
    nursery: trio.Nursery, web_home: Path, facts: Facts
) -> None:
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


def drive_stale_history(running: Running) -> tuple[list[str], list[str]]:
    """Open one topic's history while its answer is held back, then another's; then let the
    first answer arrive. Returns (problems, the history titles the page showed after that)."""
    from playwright.sync_api import expect

    problems: list[str] = []
    held: list[Any] = []
    with chromium_page(problems, 1280, 900) as (_browser, _context, page):
        page.goto(running.url)
        expect(page.locator("#decisions-body tr").first).to_be_visible()
        page.route(re.compile(r".*/api/decisions/%2Fleading%2F%2Fslashes/history$"),
                   lambda route: held.append(route))
        page.get_by_role("button", name="/leading//slashes", exact=True).click()
        page.wait_for_function("() => true")
        assert len(held) == 1  # its answer is on hold
        page.get_by_role("button", name="build / ci", exact=True).click()
        expect(page.locator("#history-topic")).to_have_text("build / ci")
        page.evaluate("""() => {
            const title = document.getElementById("history-topic");
            window.__titles = [];
            new MutationObserver(() => window.__titles.push(title.textContent)).observe(
              document.getElementById("history"), {subtree: true, childList: true, characterData: true});
        }""")
        with page.expect_response(re.compile(r".*slashes/history$")):
            held[0].continue_()
        page.wait_for_load_state("networkidle")
        titles = page.evaluate("() => window.__titles")
        expect(page.locator("#history-topic")).to_have_text("build / ci")
    return problems, titles


async def test_a_late_answer_for_a_history_no_longer_open_is_not_shown(
    nursery: trio.Nursery, web_home: Path, facts: Facts
) -> None:
    """Found in CI: a refresh's history request for the topic open before, answered after the
    owner opened another topic, replaced the new history with the old one."""
    with trio.fail_after(BROWSER_TIMEOUT):
        running = await start_dashboard(nursery, web_home, live={facts.peers["claude-proj"]["id"]})
        problems, titles = await trio.to_thread.run_sync(
            partial(drive_stale_history, running), abandon_on_cancel=True
        )
    assert problems == []
    assert "/leading//slashes" not in titles, titles


LIVE_BOUND_MS = 2_000  # a decide made through IPC shows up on an open page within this, without reload


def drive_live_and_narrow(url: str, actions: dict[str, Any], artifacts: Path) -> list[str]:
    """A phone-sized page (400 px) on a broker's dashboard: no sideways scrolling, a decide made
    by a session over IPC appears by itself, and after a broker restart (a new token) the page
    says it is no longer authorized instead of "broker running"."""
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 400, 860) as (browser, context, page):
        page.goto(url)
        rows = page.locator("#decisions-body tr")
        expect(page.locator("#mode")).to_have_text("broker running")
        expect(page.locator("#live")).to_have_text("live")  # the stream is open: no polling
        expect(page.locator("#sessions li")).to_have_count(1)  # the session holding an IPC connection
        expect(rows.filter(has_text="Use nox sessions for CI, never tox.")).to_be_visible()
        assert_no_horizontal_scroll(page)
        page.screenshot(path=str(artifacts / "dashboard-narrow.png"), full_page=True)
        page.evaluate("window.sameDocument = true")  # gone if the page reloads

        decided = actions["decide"]()
        new_row = rows.filter(has_text="Friday afternoons never.")
        expect(new_row).to_be_visible(timeout=LIVE_BOUND_MS)
        assert page.evaluate("window.sameDocument") is True  # no reload: the stream brought it
        expect(new_row.locator(".receipt.pending")).to_contain_text(decided["deliveredTo"][0])
        expect(new_row.locator(".scope")).to_have_text("everyone (all sessions)")
        assert_no_horizontal_scroll(page)
        page.get_by_role("button", name="deploys", exact=True).click()
        expect(page.locator("#history-list > li")).to_have_count(1)
        expect(page.locator("#history-list > li").first.locator(".receipt.pending")).to_be_visible()
        page.get_by_role("button", name="Notices", exact=True).click()
        expect(page.locator("#messages li").first).to_contain_text("Decision “deploys” for everyone")
        assert_no_horizontal_scroll(page)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(artifacts / "dashboard-narrow-live.png"), full_page=True)

        # `agent-bridge retract` (the broker's command op over IPC): gone from the table, and
        # the open history and the notices say so, all without a reload.
        actions["retract"]()
        expect(new_row).to_have_count(0, timeout=LIVE_BOUND_MS)
        revision = page.locator("#history-list > li").first
        expect(revision.locator(".tag")).to_have_text("retracted")
        expect(revision).to_contain_text("Retracted just now by cli: moved to the release checklist")
        expect(page.locator("#history-retracted")).to_contain_text("No current decision")
        expect(page.locator("#messages li").first).to_contain_text("retraction notice")
        expect(page.locator("#messages li").first).to_contain_text(
            "Decision “deploys” retracted: moved to the release checklist"
        )
        assert page.evaluate("window.sameDocument") is True
        assert_no_horizontal_scroll(page)
        page.locator("#history").scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "dashboard-narrow-retracted.png"))

        # The broker restarts on the same port with a new token: the stream drops, the page's
        # next request gets 403, and the header stops claiming a running broker.
        actions["restart"]()
        expect(page.locator("#mode")).to_have_text("not authorized")
        expect(page.locator("#live")).to_be_hidden()
        expect(page.locator("#banner")).to_contain_text("agent-bridge dashboard")
        assert_no_horizontal_scroll(page)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(artifacts / "dashboard-narrow-denied.png"))
        assert page.evaluate("window.sameDocument") is True
    return problems


async def test_live_update_narrow_layout_and_restart_in_headless_chromium(
    web_home: Path, facts: Facts
) -> None:
    from agent_bridge.ipc.client import open_bridge_client

    with trio.fail_after(BROWSER_TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = BrokerInProcess(web_home)
            record = await broker.start(nursery)
            url = broker.dashboard_url()
            leave = trio.Event()

            async def hold_session(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
                hello = {"agent": "codex", "project": PROJECT, "hostSessionId": "browser-live-1"}
                async with open_bridge_client(record["socket"], hello) as (client, _pushes):
                    task_status.started(client)
                    await leave.wait()

            session = await nursery.start(hold_session)

            async def decide() -> Any:
                return await session.request(
                    "decide", topic="Deploys", text="Friday afternoons never.", scope="all"
                )

            async def restart() -> None:
                leave.set()
                port = broker.web_port
                await broker.stop()
                await broker.start(nursery, web_port=port)

            def retract() -> Any:
                return blocking.call(
                    web_home, "retract", topic="deploys", reason="moved to the release checklist"
                )

            actions = {"decide": lambda: trio.from_thread.run(decide), "retract": retract,
                       "restart": lambda: trio.from_thread.run(restart)}
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            problems = await trio.to_thread.run_sync(
                partial(drive_live_and_narrow, url, actions, ARTIFACTS), abandon_on_cancel=True
            )
            await broker.stop()
    # Expected failed loads: requests refused or cut while the broker was restarting, and the stream and
    # the requests refused with 403 after it.
    expected = (
        "status of 403",
        "net::ERR_CONNECTION_REFUSED",
        "net::ERR_CONNECTION_RESET",
        "net::ERR_EMPTY_RESPONSE",
        "net::ERR_SOCKET_NOT_CONNECTED",  # a request's socket shut down by the stopping broker (seen in CI)
    )
    assert [p for p in problems if not any(e in p for e in expected)] == []


def drive_fallback(running: Running, facts: Facts, actions: dict[str, Any]) -> list[str]:
    """The stream refused (this client already holds the most streams allowed): the page polls,
    still shows what changes, and takes the stream once a place is free."""
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 1024, 800) as (browser, context, page):
        page.goto(running.url)
        expect(page.locator("#decisions-body tr")).to_have_count(len(facts.current()))
        expect(page.locator("#live")).to_have_text("polling every 5 s")
        page.evaluate("window.sameDocument = true")
        actions["decide"]("polling", "Still seen without a stream.")
        expect(page.locator("#decisions-body")).to_contain_text("Still seen without a stream.")
        actions["release"]()
        expect(page.locator("#live")).to_have_text("live")
        actions["decide"]("streaming", "Back on the stream.")
        expect(page.locator("#decisions-body")).to_contain_text(
            "Back on the stream.", timeout=LIVE_BOUND_MS
        )
        assert page.evaluate("window.sameDocument") is True
    return problems


async def test_page_polls_while_the_stream_is_refused_then_goes_live(
    nursery: trio.Nursery, web_home: Path, facts: Facts
) -> None:

    from agent_bridge.dashboard.live import STREAMS_PER_CLIENT

    with trio.fail_after(BROWSER_TIMEOUT):
        running = await start_dashboard(nursery, web_home, live={facts.peers["claude-proj"]["id"]})
        release = trio.Event()
        held = trio.Semaphore(0)

        async def hold_stream() -> None:
            async with running.client() as client, client.stream("GET", "/api/events") as response:
                assert response.status_code == 200
                held.release()
                await release.wait()

        for _ in range(STREAMS_PER_CLIENT):
            nursery.start_soon(hold_stream)
        for _ in range(STREAMS_PER_CLIENT):
            await held.acquire()

        def decide(topic: str, text: str) -> None:
            author = facts.peers["claude-proj"]
            view = domain.SessionView(
                author["id"], author["name"], author["project"], author["hostSessionId"]
            )
            store = Store.open(web_home / "bridge.db")
            try:
                store.record_decision(author=view, author_agent="claude", topic=topic, text=text, scope="all",
                                      source_message_id=None, recipients=[], now=now_ms())
            finally:
                store.close()

        actions = {"decide": decide, "release": lambda: trio.from_thread.run_sync(release.set)}
        problems = await trio.to_thread.run_sync(
            partial(drive_fallback, running, facts, actions), abandon_on_cancel=True
        )
    # Expected: the refused stream (429) while the places were taken.
    assert [p for p in problems if "status of 429" not in p] == []


def drive_remote_decision(running: Running) -> list[str]:
    """The decisions table and a topic's history with another machine's decision and retraction."""
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 1280, 900) as (_browser, _context, page):
        page.goto(running.url)
        row = page.locator("#decisions-body tr").filter(has_text="REST, no GraphQL")
        expect(row.locator("td.by .tag.machine")).to_have_text("on laptop")
        page.get_by_role("button", name="api style", exact=True).click()
        expect(page.locator("#history-list")).to_contain_text("on laptop")
        retracted = page.locator("#decisions-body tr").filter(has_text="MySQL")
        expect(retracted).to_have_count(0)  # retracted on laptop: not current here either
    return problems


async def test_another_machines_decision_names_its_machine(nursery: trio.Nursery, web_home: Path) -> None:
    """SPEC §10: the dashboard shows a remote decision with the machine that recorded it
    (`author.machine`), in the table and the topic's history."""
    from agent_bridge.core import envelopes as env

    laptop = env.Author("p-1", "claude-api", "claude")
    store = Store.open(web_home / "bridge.db")
    try:
        at = now_ms()
        store.apply_remote_decision("laptop", env.DecisionEnvelope(
            "d-1", "api style", "REST, no GraphQL", None, laptop, at, None, None), at)
        store.apply_remote_decision("laptop", env.DecisionEnvelope(
            "d-2", "db", "MySQL", None, laptop, at, None, None), at)
        store.apply_remote_decision("laptop", env.RetractionEnvelope(
            "r-1", "db", "d-2", "gone", laptop, at + 1), at + 1)
    finally:
        store.close()
    with trio.fail_after(BROWSER_TIMEOUT):
        running = await start_dashboard(nursery, web_home)
        problems = await trio.to_thread.run_sync(
            partial(drive_remote_decision, running), abandon_on_cancel=True)
    assert problems == []

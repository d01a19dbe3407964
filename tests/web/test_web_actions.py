"""The owner's actions from the dashboard (SPEC §6, issue 25): record or supersede a decision,
retract one, send a message as the owner, forget a gone session. A real broker (run_broker on
this Trio loop, its IPC socket and its dashboard), real HTTP, and headless Chromium, including a
page of another origin whose form post must fail."""

from __future__ import annotations

import http.server
import json
import re
import threading
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from test_web_browser import ARTIFACTS, BROWSER_TIMEOUT, chromium_page
from webfixtures import OTHER, PROJECT, BrokerInProcess, Facts

from agent_bridge.dashboard import auth
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.store import reader

pytestmark = pytest.mark.slow
TIMEOUT = 60
CLI_AUTHOR = {"id": "cli", "name": "cli", "agent": "cli"}


def decisions_in(home: Path) -> list[dict[str, Any]]:
    with reader.reading(home / "bridge.db") as conn:
        assert conn is not None
        rows = conn.execute("SELECT topic, text, author_id FROM decisions ORDER BY seq").fetchall()
    return [{"topic": t, "text": b, "author": a} for t, b, a in rows]


def message_count(home: Path) -> int:
    with reader.reading(home / "bridge.db") as conn:
        assert conn is not None
        return conn.execute("SELECT count(*) FROM messages").fetchone()[0]


class LiveBroker:
    """The broker with two sessions holding IPC connections (so a decide is delivered, twice)."""

    def __init__(self, home: Path) -> None:
        self.broker = BrokerInProcess(home)
        self.leave = trio.Event()
        self.session: dict[str, Any] = {}
        self.names: list[str] = []  # of both, sorted (as deliveredTo)

    async def start(self, nursery: trio.Nursery) -> str:
        record = await self.broker.start(nursery)

        async def hold(
            hello: dict[str, Any], task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
        ) -> None:
            async with open_bridge_client(record["socket"], hello) as (client, _pushes):
                task_status.started(await client.request("whoami"))
                await self.leave.wait()

        self.session = await nursery.start(
            hold, {"agent": "codex", "project": PROJECT, "hostSessionId": "actions-live-1"}
        )
        other = await nursery.start(
            hold, {"agent": "claude", "project": OTHER, "hostSessionId": "actions-live-2"}
        )
        self.names = sorted([self.session["name"], other["name"]])
        return self.broker.dashboard_url()

    async def stop(self) -> None:
        self.leave.set()
        await self.broker.stop()


async def test_actions_need_the_cookie_the_page_token_the_origin_and_json(
    web_home: Path, facts: Facts
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            live = LiveBroker(web_home)
            url = await live.start(nursery)
            base, token = url.split("/?t=")
            origin = base
            async with httpx.AsyncClient(
                base_url=base, headers={"Cookie": f"{auth.COOKIE}={token}"}
            ) as client:
                page = (await client.get("/")).text
                page_token = re.search(r'<meta name="ab-token" content="([^"]+)">', page).group(1)
                assert page_token != token and len(page_token) >= 40  # its own secret, not the cookie's
                good = {"X-AB-Token": page_token, "Origin": origin, "Content-Type": "application/json"}
                body = json.dumps({"topic": "DB", "text": "PostgreSQL 16", "scope": "all"})
                before = decisions_in(web_home)

                refusals = [
                    (
                        await client.post(
                            "/api/decisions", content=body, headers={**good, "X-AB-Token": "nope"}
                        ),
                        403,
                    ),
                    (
                        await client.post(
                            "/api/decisions",
                            content=body,
                            headers={k: v for k, v in good.items() if k != "X-AB-Token"},
                        ),
                        403,
                    ),
                    (
                        await client.post(
                            "/api/decisions", content=body, headers={**good, "Origin": "http://evil.example"}
                        ),
                        403,
                    ),
                    (
                        await client.post(
                            "/api/decisions",
                            content=body,
                            headers={k: v for k, v in good.items() if k != "Origin"},
                        ),
                        403,
                    ),
                    (
                        await client.post(
                            "/api/decisions", content=body, headers={**good, "Content-Type": "text/plain"}
                        ),
                        400,
                    ),
                    (
                        await client.post(
                            "/api/decisions",
                            content=body,
                            headers={**good, "Content-Type": "application/x-www-form-urlencoded"},
                        ),
                        400,
                    ),
                    (await client.post("/api/decisions", content="[1]", headers=good), 400),
                    (
                        await client.post(
                            "/api/decisions", content='{"topic": "x", "text": "y", "by": "me"}', headers=good
                        ),
                        400,
                    ),
                    (
                        await client.post(
                            "/api/decisions", content=json.dumps({"topic": " ", "text": "y"}), headers=good
                        ),
                        400,
                    ),
                    (
                        await client.post(
                            "/api/decisions",
                            content=json.dumps({"topic": "t", "text": "y", "scope": {"project": "rel/dir"}}),
                            headers=good,
                        ),
                        400,
                    ),
                    (await client.put("/api/decisions", content=body, headers=good), 405),
                    (await client.delete("/api/decisions/db/retract", headers=good), 405),
                    (await client.patch("/api/sessions", headers=good), 405),
                    (await client.post("/api/status", content="{}", headers=good), 405),
                    (await client.post("/api/nothing", content="{}", headers=good), 405),
                    (await client.get("/api/decisions/db/retract"), 405),
                ]
                for response, status in refusals:
                    assert response.status_code == status, (response.request.method, response.request.url,
                                                            response.text)
                    assert set(response.json()) == {"error"}
                assert "relative" in refusals[9][0].json()["error"]
                assert decisions_in(web_home) == before  # nothing stored
                async with httpx.AsyncClient(base_url=base) as stranger:  # the token without the cookie
                    assert (
                        await stranger.post("/api/decisions", content=body, headers=good)
                    ).status_code == 403

                # accepted: what `agent-bridge decide --json` prints, author cli
                made = await client.post("/api/decisions", content=body, headers=good)
                assert made.status_code == 200, made.text
                result = made.json()
                assert (
                    set(result) == {"decision", "deliveredTo"} and result["decision"]["author"] == CLI_AUTHOR
                )
                assert result["decision"]["topic"] == "db" and result["deliveredTo"] == live.names
                ghost = await client.post("/api/decisions", headers=good, content=json.dumps(
                    {"topic": "ci", "text": "nox", "scope": {"sessions": ["ghost"]}}))
                # as --json: the unknown address beside it
                assert set(ghost.json()) == {"decision", "deliveredTo"}
                gone = await client.post(
                    "/api/decisions/db/retract", headers=good, content='{"reason": "too early"}'
                )
                assert gone.status_code == 200 and gone.json()["retraction"]["reason"] == "too early"
                again = await client.post("/api/decisions/db/retract", headers=good, content="{}")
                assert again.status_code == 400 and "already retracted" in again.json()["error"]
                sent = await client.post(
                    "/api/messages",
                    headers=good,
                    content=json.dumps({"to": live.session["name"], "text": "please rebase"}),
                )
                assert sent.status_code == 200 and sent.json()["message"]["from"] == CLI_AUTHOR
                assert sent.json()["recipientConnected"] is True
                nobody = await client.post(
                    "/api/messages", headers=good, content='{"to": "nobody", "text": "hi"}'
                )
                assert nobody.status_code == 400 and "`agent-bridge sessions`" in nobody.json()["error"]
                connected = await client.post(
                    f"/api/sessions/{live.session['id']}/forget", headers=good, content=""
                )
                assert connected.status_code == 400 and "is connected" in connected.json()["error"]
                gone_id = facts.peers["codex-proj"]["id"]
                forgot = await client.post(f"/api/sessions/{gone_id}/forget", headers=good, content="")
                assert forgot.status_code == 200, forgot.text
                assert [f["session"]["id"] for f in forgot.json()["forgotten"]] == [gone_id]
            await live.stop()


class OtherOrigin:
    """A page served from another port of 127.0.0.1: same site as the dashboard for cookies,
    another origin; its form posts to the dashboard as soon as it loads."""

    def __init__(self, target: str) -> None:
        body = json.dumps({"topic": "evil", "text": "the attacker decided", "scope": "all"})
        name, value = body[:-1] + ', "x": "', '"}'  # text/plain form: name=value is valid JSON
        self.page = f"""<!doctype html><html><body>
<form id="f" method="POST" action="{target}/api/decisions" enctype="text/plain">
<input type="hidden" name='{name}' value='{value}'></form>
<script>document.getElementById("f").submit()</script></body></html>""".encode()
        handler = partial(_Page, self.page)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/evil.html"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtherOrigin:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Page(http.server.BaseHTTPRequestHandler):
    def __init__(self, page: bytes, *args: Any) -> None:
        self.body = page
        super().__init__(*args)

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        if self.path.endswith("/quiet.html"):  # a page of that origin that stays there
            self.body = b"<!doctype html><title>another origin</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


def overflow(page: Any, selector: str) -> list[int]:
    return page.locator(selector).evaluate("e => [e.scrollWidth, e.clientWidth]")


def drive_actions(
    url: str, home: Path, session: dict[str, Any], told: str, gone: str, artifacts: Path
) -> list[str]:
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 1280, 900, dialogs=True) as (browser, context, page):
        page.goto(url)
        rows = page.locator("#decisions-body tr")
        expect(page.locator("#mode")).to_have_text("broker running")
        name = session["name"]

        # Record a decision for everyone.
        page.get_by_text("Record or change a decision").click()
        page.fill("#decide-topic", "Release Train")
        page.fill("#decide-text", "PostgreSQL 16, no ORM.")
        page.get_by_role("button", name="Record", exact=True).click()
        expect(page.locator("#decide-result")).to_have_text(
            f"Recorded “release train” for everyone (all sessions); told {told}.")
        row = rows.filter(has_text="PostgreSQL 16, no ORM.")
        expect(row).to_have_count(1)
        expect(row.locator(".receipt.pending")).to_have_count(2)
        expect(row.locator(".receipt.pending").filter(has_text=name)).to_have_count(1)
        assert [d for d in decisions_in(home) if d["topic"] == "release train"] == [
            {"topic": "release train", "text": "PostgreSQL 16, no ORM.", "author": "cli"}]

        # Bad input is said on the page, nothing stored.
        page.select_option("#decide-scope-kind", "project")
        page.fill("#decide-scope-value", "relative/folder")
        page.fill("#decide-text", "anything")
        page.get_by_role("button", name="Record", exact=True).click()
        expect(page.locator("#decide-result")).to_contain_text("relative")
        expect(page.locator("#decide-result")).to_have_class(re.compile("error"))
        page.select_option("#decide-scope-kind", "all")

        # Supersede it from its history.
        page.get_by_role("button", name="release train", exact=True).click()
        page.get_by_role("button", name="Change it…").click()
        expect(page.locator("#decide-topic")).to_have_value("release train")
        page.fill("#decide-text", "SQLite for now.")
        page.get_by_role("button", name="Record", exact=True).click()
        expect(page.locator("#decide-result")).to_contain_text("(replacing the earlier one)")
        expect(rows.filter(has_text="SQLite for now.")).to_have_count(1)
        expect(rows.filter(has_text="PostgreSQL 16, no ORM.")).to_have_count(0)
        expect(page.locator("#history-list > li")).to_have_count(2)

        # The table fits its card at 1280 px: no clipped column, no sideways scrolling.
        page.evaluate("window.scrollTo(0, 0)")
        scroll, client = overflow(page, ".table-wrap")
        assert scroll <= client, f"the decisions table is {scroll} px inside {client} px"
        page.screenshot(path=str(artifacts / "dashboard-1280-actions.png"), full_page=True)

        # Retract it, with a reason.
        page.fill("#retract-reason", "decided too early")
        page.get_by_role("button", name="Retract this decision").click()
        expect(page.locator("#retract-result")).to_have_text(f"Retracted “release train”; told {told}.")
        expect(rows.filter(has_text="SQLite for now.")).to_have_count(0)
        expect(page.locator("#history-retracted")).to_contain_text("No current decision")

        # Send a message as the owner.
        page.get_by_text("Send a message as the owner").click()
        page.fill("#send-to", name)
        page.fill("#send-text", "Please rebase on main.")
        page.get_by_role("button", name="Send", exact=True).click()
        expect(page.locator("#send-result")).to_have_text(
            re.compile(rf"^Sent to {re.escape(name)} \(connected\)\. Message [0-9a-f-]{{36}}\.$")
        )
        expect(page.locator("#messages")).to_contain_text("Please rebase on main.")

        # Forget a gone session: two clicks.
        page.click("#gone-summary")
        item = page.locator("#gone-sessions li").filter(has_text=gone)
        item.get_by_role("button", name="Forget").click()
        item.get_by_role("button", name=f"Forget {gone}?").click()
        expect(page.locator("#sessions-result")).to_contain_text(f"Forgot {gone}")
        expect(page.locator("#gone-sessions li").filter(has_text=gone)).to_have_count(0)

        # Decision notices: one line per decision, not one per receiving session.
        page.get_by_role("button", name="Notices", exact=True).click()
        notices = page.locator("#messages li")
        folded = notices.filter(has_text="Decision “release train” for everyone")
        expect(folded).to_have_count(2)  # one line per revision, each sent to both sessions
        expect(folded.first.locator(".route")).to_have_text(f"cli → {told}")
        expect(folded.first).to_contain_text("2 of 2 not read yet")
        expect(page.locator("#messages")).not_to_contain_text("hop 100")
        expect(notices.first).to_contain_text("waits until the session checks its messages")

        # Another origin (another port of 127.0.0.1: the same site, so the browser sends the
        # SameSite=Strict cookie) posts a form to the dashboard as the page loads: refused.
        before = decisions_in(home)
        with OtherOrigin(url.split("/?t=")[0]) as evil:
            attacker = context.new_page()
            with attacker.expect_response(re.compile(r"/api/decisions$")) as answer:
                attacker.goto(evil.url)
            assert answer.value.status == 403, answer.value.status
            assert attacker.url.startswith(url.split("/?t=")[0])  # the form took it to the refusal
            # ... and a script there cannot do it with fetch either (no token, and the preflight fails)
            attacker.goto(evil.url.replace("evil.html", "quiet.html"))
            outcome = attacker.evaluate(
                """target => fetch(target + "/api/decisions", {method: "POST", credentials: "include",
                headers: {"Content-Type": "application/json", "X-AB-Token": "guess"},
                body: JSON.stringify({topic: "evil2", text: "x"})})
                .then(r => "status " + r.status, e => "failed")""",
                url.split("/?t=")[0],
            )
            assert outcome == "failed", outcome
            attacker.close()
        assert decisions_in(home) == before

        # 400 px: the forms fit, no sideways scrolling.
        narrow = browser.new_context(
            viewport={"width": 400, "height": 860}, locale="en-US", timezone_id="UTC"
        )
        phone = narrow.new_page()
        phone.goto(url.replace("/?t=", "/?t="))
        expect(phone.locator("#mode")).to_have_text("broker running")
        phone.get_by_text("Record or change a decision").click()
        phone.get_by_text("Send a message as the owner").click()
        widths = phone.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert widths[0] <= widths[1], f"the page scrolls sideways at 400 px: {widths}"
        phone.screenshot(path=str(artifacts / "dashboard-400-actions.png"), full_page=True)
    return problems


async def test_owner_actions_in_headless_chromium(web_home: Path, facts: Facts) -> None:
    with trio.fail_after(BROWSER_TIMEOUT):
        async with trio.open_nursery() as nursery:
            live = LiveBroker(web_home)
            url = await live.start(nursery)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            count = message_count(web_home)
            gone = next(n for n, p in facts.peers.items() if n not in live.names)
            problems = await trio.to_thread.run_sync(
                partial(drive_actions, url, web_home, live.session, ", ".join(live.names), gone, ARTIFACTS),
                abandon_on_cancel=True,
            )
            assert message_count(web_home) > count
            await live.stop()
    # Expected failed loads: the 400 for the relative folder, the refused cross-origin form (403) and
    # fetch (its preflight refused; Chromium reports it as a CORS error).
    expected = ("status of 400", "status of 403", "CORS", "Failed to fetch", "status of 405")
    assert [p for p in problems if not any(e in p for e in expected)] == []


async def test_a_standalone_dashboard_refuses_actions(
    nursery: trio.Nursery, web_home: Path, facts: Facts
) -> None:
    """No broker: the dashboard is read-only (SPEC §1); an action says how to get one, stores nothing."""
    from webfixtures import start_dashboard

    with trio.fail_after(TIMEOUT):
        running = await start_dashboard(nursery, web_home, standalone=True)
        async with running.client() as client:
            page_token = re.search(
                r'<meta name="ab-token" content="([^"]+)">', (await client.get("/")).text
            ).group(1)
            before = decisions_in(web_home)
            answer = await client.post("/api/decisions", content='{"topic": "t", "text": "x"}', headers={
                "X-AB-Token": page_token, "Origin": running.base, "Content-Type": "application/json"})
    assert answer.status_code == 503 and "read-only" in answer.json()["error"]
    assert "agent-bridge up --detach" in answer.json()["error"]
    assert decisions_in(web_home) == before and not (web_home / "broker.json").exists()

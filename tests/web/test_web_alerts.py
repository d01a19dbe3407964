"""The owner's alerts in the dashboard (SPEC §4.6 "The owner is told", §6): in headless Chromium
with the notifications permission granted, a new question, a message to the owner and a job that
ended (a real `codex` job, offline) each construct one browser Notification while the page is
open, and the tab title counts the open questions; without the permission the page offers its
"Allow alerts" button and constructs none, and the title still counts. A real broker (run_broker
on this Trio loop) with a session on its IPC socket.

`window.Notification` is wrapped by an init script that records each construction before the
real one runs."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from test_web_browser import BROWSER_TIMEOUT, chromium_page
from webfixtures import BrokerInProcess

from agent_bridge.ipc.client import open_bridge_client
from tests.hostbin import host_program
from tests.test_alerts_desktop import codex_offline

pytestmark = pytest.mark.slow
TITLE = "agent-bridge dashboard"
RECORD_NOTIFICATIONS = """
(() => {
  window.__made = [];
  const Real = window.Notification;
  if (typeof Real !== "function") return;
  window.Notification = class extends Real {
    constructor(title, options) {
      window.__made.push({ title: title, body: options && options.body });
      super(title, options);
    }
  };
})();
"""


@asynccontextmanager
async def broker_with_session(home: Path, project: Path) -> AsyncIterator[tuple[str, Any, BrokerInProcess]]:
    """(the dashboard's tokenized URL, a claude session's IPC client, the broker)."""
    async with trio.open_nursery() as nursery:
        broker = BrokerInProcess(home)
        record = await broker.start(nursery)
        async with AsyncExitStack() as stack:
            hello = {"agent": "claude", "project": str(project), "hostSessionId": "alerts-1"}
            client, _pushes = await stack.enter_async_context(open_bridge_client(record["socket"], hello))
            yield broker.dashboard_url(), client, broker
        await broker.stop()


def made(page: Any, prefix: str) -> list[dict[str, Any]]:
    return [n for n in page.evaluate("window.__made") if n["title"].startswith(prefix)]


def drive(url: str, act: Any, granted: bool) -> list[str]:
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 1280, 900) as (browser, context, page):
        base = url.split("/?t=")[0]
        if granted:
            context.grant_permissions(["notifications"], origin=base)
        context.add_init_script(RECORD_NOTIFICATIONS)
        page.goto(url)
        expect(page.locator("#live")).to_have_text("live")
        expect(page).to_have_title(TITLE)
        # the first load only learns what is there: wait for it, so what the test does next is new
        expect(page.locator("html")).to_have_attribute("data-alerts", "watching")
        allow = page.locator("#alerts-allow")
        if not granted:
            expect(allow).to_be_visible()  # permission "default": the owner may allow alerts here
            q = act("ask_owner", question="May I drop the legacy table?")["question"]
            expect(page).to_have_title(f"(1) {TITLE}")
            act("send", to="owner", text="nobody allowed this one")
            expect(page.locator("#messages li").filter(has_text="nobody allowed this one")).to_have_count(1)
            assert page.evaluate("window.__made") == []
            act("answer", id=q["id"])
            expect(page).to_have_title(TITLE)
            return problems
        expect(allow).to_be_hidden()

        q = act("ask_owner", question="Which database for <b>jobs</b>?\nPostgreSQL or SQLite " + "x" * 300)
        expect(page).to_have_title(f"(1) {TITLE}")
        page.wait_for_function("() => window.__made.some((n) => n.title.startsWith('Question from'))")
        [asked] = made(page, "Question from")
        assert asked["title"] == f"Question from {q['question']['askedBy'][0]['name']}"
        assert asked["body"].startswith("Which database for <b>jobs</b>? PostgreSQL or SQLite xxx")
        assert len(asked["body"]) == 200

        act("send", to="owner", text="The migration is done; please look.")
        page.wait_for_function("() => window.__made.some((n) => n.title.startsWith('Message from'))")
        [message] = made(page, "Message from")
        assert message["body"] == "The migration is done; please look."

        job = act("delegate", agent="codex", task="Review the diff and report.")["job"]
        act("cancel", id=job["id"])
        page.wait_for_function("() => window.__made.some((n) => n.title.startsWith('Job '))")
        [ended] = made(page, "Job ")
        assert ended["title"].startswith(f"Job {job['name']} ")
        assert ended["body"] == "Review the diff and report."

        act("answer", id=q["question"]["id"])
        expect(page).to_have_title(TITLE)
        page.reload()  # what was there when the page loaded is not news
        expect(page.locator("#live")).to_have_text("live")
        expect(page.locator("html")).to_have_attribute("data-alerts", "watching")
        expect(page.locator("#jobs li")).to_have_count(1)
        assert page.evaluate("window.__made") == []
    return problems


@pytest.mark.parametrize("granted", [True, False], ids=["allowed", "not-allowed"])
async def test_the_open_page_notifies_the_owner_and_counts_open_questions_in_its_title(
    web_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, granted: bool
) -> None:
    codex = host_program("codex")
    # the broker runs on this loop: its job's host inherits this process's environment
    monkeypatch.setenv("PATH", f"{codex.parent}{os.pathsep}{os.environ['PATH']}")
    for key, value in codex_offline(tmp_path).items():
        monkeypatch.setenv(key, value)
    with trio.fail_after(BROWSER_TIMEOUT):
        project = tmp_path / "proj"
        project.mkdir()
        async with broker_with_session(web_home, project) as (url, client, broker):

            async def act(op: str, **args: Any) -> Any:
                if op == "answer":
                    return await client_of_owner(broker, args["id"])
                if op == "cancel":
                    return await cancel_job(broker, args["id"])
                return await client.request(op, **args)

            def act_sync(op: str, **args: Any) -> Any:  # from the browser's thread
                return trio.from_thread.run(partial(act, op, **args))

            problems = await trio.to_thread.run_sync(
                partial(drive, url, act_sync, granted), abandon_on_cancel=True)
    assert problems == []


async def client_of_owner(broker: BrokerInProcess, question_id: str) -> Any:
    """`agent-bridge answer ID --decline …` as the control request the CLI sends."""
    from agent_bridge.ipc import blocking

    return await trio.to_thread.run_sync(
        partial(blocking.call, broker.home, "answer", questionId=question_id, decline="not now",
                timeout=10.0))


async def cancel_job(broker: BrokerInProcess, job_id: str) -> Any:
    from agent_bridge.ipc import blocking

    def cancel() -> Any:
        try:
            return blocking.call(broker.home, "job_cancel", jobId=job_id, timeout=10.0)
        except Exception as exc:  # noqa: BLE001 - it may have ended by itself already
            return str(exc)

    return await trio.to_thread.run_sync(cancel)

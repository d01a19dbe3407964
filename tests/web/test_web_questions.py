"""Owner questions on the dashboard (SPEC §4.6, §6): `GET /api/questions`, and the owner action
`POST /api/questions/<id>/answer` under the action rules (cookie, page token, Origin, JSON). A
real broker (run_broker on this Trio loop) with sessions on its IPC socket, real HTTP, and
headless Chromium: a question asked while the page is open appears live and is answered with
its option button."""

from __future__ import annotations

import json
import re
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from test_web_browser import ARTIFACTS, BROWSER_TIMEOUT, chromium_page
from webfixtures import OTHER, PROJECT, BrokerInProcess

from agent_bridge.dashboard import auth
from agent_bridge.ipc.client import open_bridge_client

pytestmark = pytest.mark.slow
TIMEOUT = 60
CLI_AUTHOR = {"id": "cli", "name": "cli", "agent": "cli"}


class Askers:
    """A broker with two sessions on its IPC socket that can ask the owner."""

    def __init__(self, home: Path) -> None:
        self.broker = BrokerInProcess(home)
        self.leave = trio.Event()
        self.clients: list[Any] = []
        self.names: list[str] = []

    async def start(self, nursery: trio.Nursery) -> str:
        record = await self.broker.start(nursery)

        async def hold(
            hello: dict[str, Any], task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
        ) -> None:
            async with AsyncExitStack() as stack:
                client, _pushes = await stack.enter_async_context(open_bridge_client(record["socket"], hello))
                self.names.append((await client.request("whoami"))["name"])
                task_status.started(client)
                await self.leave.wait()

        for hello in ({"agent": "codex", "project": PROJECT, "hostSessionId": "questions-1", "kind": "job"},
                      {"agent": "claude", "project": PROJECT, "hostSessionId": "questions-2"},
                      {"agent": "claude", "project": OTHER, "hostSessionId": "questions-3"}):
            self.clients.append(await nursery.start(hold, hello))
        return self.broker.dashboard_url()

    async def ask(self, who: int, **args: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.clients[who].request("ask_owner", **args)
        return result

    async def stop(self) -> None:
        self.leave.set()
        await self.broker.stop()


async def test_questions_are_read_and_answered_under_the_action_rules(web_home: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            live = Askers(web_home)
            url = await live.start(nursery)
            base, token = url.split("/?t=")
            q = (await live.ask(0, question="Which database?", topic="db", options=["PostgreSQL", "SQLite"]))[
                "question"
            ]
            await live.ask(1, question="db?", topic="db")
            other = (await live.ask(2, question="May I delete build/?"))["question"]
            async with httpx.AsyncClient(
                base_url=base, headers={"Cookie": f"{auth.COOKIE}={token}"}
            ) as client:
                listed = (await client.get("/api/questions")).json()
                assert [x["id"] for x in listed["questions"]] == [q["id"], other["id"]]
                assert [a["name"] for a in listed["questions"][0]["askedBy"]] == live.names[:2]
                assert (await client.get("/api/questions?all=yes")).status_code == 400
                async with httpx.AsyncClient(base_url=base) as stranger:
                    assert (await stranger.get("/api/questions")).status_code == 403

                page = (await client.get("/")).text
                page_token = re.search(r'<meta name="ab-token" content="([^"]+)">', page).group(1)
                good = {"X-AB-Token": page_token, "Origin": base, "Content-Type": "application/json"}
                path = f"/api/questions/{q['id']}/answer"
                refusals = [
                    (
                        await client.post(
                            path, content='{"option": 1}', headers={**good, "X-AB-Token": "nope"}
                        ),
                        403,
                    ),
                    (
                        await client.post(
                            path, content='{"option": 1}', headers={**good, "Origin": "http://evil.example"}
                        ),
                        403,
                    ),
                    (
                        await client.post(
                            path, content='{"option": 1}', headers={**good, "Content-Type": "text/plain"}
                        ),
                        400,
                    ),
                    (await client.post(path, content='{"option": 1, "text": "x"}', headers=good), 400),
                    (await client.post(path, content='{"option": 3}', headers=good), 400),
                    (await client.post(path, content='{"option": true}', headers=good), 400),
                    (await client.post(path, content='{"answer": "x"}', headers=good), 400),
                    (await client.post(path, content="{}", headers=good), 400),
                    (
                        await client.post(
                            "/api/questions/nope/answer", content='{"text": "x"}', headers=good
                        ),
                        400,
                    ),
                    (await client.put(path, content='{"option": 1}', headers=good), 405),
                ]
                for response, status in refusals:
                    assert response.status_code == status, (response.request.content, response.text)
                    assert set(response.json()) == {"error"}
                assert (await client.get("/api/questions")).json() == listed  # nothing answered

                done = await client.post(path, content='{"option": 1}', headers=good)
                assert done.status_code == 200, done.text
                result = done.json()  # what `agent-bridge answer --json` prints
                assert set(result) == {"question", "decision", "deliveredTo", "askersTold"}
                assert (
                    result["decision"]["author"] == CLI_AUTHOR
                    and result["decision"]["sourceMessageId"] == q["id"]
                )
                assert (
                    result["decision"]["text"] == "PostgreSQL" and result["question"]["state"] == "answered"
                )
                # the job gets no notice; the other is out of scope
                assert result["deliveredTo"] == [live.names[1]]
                assert result["askersTold"] == sorted(live.names[:2])
                again = await client.post(path, content='{"text": "MySQL"}', headers=good)
                assert again.status_code == 400 and "already answered" in again.json()["error"]

                declined = await client.post(f"/api/questions/{other['id']}/answer", headers=good,
                                             content=json.dumps({"decline": "decide it yourself"}))
                assert declined.status_code == 200, declined.text
                assert declined.json()["question"]["reason"] == "decide it yourself"
                assert declined.json()["decision"] is None
                assert (await client.get("/api/questions")).json() == {"questions": []}
                every = (await client.get("/api/questions?all=1")).json()["questions"]
                assert [x["state"] for x in every] == ["answered", "declined"]
            await live.stop()


def drive(url: str, ask: Any, artifacts: Path) -> list[str]:
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 1280, 900) as (browser, context, page):
        page.goto(url)
        expect(page.locator("#mode")).to_have_text("broker running")
        expect(page.locator("#live")).to_have_text("live")
        expect(page.locator("#questions-card")).to_be_hidden()
        # A draft typed into one question survives the live refresh another question brings.
        first = ask(0, question="May I drop the legacy table?", topic="legacy table")
        item = page.locator("#questions li").filter(has_text="May I drop the legacy table?")
        expect(item).to_have_count(1)  # arrived live: no reload, no click on Refresh
        item.locator(".q-reason").fill("not yet")
        question = ask(0, question="Which database for <b>jobs</b>?", topic="db",
                       options=["PostgreSQL 16", "SQLite"], recommended=1,
                       context="The jobs table holds <i>50</i> rows a day.")["question"]
        card = page.locator("#questions li").filter(has_text="Which database for <b>jobs</b>?")
        expect(card).to_have_count(1)  # as text: the markup is shown, not run
        expect(card.locator("b")).to_have_count(0)
        # what the asker knew, and the option it recommends, marked
        expect(card.locator(".q-context")).to_have_text("The jobs table holds <i>50</i> rows a day.")
        expect(card.locator(".option.recommended")).to_have_count(1)
        expect(card.locator(".option.recommended")).to_contain_text("SQLite")
        expect(card.locator(".option.recommended")).to_contain_text("recommended")
        expect(item.locator(".q-reason")).to_have_value("not yet")
        ask(1, question="Postgres or SQLite?", topic="db")  # joined: the askers line grows
        expect(card.locator(".askers")).to_contain_text(",")
        page.screenshot(path=str(artifacts / "dashboard-questions.png"), full_page=True)
        card.get_by_role("button", name="PostgreSQL 16").click()
        expect(page.locator("#questions-result")).to_contain_text(
            "Answered “Which database for <b>jobs</b>?”"
        )
        expect(page.locator("#questions-result")).to_contain_text("recorded “db” for sessions in")
        expect(card).to_have_count(0)
        expect(page.locator("#decisions-body tr").filter(has_text="PostgreSQL 16")).to_have_count(1)
        item.get_by_role("button", name="Decline").click()
        expect(page.locator("#questions-result")).to_contain_text(
            "Declined “May I drop the legacy table?”"
        )
        expect(page.locator("#questions li")).to_have_count(0)
        assert first["question"]["topic"] == "legacy table" and question["topic"] == "db"
    return problems


async def test_a_question_appears_live_and_is_answered_with_a_button(web_home: Path) -> None:
    with trio.fail_after(BROWSER_TIMEOUT):
        async with trio.open_nursery() as nursery:
            live = Askers(web_home)
            url = await live.start(nursery)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)

            def ask(who: int, **args: Any) -> dict[str, Any]:  # from the browser's thread
                result: dict[str, Any] = trio.from_thread.run(partial(live.ask, who, **args))
                return result

            problems = await trio.to_thread.run_sync(
                partial(drive, url, ask, ARTIFACTS), abandon_on_cancel=True
            )
            await live.stop()
    assert problems == []

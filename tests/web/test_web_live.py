"""What the dashboard adds beside SPEC §6's decision reads: receipts (who got a decision and who
has acknowledged it), notices apart from conversation, and the live stream `GET /api/events`,
fed by the broker's own store commits or, standalone, by bridge.db's data_version.

Everything runs for real: the app on Hypercorn on a loopback socket, the broker's root
(`run_broker`) in this process with its IPC socket, bridge.db written by the broker's Store.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import trio
from webfixtures import PROJECT, TIMEOUT, BrokerInProcess, Facts, Running, start_dashboard

from agent_bridge.dashboard import auth
from agent_bridge.dashboard import live as web_app
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.store.ids import now_ms
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.writer import Store
from tests.shapes import DECISION_FIELDS


def receipts_path(topic: str) -> str:
    return f"/api/decisions/{quote(topic, safe='')}/receipts"


async def get_json(client: httpx.AsyncClient, path: str, status: int = 200) -> Any:
    response = await client.get(path)
    assert response.status_code == status, (path, response.status_code, response.text)
    return response.json()


class Events:
    """One open `/api/events` stream, read event by event."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()

    async def next(self) -> tuple[str, dict[str, Any] | None]:
        """The next event (name, data); comments (keep-alives) are skipped."""
        name, data = "message", None
        async for line in self.lines:
            if line == "":
                if data is not None:
                    return name, data
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data = json.loads(value)
        raise EOFError("the stream ended")

    async def rest(self) -> list[str]:
        """Read to the end of the stream; what was left."""
        return [line async for line in self.lines]


@asynccontextmanager
async def open_events(client: httpx.AsyncClient) -> AsyncIterator[Events]:
    async with client.stream("GET", "/api/events") as response:
        assert response.status_code == 200, response.status_code
        assert response.headers["content-type"].startswith("text/event-stream")
        yield Events(response)


# --- receipts -------------------------------------------------------------------------------


async def test_receipts_say_who_got_a_decision_and_who_acknowledged_it(
    dashboard: Running, facts: Facts
) -> None:
    codex = facts.peers["codex-proj"]
    current = next(d for d in facts.current() if d["topic"] == "build / ci")
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            everything = await get_json(client, "/api/receipts")
            topic = await get_json(client, receipts_path("Build / CI"))
            assert await get_json(client, receipts_path("no such topic")) == {
                "topic": "no such topic",
                "receipts": [],
            }
            bad = await get_json(client, receipts_path(" "), status=400)
            assert "topic" in bad["error"]
            # Acknowledged by the session (its MCP server showed it): no longer pending.
            store = Store.open(dashboard.home / "bridge.db")
            try:
                (notice,) = [m.id for m in store.unacked(codex["id"]) if m.kind == "decision"]
                acked_at = now_ms()
                assert store.ack(codex["id"], [notice], acked_at) == 1
            finally:
                store.close()
            after = await get_json(client, "/api/receipts")
    # The one decision recorded with a recipient: queued for codex-proj, not connected, pending.
    expected = {
        "decisionId": current["id"],
        "topic": "build / ci",
        "session": {"id": codex["id"], "name": "codex-proj", "agent": "codex", "connected": False},
        "queuedAt": current["createdAt"],
        "deliveredAt": None,
        "acknowledgedAt": None,
        "pending": True,
    }
    assert everything == {"receipts": [expected]}
    assert topic == {"topic": "build / ci", "receipts": [expected]}
    assert after == {
        "receipts": [{**expected, "deliveredAt": acked_at, "acknowledgedAt": acked_at, "pending": False}]
    }
    # Decision objects keep exactly their fields (SPEC §6): receipts live beside them.
    async with dashboard.client() as client:
        (decision,) = (await get_json(client, "/api/decisions?q=nox"))["decisions"]
    assert set(decision) == DECISION_FIELDS


async def test_receipts_read_an_older_database_as_empty(nursery: trio.Nursery, web_home: Path) -> None:
    from webfixtures import build_old_database

    build_old_database(web_home, 2)
    running = await start_dashboard(nursery, web_home)
    with trio.fail_after(TIMEOUT):
        async with running.client() as client:
            assert await get_json(client, "/api/receipts") == {"receipts": []}
            assert await get_json(client, receipts_path("camera")) == {"topic": "camera", "receipts": []}
            notices = await get_json(client, "/api/messages?kind=notice")
            conversation = await get_json(client, "/api/messages?kind=message")
    assert notices == {"messages": []}
    assert [m["text"] for m in conversation["messages"]] == ["hi"]


# --- notices apart from conversation --------------------------------------------------------


async def test_messages_split_into_conversation_and_notices(dashboard: Running, facts: Facts) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            both = (await get_json(client, "/api/messages"))["messages"]
            notices = (await get_json(client, "/api/messages?kind=notice"))["messages"]
            conversation = (await get_json(client, "/api/messages?kind=message"))["messages"]
            bad = await get_json(client, "/api/messages?kind=decision", status=400)
    assert "kind" in bad["error"] and "notice" in bad["error"]
    assert [m["kind"] for m in notices] == ["decision"]
    assert notices[0]["notice"] is True and notices[0]["active"] is False  # hop 100 against the limit 10
    assert notices[0]["decision"]["topic"] == "build / ci"
    assert [m["text"] for m in conversation] == [m["text"] for m in reversed(facts.messages)]
    assert [(m["hop"], m["notice"], m["active"]) for m in conversation] == [
        (2, False, True),
        (1, False, True),
    ]
    assert len(both) == 3


async def test_active_follows_the_configured_hop_limit(
    nursery: trio.Nursery, web_home: Path, facts: Facts
) -> None:
    (web_home / "config.toml").write_text("hop_limit = 2\n", encoding="utf-8")
    running = await start_dashboard(nursery, web_home)
    with trio.fail_after(TIMEOUT):
        async with running.client() as client:
            status = await get_json(client, "/api/status")
            conversation = (await get_json(client, "/api/messages?kind=message"))["messages"]
    assert status["hopLimit"] == 2
    assert [(m["hop"], m["active"]) for m in conversation] == [(2, False), (1, True)]


# --- the live stream ------------------------------------------------------------------------


def cookie_client(home: Path) -> httpx.AsyncClient:
    url = (home / "dashboard.url").read_text(encoding="utf-8").strip()
    base, token = url.split(f"/?{auth.TOKEN_PARAM}=", 1)
    return httpx.AsyncClient(base_url=base, headers={"Cookie": f"{auth.COOKIE}={token}"}, timeout=TIMEOUT)


async def test_a_decide_through_ipc_reaches_an_open_stream(web_home: Path, facts: Facts) -> None:
    """In the broker the stream is fed by the store's commits: a decide made by a session over
    the IPC socket arrives as a change event, and the receipts then name the sessions it was
    queued for."""
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = BrokerInProcess(web_home)
            record = await broker.start(nursery)
            async with cookie_client(web_home) as client, open_events(client) as events:
                assert await events.next() == ("hello", {"version": 0, "mode": "broker"})
                hello = {"agent": "claude", "project": PROJECT, "hostSessionId": "live-host-1"}
                async with open_bridge_client(record["socket"], hello) as (bridge, _pushes):
                    result = await bridge.request(
                        "decide", topic="Deploys", text="Friday never.", scope="all"
                    )
                    name, data = await events.next()
                    assert name == "change" and data is not None and data["version"] >= 1
                    receipts = await get_json(client, receipts_path("deploys"))
                    sessions = await get_json(client, "/api/sessions")
            await broker.stop()
    assert result["deliveredTo"] == [bridge.hello["session"]["name"]]
    assert [
        (r["session"]["name"], r["session"]["connected"], r["pending"]) for r in receipts["receipts"]
    ] == [(bridge.hello["session"]["name"], True, True)]
    assert bridge.hello["session"]["id"] in {s["id"] for s in sessions["sessions"]}


async def test_standalone_stream_sees_another_writer_commit(
    nursery: trio.Nursery, web_home: Path, facts: Facts
) -> None:
    """Standalone nothing in the process writes: the stream notices bridge.db's data_version."""
    running = await start_dashboard(nursery, web_home, standalone=True)
    with trio.fail_after(TIMEOUT):
        async with running.client() as client, open_events(client) as events:
            assert await events.next() == ("hello", {"version": 0, "mode": "standalone"})
            store = Store.open(web_home / "bridge.db")
            try:
                claude, codex = facts.peers["claude-proj"], facts.peers["codex-proj"]
                store.send_messages(
                    claude["id"], [Outgoing(codex["id"], "written while you watched", 1, None)], now_ms()
                )
            finally:
                store.close()
            name, data = await events.next()
            assert name == "change" and data == {"version": 1}
            messages = await get_json(client, "/api/messages?limit=1")
    assert messages["messages"][0]["text"] == "written while you watched"


async def test_stream_ends_cleanly_when_the_dashboard_stops_and_the_old_cookie_is_refused(
    web_home: Path, facts: Facts
) -> None:
    """Stopping the dashboard ends its streams (a clean end of the body, not a connection cut
    at the shutdown deadline); the next start has a new token, so the page's reconnect gets
    403 and the page says it is no longer authorized."""
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            first = trio.CancelScope()

            async def serve_first(task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED) -> None:
                with first:
                    async with trio.open_nursery() as own:
                        task_status.started(await start_dashboard(own, web_home, port=0))
                        await trio.sleep_forever()

            running = await nursery.start(serve_first)
            async with running.client() as client, open_events(client) as events:
                assert (await events.next())[0] == "hello"
                first.cancel()  # the dashboard stops, as when its broker shuts down
                assert await events.rest() == []  # the body ended: no error, nothing more
            again = await start_dashboard(nursery, web_home, port=running.port)
            assert again.token != running.token
            async with running.client() as stale:
                response = await stale.get("/api/events")
            assert response.status_code == 403 and response.json() == {"error": "forbidden"}
            nursery.cancel_scope.cancel()


async def test_live_streams_per_client_are_capped(dashboard: Running) -> None:
    limit = web_app.STREAMS_PER_CLIENT
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            async with trio.open_nursery() as nursery:
                opened = trio.Semaphore(0)
                release = trio.Event()

                async def hold() -> None:
                    async with dashboard.client() as own, open_events(own) as events:
                        await events.next()
                        opened.release()
                        await release.wait()

                for _ in range(limit):
                    nursery.start_soon(hold)
                for _ in range(limit):
                    await opened.acquire()
                refused = await client.get("/api/events")
                assert refused.status_code == 429
                assert "too many live streams" in refused.json()["error"]
                # Ordinary requests still work while the streams are open.
                assert (await client.get("/api/status")).status_code == 200
                release.set()
            # Streams closed by their clients free their places.
            while True:
                async with client.stream("GET", "/api/events") as response:
                    if response.status_code == 200:
                        break
                await trio.sleep(0.05)


@pytest.mark.parametrize("path", ["/api/events", receipts_path("camera"), "/api/receipts"])
async def test_new_endpoints_are_guarded(dashboard: Running, path: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client(cookie=False) as client:
            wrong_host = await client.get(path, headers={"Host": f"evil.example:{dashboard.port}",
                                                         "Cookie": f"{auth.COOKIE}={dashboard.token}"})
            cross = await client.get(path, headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors",
                                                    "Cookie": f"{auth.COOKIE}={dashboard.token}"})
        async with dashboard.client() as client, client.stream("GET", path) as right:
            allowed = right.status_code
    assert wrong_host.status_code == 403
    assert cross.status_code == 403
    assert allowed == 200  # the same request with the right Host and cookie



async def test_a_watcher_that_breaks_ends_the_stream_not_the_dashboard(
    nursery: trio.Nursery,
    web_home: Path,
    facts: Facts,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Standalone, a failure watching bridge.db (here an unexpected error from the check,
    injected) is logged; the stream ends, so the page polls, and the dashboard keeps serving."""
    from agent_bridge.dashboard import changes

    def broken(self: object) -> tuple[int | None, int | None]:
        raise ValueError("injected: the watcher cannot read")

    monkeypatch.setattr(changes._Watcher, "stamp", broken)
    running = await start_dashboard(nursery, web_home, standalone=True)
    with trio.fail_after(TIMEOUT):
        async with running.client() as client:
            async with open_events(client) as events:
                assert await events.rest() == []
            assert (await client.get("/api/status")).status_code == 200
    assert "watching" in caplog.text and "injected: the watcher cannot read" in caplog.text


async def test_retraction_notices_are_notices_and_a_retracted_topic_keeps_its_receipts(
    dashboard: Running, facts: Facts
) -> None:
    from agent_bridge.common import domain

    claude = facts.peers["claude-proj"]
    author = domain.SessionView(claude["id"], claude["name"], claude["project"], claude["hostSessionId"])
    store = Store.open(dashboard.home / "bridge.db")
    try:
        retraction, notified = store.retract(topic="build / ci", reason="CI moves elsewhere", author=author,
                                             author_agent="claude", connected=[], now=now_ms())
    finally:
        store.close()
    assert [name for _, name in notified] == ["codex-proj"]  # it was sent the retracted revision
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            notices = (await get_json(client, "/api/messages?kind=notice"))["messages"]
            conversation = (await get_json(client, "/api/messages?kind=message"))["messages"]
            current = await get_json(client, "/api/receipts")
            topic = await get_json(client, receipts_path("build / ci"))
    assert [(m["kind"], m["notice"], m["active"]) for m in notices] == [("retraction", True, False),
                                                                          ("decision", True, False)]
    assert notices[0]["retraction"]["reason"] == "CI moves elsewhere"
    assert all(m["kind"] == "message" for m in conversation)
    assert current == {"receipts": []}  # no current decision has a receipt any more
    assert [(r["topic"], r["session"]["name"], r["pending"]) for r in topic["receipts"]] == [
        ("build / ci", "codex-proj", True)
    ]


async def test_a_forgotten_session_leaves_the_receipts(dashboard: Running, facts: Facts) -> None:
    """`agent-bridge forget` drops what was queued to a gone session: it is not listed among
    the sessions a decision is waiting for."""
    codex = facts.peers["codex-proj"]
    store = Store.open(dashboard.home / "bridge.db")
    try:
        store.forget_peers([codex["id"]], now_ms())
    finally:
        store.close()
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            current = await get_json(client, "/api/receipts")
            topic = await get_json(client, receipts_path("build / ci"))
    assert current == {"receipts": []}
    assert topic == {"topic": "build / ci", "receipts": []}

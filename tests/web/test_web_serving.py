"""serve_dashboard: ports, token rotation, dashboard.url, shutdown (SPEC §2, §6)."""

from __future__ import annotations

import errno
import logging
import socket
import stat
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
from webfixtures import TIMEOUT, build_database, start_dashboard

from agent_bridge.dashboard import deferred, server
from agent_bridge.dashboard.port import DEFAULT_PORT, PORT_ENV, DashboardError, requested_port
from agent_bridge.dashboard.server import serve_dashboard


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) in (errno.ECONNREFUSED, errno.ECONNRESET)


async def test_token_rotates_on_restart_and_the_old_one_is_refused(web_home: Path) -> None:
    build_database(web_home)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            first = await start_dashboard(nursery, web_home)
            async with first.client() as client:
                assert (await client.get("/api/decisions")).status_code == 200
            nursery.cancel_scope.cancel()
        assert not (web_home / "dashboard.url").exists()  # removed with the dashboard that wrote it
        assert refused(first.port)

        async with trio.open_nursery() as nursery:
            second = await start_dashboard(nursery, web_home, port=first.port)  # same port, new token
            assert second.base == first.base and second.token != first.token
            assert (web_home / "dashboard.url").read_text() == second.url
            async with httpx.AsyncClient(base_url=second.base) as client:
                old_cookie = {"Cookie": f"ab_ui={first.token}"}
                assert (await client.get("/api/decisions", headers=old_cookie)).json() == {
                    "error": "forbidden"
                }
                assert (await client.get("/", headers=old_cookie)).status_code == 403
                old_link = await client.get(first.url.removeprefix(first.base))
                assert old_link.status_code == 403 and "set-cookie" not in old_link.headers
                new_link = await client.get(second.url.removeprefix(second.base))
                assert new_link.status_code == 303
                assert (
                    await client.get("/api/decisions", headers={"Cookie": f"ab_ui={second.token}"})
                ).status_code == 200
            nursery.cancel_scope.cancel()


async def test_started_reports_the_base_url_after_listening(nursery: trio.Nursery, web_home: Path) -> None:
    with trio.fail_after(TIMEOUT):
        base = await nursery.start(serve_dashboard, web_home)  # AGENT_BRIDGE_WEB_PORT or the default
        url = (web_home / "dashboard.url").read_text()
        assert url.startswith(base + "/?t=") and "\n" not in url
        assert stat.S_IMODE((web_home / "dashboard.url").stat().st_mode) == 0o600
        async with httpx.AsyncClient() as client:
            assert (await client.get(url)).status_code == 303  # listening as soon as started() returned


async def test_connections_close_after_each_response_so_shutdown_is_prompt(web_home: Path) -> None:
    """A browser keeps connections open; every response says `Connection: close` (see the note in
    app.py), so a shutdown never waits out the graceful timeout for idle connections."""
    with trio.fail_after(TIMEOUT) as guard:
        async with httpx.AsyncClient() as client:  # a pooling client, like a browser
            async with trio.open_nursery() as nursery:
                running = await start_dashboard(nursery, web_home)
                for path in (running.url, running.base + "/api/nothing"):
                    response = await client.get(path)
                    assert response.headers["connection"] == "close"
                response = await client.get(running.base + "/", headers={"Cookie": f"ab_ui={running.token}"})
                assert response.status_code == 200 and response.headers["connection"] == "close"
                guard.deadline = trio.current_time() + server.GRACEFUL_TIMEOUT  # a ceiling, not a measurement
                nursery.cancel_scope.cancel()
        assert refused(running.port)


def test_requested_port_rules() -> None:
    assert requested_port(None, {}) == (DEFAULT_PORT, False)
    assert requested_port(None, {PORT_ENV: ""}) == (DEFAULT_PORT, False)
    assert requested_port(None, {PORT_ENV: "0"}) == (0, True)
    assert requested_port(None, {PORT_ENV: " 8123 "}) == (8123, True)
    assert requested_port(5000, {PORT_ENV: "8123"}) == (5000, True)
    assert requested_port(0, {}) == (0, True)
    for bad in ("abc", "-1", "65536", "80.5", "0x50", "8080 8081"):
        with pytest.raises(DashboardError, match=PORT_ENV + r": expected a port number 0\.\.65535"):
            requested_port(None, {PORT_ENV: bad})
    for bad_arg in (-1, 65536, True):
        with pytest.raises(DashboardError, match="port: expected 0..65535"):
            requested_port(bad_arg, {})


async def test_invalid_port_setting_refuses_to_start(web_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_ENV, "web")
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            with pytest.raises(DashboardError, match="AGENT_BRIDGE_WEB_PORT: expected a port number"):
                await nursery.start(serve_dashboard, web_home)
    assert not (web_home / "dashboard.url").exists()


def occupy(port: int) -> socket.socket | None:
    """Listen on `port` ourselves; None when something else already does (it is taken either way)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError:
        sock.close()
        return None
    return sock


@pytest.mark.serial  # the fixed default port: no other test of the suite may take it meanwhile
async def test_default_port_falls_back_to_a_free_one_when_taken(
    nursery: trio.Nursery, web_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PORT_ENV, raising=False)
    holder = occupy(DEFAULT_PORT)
    try:
        with trio.fail_after(TIMEOUT):
            base = await nursery.start(serve_dashboard, web_home)
            port = int(base.rsplit(":", 1)[1])
            assert port != DEFAULT_PORT
            async with httpx.AsyncClient() as client:
                assert (await client.get((web_home / "dashboard.url").read_text())).status_code == 303
    finally:
        if holder is not None:
            holder.close()


@pytest.mark.parametrize("how", ["argument", "environment"])
async def test_an_explicit_port_in_use_is_an_error(
    web_home: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        kwargs = {"port": taken} if how == "argument" else {}
        monkeypatch.setenv(PORT_ENV, str(taken))
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                with pytest.raises(DashboardError, match=f"cannot listen on 127.0.0.1:{taken}"):
                    await nursery.start(
                        lambda task_status: serve_dashboard(web_home, task_status=task_status, **kwargs)
                    )
    finally:
        holder.close()


async def test_a_home_that_cannot_take_dashboard_url_is_an_error(web_home: Path) -> None:
    (web_home / "dashboard.url").mkdir()  # not a file: writing it fails for root too
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            with pytest.raises(DashboardError, match="cannot write .*dashboard.url"):
                await nursery.start(serve_dashboard, web_home)


async def test_cancelled_while_starting_returns_promptly(web_home: Path) -> None:
    """The broker may be told to stop while the dashboard is still starting: no hang, no leftovers."""
    with trio.fail_after(TIMEOUT):
        with trio.CancelScope() as scope:
            scope.cancel()
            await serve_dashboard(web_home, port=0)
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(0):  # cancelled at the first checkpoint inside start()
                await nursery.start(serve_dashboard, web_home)
    assert not (web_home / "dashboard.url").exists()


async def test_the_token_is_never_logged(web_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    build_database(web_home)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            running = await start_dashboard(nursery, web_home)
            async with running.client(cookie=False) as client:
                await client.get(running.url)
                await client.get(running.url, headers={"Host": "evil.example"})
                await client.get("/?t=" + running.token[::-1])
            async with running.client() as client:
                await client.get("/api/decisions?scope=bad")
                await client.get("/api/nothing")
            nursery.cancel_scope.cancel()
    # Everything the server side logged (the test's own HTTP client logs its request URLs).
    server_side = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert any(r.name == server.LOGGER for r in server_side), "Hypercorn logs through agent_bridge.dashboard"
    text = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in server_side)
    assert running.token not in text
    assert running.token[::-1] not in text


# --- the broker's: listening first, the server once wanted (dashboard/deferred.py) -------------


def broker_dashboard(home: Path, settled: trio.Event) -> partial[object]:
    return partial(deferred.serve_dashboard, home, live=frozenset, changes=None, port=0, hub=lambda: None,
                   settled=settled, importing=trio.CapacityLimiter(1))


class Serving(logging.Handler):
    """Sets `now` at Hypercorn's "Running on" (the dashboard's logger), which it logs as it starts
    serving, just before it reports started."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.now = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Running on"):
            self.now.set()


@pytest.fixture
def serving() -> Iterator[Serving]:
    handler, logger = Serving(), logging.getLogger(server.LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_the_broker_s_dashboard_listens_and_publishes_first_and_serves_a_browser_that_connects(
    web_home: Path, serving: Serving
) -> None:
    """Before `started`: the socket listens and dashboard.url holds this start's URL, but nothing is
    served until it is wanted. Sessions never settle here: the browser's connection, waiting to be
    accepted, is what starts the server, and its request is answered. Cancelled: no socket, no URL."""
    build_database(web_home)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            base = await nursery.start(broker_dashboard(web_home, trio.Event()))
            url = (web_home / "dashboard.url").read_text()
            assert url.startswith(base + "/?t=")
            await trio.testing.wait_all_tasks_blocked()
            assert not serving.now.is_set()  # waits for a browser or the sessions to settle
            async with httpx.AsyncClient() as client:
                link = await client.get(url)
                assert link.status_code == 303
                assert (await client.get(base + "/api/decisions")).status_code == 200  # the cookie
            assert serving.now.is_set()
            nursery.cancel_scope.cancel()
    assert refused(int(base.rsplit(":", 1)[1]))
    assert not (web_home / "dashboard.url").exists()


STARTS = 30  # starts stopped at "Running on" per test: trio runs the woken tasks in a random order


@pytest.mark.parametrize("serve", ["serve_dashboard", "the broker's"])
async def test_a_stop_as_hypercorn_starts_is_a_graceful_one(
    web_home: Path, serving: Serving, serve: str
) -> None:
    """A stop at Hypercorn's "Running on" (a broker told to stop as its dashboard starts serving):
    the server stops as at any other time, with no error and no dashboard.url left. Hypercorn
    cancelled from outside as it starts fails in its own shutdown (`ClosedResourceError` from its
    lifespan channel): 18 of 40 such starts did before it ran shielded from the start."""
    for _ in range(STARTS):
        serving.now = trio.Event()
        if serve == "serve_dashboard":
            start = partial(serve_dashboard, web_home, port=0)
        else:
            settled = trio.Event()
            settled.set()  # serves at once
            start = broker_dashboard(web_home, settled)
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(start)
                await serving.now.wait()
                nursery.cancel_scope.cancel()
        assert not (web_home / "dashboard.url").exists()


async def test_the_broker_s_dashboard_serves_once_the_sessions_settle(
    web_home: Path, serving: Serving
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            settled = trio.Event()
            await nursery.start(broker_dashboard(web_home, settled))
            await trio.testing.wait_all_tasks_blocked()
            assert not serving.now.is_set()
            settled.set()
            await serving.now.wait()  # with nobody connected
            nursery.cancel_scope.cancel()


async def test_the_broker_s_dashboard_stopped_before_it_served_leaves_nothing(web_home: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            base = await nursery.start(broker_dashboard(web_home, trio.Event()))
            await trio.testing.wait_all_tasks_blocked()  # waiting to be wanted
            nursery.cancel_scope.cancel()
    assert refused(int(base.rsplit(":", 1)[1]))
    assert not (web_home / "dashboard.url").exists()


@pytest.mark.parametrize("setting", ["argument", "home"])
async def test_the_broker_s_dashboard_refuses_before_started(web_home: Path, setting: str) -> None:
    """A port in use, or a home that cannot take dashboard.url: DashboardError before `started`,
    as `up` reports it (exit 1)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        if setting == "home":
            (web_home / "dashboard.url").mkdir()
        start = broker_dashboard(web_home, trio.Event())
        if setting == "argument":
            start = partial(start, port=taken)
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                with pytest.raises(DashboardError, match=f"cannot listen on 127.0.0.1:{taken}"
                                   if setting == "argument" else "cannot write .*dashboard.url"):
                    await nursery.start(start)
    finally:
        holder.close()

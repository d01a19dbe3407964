"""SPEC §6, §8 for the dashboard's HTTP surface: generated paths and query strings, sent raw
(any bytes, percent-encoded or not, invalid encodings included), never produce a server
error. Every answer is a deliberate one (200, a redirect, 400 naming the problem, 403, 404,
405), JSON where the API promises JSON, with the hardening headers; nothing is logged as a
failure."""

from __future__ import annotations

import http.client
import json
import logging
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_bridge.common import domain
from agent_bridge.dashboard import auth
from agent_bridge.dashboard.app import FORBIDDEN_CSP
from agent_bridge.dashboard.server import serve_dashboard
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.ids import now_ms
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.writer import Store
from tests.reliability.harness import TrioThread
from tests.reliability.test_hostile_input import FUZZ

pytestmark = pytest.mark.slow

ANSWERS = {200, 303, 400, 403, 404, 405}
PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F))  # what a request line can carry raw


def build_home(home: Path) -> None:
    home.mkdir(mode=0o700, parents=True)
    store = Store.open(home / "bridge.db")
    try:
        now = now_ms()
        a = store.create_peer(agent="claude", name="claude-web", project="/w/web", kind="interactive",
                              host_session_id="h-web", now=now)
        view = a.view()
        for topic, text, scope in (
            ("db", "PostgreSQL", "all"),
            ("Café / ü", "espresso", {"project": "/w/web"}),
            ("db", "SQLite", {"sessions": ["claude-web"]}),
        ):
            store.record_decision(
                author=view,
                author_agent="claude",
                topic=domain.normalize_topic(topic),
                text=text,
                scope=domain.parse_scope(scope),
                source_message_id=None,
                recipients=[Recipient(view, "h-web")],
                now=now,
            )
        store.send_messages(a.id, [Outgoing(a.id, "note to self", 1, None)], now)
    finally:
        store.close()


class Failures(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def dashboard() -> Iterator[dict[str, Any]]:
    failures = Failures()
    logging.getLogger().addHandler(failures)
    with tempfile.TemporaryDirectory(prefix="ab-web-") as folder:
        home = Path(folder) / "home"
        build_home(home)

        async def serve(thread: TrioThread, stop: trio.Event) -> None:
            async with trio.open_nursery() as nursery:
                base = await nursery.start(partial(serve_dashboard, home, live=lambda: frozenset(), port=0))
                url = (home / "dashboard.url").read_text(encoding="utf-8")
                thread.value = {
                    "port": int(base.rsplit(":", 1)[1]),
                    "token": url.split("?t=", 1)[1],
                    "failures": failures,
                }
                thread.ready()
                await stop.wait()
                nursery.cancel_scope.cancel()

        thread = TrioThread().start(serve)
        try:
            yield thread.value
        finally:
            thread.stop()
            logging.getLogger().removeHandler(failures)


def get(d: dict[str, Any], target: str, *, cookie: bool = True) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", d["port"], timeout=30)
    try:
        headers = {"Host": f"127.0.0.1:{d['port']}"}
        if cookie:
            headers["Cookie"] = f"{auth.COOKIE}={d['token']}"
        conn.request("GET", target, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


raw_text = st.text(PRINTABLE, max_size=40)
encoded_bytes = st.binary(max_size=40).map(lambda b: quote(b, safe=""))
encoded_text = st.text(max_size=40).map(lambda t: quote(t, safe=""))
bad_escapes = st.sampled_from(["%", "%2", "%zz", "%C3", "%C3%28", "%FF%FE", "%00", "%2F..%2F", "%E2%80%AE"])
piece = st.one_of(
    raw_text, encoded_bytes, encoded_text, bad_escapes, st.text(PRINTABLE, min_size=300, max_size=2000)
)
scopes = st.sampled_from(
    [
        "all",
        '{"project":"/w/web"}',
        '{"sessions":["claude-web"]}',
        '{"folder":"/x"}',
        "{",
        "[]",
        '{"project":"relative"}',
        '{"sessions":[]}',
        "null",
        '"all"',
    ]
)
query_value = st.one_of(
    piece, scopes.map(lambda s: quote(s, safe="")), scopes, st.integers(-10, 10**6).map(str)
)
query = st.lists(
    st.tuples(st.sampled_from(["q", "scope", "limit", "t", "topic"]) | raw_text, query_value), max_size=4
).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs))
target = st.one_of(
    st.tuples(piece, query).map(lambda t: f"/api/decisions/{t[0]}/history" + (f"?{t[1]}" if t[1] else "")),
    query.map(lambda q: f"/api/decisions?{q}"),
    query.map(lambda q: f"/api/messages?{q}"),
    st.tuples(st.sampled_from(["/api/sessions", "/api/status", "/", "/static/app.js"]), query).map(
        lambda t: f"{t[0]}?{t[1]}"
    ),
    st.lists(piece, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts)),
    st.lists(piece, min_size=1, max_size=3).map(lambda parts: "/api/" + "/".join(parts)),
)


def test_hostile_paths_and_query_strings(dashboard):
    ran: list[str] = []

    @settings(FUZZ, max_examples=150)
    @given(path=target, cookie=st.booleans() | st.just(True))
    def check(path: str, cookie: bool) -> None:
        ran.append(path)
        status, headers, body = get(dashboard, path, cookie=cookie)
        assert status in ANSWERS, (status, body[:300])
        # The styled 403 page allows exactly its own style block by hash; everything else the strict policy.
        page_403 = status == 403 and headers.get("content-type", "").startswith("text/html")
        assert headers.get("content-security-policy") == (FORBIDDEN_CSP if page_403 else auth.CSP)
        assert headers.get("x-content-type-options") == "nosniff"
        assert headers.get("cache-control") == "no-store"
        if not cookie and not path.startswith("/?") and path != "/":
            assert status in (403, 404), status  # nothing of substance without the cookie
        if path.startswith("/api/") and status != 303:
            data = json.loads(body)
            if status >= 400:
                assert isinstance(data.get("error"), str) and len(data["error"]) >= 5, data
        if status == 400:
            assert any(
                word in json.loads(body)["error"] for word in ("topic", "scope", "query", "limit", "UTF-8")
            ), body
        assert not dashboard["failures"].records, [r.getMessage() for r in dashboard["failures"].records]

    check()
    assert len(ran) >= 50
    # and it still answers a normal request with the fixture's data
    status, _, body = get(dashboard, "/api/decisions/" + quote("café / ü", safe="") + "/history")
    assert status == 200 and json.loads(body)["decisions"][0]["text"] == "espresso"

"""The dashboard's HTTP surface (SPEC §6) against the real app on a real Hypercorn socket."""

from __future__ import annotations

import json
import stat
from urllib.parse import quote

import pytest
import trio
from webfixtures import OTHER, PROJECT, TIMEOUT, Facts, Running

from agent_bridge.dashboard import auth
from agent_bridge.dashboard.app import FORBIDDEN_CSP
from tests.shapes import DECISION_FIELDS

API_PATHS = [
    "/api/decisions",
    "/api/decisions/camera/history",
    "/api/sessions",
    "/api/messages",
    "/api/status",
    "/api/receipts",
    "/api/decisions/camera/receipts",
    "/api/events",
    "/api/search?q=nox",
]
GUARDED_PATHS = ["/", "/static/app.js", "/static/app.css", "/api/nothing", "/nothing", *API_PATHS]


def history_path(topic: str) -> str:
    """What the page requests: `/api/decisions/<encodeURIComponent(topic)>/history`."""
    return f"/api/decisions/{quote(topic, safe='')}/history"


def assert_hardened(response) -> None:
    headers = response.headers
    if response.status_code == 403 and headers["content-type"].startswith("text/html"):
        # The styled forbidden page: the same policy, with its one inline style allowed by hash.
        assert headers["content-security-policy"] == FORBIDDEN_CSP
        assert FORBIDDEN_CSP.replace(FORBIDDEN_CSP.split("; ")[2], "style-src 'self'") == auth.CSP
    else:
        assert headers["content-security-policy"] == auth.CSP
    assert "default-src 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-store"
    assert headers["referrer-policy"] == "no-referrer"
    assert not [name for name in headers if name.lower().startswith("access-control-")]


# --- the token, the cookie, the guards ------------------------------------------------------


async def test_dashboard_url_file_and_token(dashboard: Running) -> None:
    url_file = dashboard.home / "dashboard.url"
    assert stat.S_IMODE(url_file.stat().st_mode) == 0o600
    assert dashboard.url == f"http://127.0.0.1:{dashboard.port}/?t={dashboard.token}"
    assert dashboard.base == f"http://127.0.0.1:{dashboard.port}"
    # 32 random bytes, URL-safe base64 without padding
    assert len(dashboard.token) == 43 and set(dashboard.token) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )


async def test_token_url_sets_cookie_and_redirects_without_token(dashboard: Running) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client(cookie=False) as client:
            response = await client.get(dashboard.url)
            assert response.status_code == 303
            assert response.headers["location"] == "/"
            assert_hardened(response)
            cookie = response.headers["set-cookie"]
            parts = [p.strip() for p in cookie.split(";")]
            assert parts[0] == f"ab_ui={dashboard.token}"
            attributes = {
                p.split("=")[0].lower(): (p.split("=", 1)[1] if "=" in p else True) for p in parts[1:]
            }
            assert attributes["httponly"] is True
            assert attributes["samesite"] == "Strict"
            assert attributes["path"] == "/"
            assert "secure" not in attributes and "domain" not in attributes

            # The browser follows the redirect with the cookie: the page, no token in sight.
            page = await client.get("/", headers={"Cookie": parts[0]})
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            assert '<script src="/static/app.js"' in page.text
            assert dashboard.token not in page.text
            assert_hardened(page)


@pytest.mark.parametrize("path", GUARDED_PATHS)
@pytest.mark.parametrize("cookie", [None, "wrong", "ab_ui-but-not-it", "tøken", "TOKEN-PREFIX"])
async def test_missing_or_wrong_cookie_is_forbidden(
    dashboard: Running, path: str, cookie: str | None
) -> None:
    headers: dict[str, bytes] = {}
    if cookie == "TOKEN-PREFIX":
        cookie = dashboard.token[:-1]  # all but the last character
    if cookie is not None:
        headers["Cookie"] = f"ab_ui={cookie}".encode()
    with trio.fail_after(TIMEOUT):
        async with dashboard.client(cookie=False) as client:
            response = await client.get(path, headers=headers)
    assert response.status_code == 403
    assert_hardened(response)
    if path.startswith("/api/"):
        assert response.json() == {"error": "forbidden"}
    else:
        assert "agent-bridge dashboard" in response.text
        assert "set-cookie" not in response.headers


@pytest.mark.parametrize("token", ["", "wrong", "tøken", "A" * 43, "%00"])
async def test_wrong_token_in_url_is_forbidden_and_sets_no_cookie(dashboard: Running, token: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client(cookie=False) as client:
            response = await client.get(f"/?t={token}")
            assert response.status_code == 403
            assert "set-cookie" not in response.headers
            assert_hardened(response)
            # A wrong token is refused even next to a valid cookie.
            response = await client.get(f"/?t={token}", headers={"Cookie": f"ab_ui={dashboard.token}"})
            assert response.status_code == 403


@pytest.mark.parametrize("host_name", ["127.0.0.1", "localhost", "[::1]", "LOCALHOST"])
async def test_host_guard_admits_loopback_names_with_our_port(dashboard: Running, host_name: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            response = await client.get("/api/decisions", headers={"Host": f"{host_name}:{dashboard.port}"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:{port}",
        "evil.example",
        "127.0.0.1",
        "localhost",
        "127.0.0.1:{other}",
        "localhost:{other}",
        "localhost.:{port}",
        "127.0.0.2:{port}",
        "0.0.0.0:{port}",
        "[::1]",
        "127.0.0.1:{port}.evil.example",
        "user@127.0.0.1:{port}",
        "",
    ],
)
async def test_host_guard_refuses_other_hosts_even_with_the_cookie(dashboard: Running, host: str) -> None:
    value = host.format(port=dashboard.port, other=dashboard.port + 1)
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            for path in ("/api/decisions", "/", dashboard.url.removeprefix(dashboard.base)):
                response = await client.get(path, headers={"Host": value})
                assert response.status_code == 403, (path, value)
                assert "set-cookie" not in response.headers
                assert_hardened(response)
            assert (await client.get("/api/sessions", headers={"Host": value})).json() == {
                "error": "forbidden"
            }


async def test_requests_from_another_local_origin_are_refused(dashboard: Running) -> None:
    """A page on another 127.0.0.1 port is same-site for cookies, so it would send ab_ui: refuse
    what browsers mark as coming from elsewhere, except a top-level navigation to the page."""
    other_origin = f"http://127.0.0.1:{dashboard.port + 1}"
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            for headers in (
                {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"},
                {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "script"},
                {"Origin": other_origin},
                {"Origin": "null"},
            ):
                for path in ("/api/decisions", "/static/app.js"):
                    response = await client.get(path, headers=headers)
                    assert response.status_code == 403, (path, headers)
            # The page in a frame of another site: refused too.
            framed = {
                "Sec-Fetch-Site": "cross-site",
                "Sec-Fetch-Mode": "navigate",
                "Sec-Fetch-Dest": "iframe",
            }
            assert (await client.get("/", headers=framed)).status_code == 403
            # Same-origin requests and the user's own navigation pass.
            for headers in (
                {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"},
                {"Origin": dashboard.base},
                {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},
            ):
                assert (await client.get("/api/decisions", headers=headers)).status_code == 200, headers
            link = {
                "Sec-Fetch-Site": "cross-site",
                "Sec-Fetch-Mode": "navigate",
                "Sec-Fetch-Dest": "document",
            }
            assert (await client.get("/", headers=link)).status_code == 200


async def test_token_arriving_from_another_site_enters_through_a_same_origin_refresh(
    dashboard: Running,
) -> None:
    """`--open` hands the browser a file:// redirect page. Browsers withhold a SameSite=Strict cookie
    on a redirect continuing such a chain, so that arrival gets the cookie plus a page that moves
    on to `/` by itself (a same-origin navigation), instead of a 303."""
    link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
    with trio.fail_after(TIMEOUT):
        async with dashboard.client(cookie=False) as client:
            response = await client.get(dashboard.url, headers=link)
    assert response.status_code == 200
    assert response.headers["set-cookie"].startswith(f"ab_ui={dashboard.token};")
    assert '<meta http-equiv="refresh" content="0; url=/">' in response.text
    assert dashboard.token not in response.text
    assert_hardened(response)


async def test_every_response_is_hardened(dashboard: Running, web_home) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            responses = [
                await client.get("/"),
                await client.get("/static/app.js"),
                await client.get("/static/app.css"),
                await client.get("/api/decisions"),
                await client.get("/api/decisions?scope=nonsense"),
                await client.get("/api/nothing"),
                await client.get("/static/../server.py"),
                await client.put("/api/decisions"),
                await client.options("/api/decisions", headers={"Origin": "http://evil.example",
                                                                "Access-Control-Request-Method": "GET"}),
                await client.get("/api/decisions", headers={"Origin": "http://evil.example"}),
                await client.post("/api/decisions"),  # an action without the page's token
            ]
    statuses = [r.status_code for r in responses]
    assert statuses == [200, 200, 200, 200, 400, 404, 404, 405, 403, 403, 403]
    for response in responses:
        assert_hardened(response)
    assert responses[1].headers["content-type"].startswith("text/javascript")
    assert responses[2].headers["content-type"].startswith("text/css")
    assert responses[7].json()["error"].startswith("method not allowed")
    assert "token" in responses[10].json()["error"]


# --- GET /api/decisions ---------------------------------------------------------------------


async def get_json(client, path: str, status: int = 200):
    response = await client.get(path)
    assert response.status_code == status, (path, response.text)
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


async def test_decisions_without_scope_are_every_current_decision(dashboard: Running, facts: Facts) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, "/api/decisions")
            assert body == await get_json(client, "/api/decisions?scope=&q=")
    assert list(body) == ["decisions"]
    assert body["decisions"] == facts.current()
    assert [d["topic"] for d in body["decisions"]] == [
        "database", "/leading//slashes", "docs/history", "camera", "build / ci", "café",
    ]
    for decision in body["decisions"]:
        assert set(decision) == DECISION_FIELDS
        assert set(decision["author"]) == {"id", "name", "agent"}
        assert decision["current"] is True
    # Superseded across scopes: database moved from the project to every session.
    assert body["decisions"][0]["scope"] == "all"
    assert body["decisions"][0]["supersedes"] == facts.history("database")[1]["id"]


async def test_decisions_query_is_a_case_insensitive_substring(dashboard: Running, facts: Facts) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            by_text = await get_json(client, "/api/decisions?q=NOX")
            by_topic = await get_json(client, "/api/decisions?q=" + quote("CAFÉ"))
            nothing = await get_json(client, "/api/decisions?q=" + quote("no such thing"))
            superseded_text = await get_json(client, "/api/decisions?q=" + quote("one database per service"))
            longest = await get_json(client, "/api/decisions?q=" + "x" * 512)
            too_long = await get_json(client, "/api/decisions?q=" + "x" * 513, status=400)
    assert [d["topic"] for d in by_text["decisions"]] == ["build / ci"]
    assert [d["topic"] for d in by_topic["decisions"]] == ["café"]
    assert nothing == {"decisions": []}
    assert superseded_text == {"decisions": []}  # only current revisions
    assert longest == {"decisions": []}
    assert "512" in too_long["error"] and "query" in too_long["error"]


@pytest.mark.parametrize(
    ("scope", "topics"),
    [
        ("all", ["database", "build / ci"]),
        (" all ", ["database", "build / ci"]),
        ('"all"', ["database", "build / ci"]),
        # a project: its own decisions (normalized folder) plus the global ones
        (json.dumps({"project": PROJECT}), ["database", "docs/history", "build / ci"]),
        (json.dumps({"project": PROJECT + "//./"}), ["database", "docs/history", "build / ci"]),
        (json.dumps({"project": OTHER}), ["database", "camera", "build / ci"]),
        (json.dumps({"project": "/nowhere"}), ["database", "build / ci"]),
        # sessions: any address of the session matches (the /leading//slashes decision was
        # recorded under claude's id and is found by its name and its host session id)
        (json.dumps({"sessions": ["claude-proj"]}), ["database", "/leading//slashes", "build / ci"]),
        (json.dumps({"sessions": ["host-claude-1"]}), ["database", "/leading//slashes", "build / ci"]),
        (json.dumps({"sessions": ["codex-proj"]}), ["database", "build / ci", "café"]),
        (json.dumps({"sessions": ["nobody"]}), ["database", "build / ci"]),
    ],
)
async def test_decisions_scope_lookup(
    dashboard: Running, facts: Facts, scope: str, topics: list[str]
) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, "/api/decisions?scope=" + quote(scope, safe=""))
    assert [d["topic"] for d in body["decisions"]] == topics


async def test_decisions_scope_is_literal_all_not_an_implicit_context(
    dashboard: Running, facts: Facts
) -> None:
    """The global filter shows only decisions recorded for all sessions, whatever the requester."""
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, "/api/decisions?scope=all&q=database")
    assert [(d["topic"], d["scope"]) for d in body["decisions"]] == [("database", "all")]


@pytest.mark.parametrize(
    ("scope", "words"),
    [
        ("bad", "not JSON"),
        ("All", "not JSON"),
        ('"everyone"', "string"),
        ("42", "number"),
        ("[]", "list"),
        ("null", "null"),
        ("{}", "empty object"),
        ('{"folder": "/x"}', 'unknown key "folder"'),
        ('{"project": "relative/dir"}', "relative"),
        ('{"project": 7}', "scope.project"),
        ('{"sessions": []}', "empty list"),
        ('{"sessions": "claude"}', "list"),
        ('{"sessions": [""]}', "must not be empty"),
        ('{"sessions": [1]}', "scope.sessions[0]"),
        ('{"project": "/a", "sessions": ["x"]}', "exactly one key"),
        ("{not json", "not JSON"),
        ("[" * 1500 + "]" * 1500, "nested deeper than 64 levels"),  # was a RecursionError: 500
        ('{"sessions": ' + "[" * 70 + "]" * 70 + "}", "nested deeper than 64 levels"),
    ],
)
async def test_decisions_malformed_scope_is_400(dashboard: Running, scope: str, words: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, "/api/decisions?scope=" + quote(scope, safe=""), status=400)
            again = await get_json(
                client, history_path("camera") + "?scope=" + quote(scope, safe=""), status=400
            )
    assert list(body) == ["error"] and body["error"].startswith("scope")
    assert words in body["error"]
    assert again == body


# --- GET /api/decisions/<topic>/history -----------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "topic"),
    [
        ("build / ci", "build / ci"),
        ("  Build / CI  ", "build / ci"),
        ("CAFÉ", "café"),
        ("docs/history", "docs/history"),
        ("/leading//slashes", "/leading//slashes"),
        ("Database", "database"),
        ("camera", "camera"),
    ],
)
async def test_history_of_a_topic_newest_first(
    dashboard: Running, facts: Facts, sent: str, topic: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, history_path(sent))
    assert body == {"topic": topic, "decisions": facts.history(topic), "retractions": []}
    revisions = body["decisions"]
    assert revisions and [d["current"] for d in revisions] == [True] + [False] * (len(revisions) - 1)
    assert all(d["topic"] == topic for d in revisions)
    for newer, older in zip(revisions, revisions[1:], strict=False):
        assert newer["supersedes"] == older["id"]
        assert newer["createdAt"] >= older["createdAt"]


async def test_history_path_encodings(dashboard: Running, facts: Facts) -> None:
    """`%2F` inside a topic, percent-encoded spaces and UTF-8, upper- or lower-case hex."""
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            for path in (
                "/api/decisions/build%20%2F%20ci/history",
                "/api/decisions/build%20%2f%20ci/history",
                "/api/decisions/BUILD%20%2F%20CI/history",
                "/api/decisions/build%20/%20ci/history",  # a raw slash reaches the same topic
            ):
                body = await get_json(client, path)
                assert body["topic"] == "build / ci" and len(body["decisions"]) == 2, path
            body = await get_json(client, "/api/decisions/caf%C3%A9/history")
            assert body["topic"] == "café" and len(body["decisions"]) == 1
            body = await get_json(client, "/api/decisions/%2Fleading%2F%2Fslashes/history")
            assert body["topic"] == "/leading//slashes" and len(body["decisions"]) == 1
            body = await get_json(client, "/api/decisions/docs%2Fhistory/history")
            assert body["topic"] == "docs/history" and len(body["decisions"]) == 1


async def test_history_with_query_and_scope(dashboard: Running, facts: Facts) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            by_text = await get_json(client, history_path("database") + "?q=" + quote("per SERVICE"))
            in_project = await get_json(
                client, history_path("database") + "?scope=" + quote(json.dumps({"project": PROJECT}))
            )
            global_only = await get_json(client, history_path("database") + "?scope=all")
            elsewhere = await get_json(
                client, history_path("database") + "?scope=" + quote(json.dumps({"project": OTHER}))
            )
    old, new = facts.history("database")[1], facts.history("database")[0]
    assert by_text == {"topic": "database", "decisions": [old], "retractions": []}
    assert old["current"] is False
    assert in_project == {"topic": "database", "decisions": [new, old], "retractions": []}
    assert global_only == {"topic": "database", "decisions": [new], "retractions": []}
    assert elsewhere == {"topic": "database", "decisions": [new], "retractions": []}


async def test_history_of_an_unknown_topic_is_empty(dashboard: Running) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, history_path("No Such Topic"))
            long_ok = await get_json(client, history_path("t" * 200))
    assert body == {"topic": "no such topic", "decisions": [], "retractions": []}
    assert long_ok == {"topic": "t" * 200, "decisions": [], "retractions": []}


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/api/decisions//history", "must not be empty"),
        ("/api/decisions/%20%20%20/history", "must not be empty"),
        ("/api/decisions/%09%0A/history", "must not be empty"),
        (history_path("t" * 201), "at most 200"),
        (history_path("  " + "t" * 201 + "  "), "at most 200"),
        ("/api/decisions/%FF%FE/history", "UTF-8"),
        ("/api/decisions/caf%C3/history", "UTF-8"),
        (history_path("camera") + "?q=" + "x" * 513, "query"),
    ],
)
async def test_history_bad_topic_or_query_is_400(dashboard: Running, path: str, words: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, path, status=400)
    assert list(body) == ["error"]
    assert words in body["error"]


# --- sessions and messages ------------------------------------------------------------------


async def test_sessions_with_connected_state(dashboard: Running, facts: Facts) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, "/api/sessions")
            by_name = {s["name"]: s for s in body["sessions"]}
            assert set(by_name) == set(facts.peers)
            assert {name: s["connected"] for name, s in by_name.items()} == {
                "claude-proj": True, "codex-proj": False, "codex-other-job": False,
            }
            for name, peer in facts.peers.items():
                on = by_name[name]["connected"]
                state = {"state": None, "stateSince": None} if on else {"state": "offline",
                                                                       "stateSince": peer["lastSeenAt"]}
                assert by_name[name] == {**peer, "connected": on, **state}
            assert by_name["codex-other-job"]["kind"] == "job"
            # The broker's in-memory state is read on every request.
            dashboard.live.clear()
            dashboard.live.add(facts.peers["codex-proj"]["id"])
            again = await get_json(client, "/api/sessions")
    assert {s["name"]: s["connected"] for s in again["sessions"]} == {
        "claude-proj": False, "codex-proj": True, "codex-other-job": False,
    }


async def test_recent_messages(dashboard: Running, facts: Facts) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, "/api/messages")
            one = await get_json(client, "/api/messages?limit=1")
            errors = [
                await get_json(client, f"/api/messages?limit={v}", status=400)
                for v in ("0", "501", "x", "-1")
            ]
    messages = body["messages"]
    assert [m["text"] for m in messages][0] == "On it: nox sessions, no tox."
    assert messages[-1]["text"] == "Can you take the CI job?"
    assert [m["kind"] for m in messages] == ["message", "decision", "message"]
    notice = messages[1]
    assert notice["hop"] == 100 and notice["to"]["name"] == "codex-proj"
    assert notice["decision"]["topic"] == "build / ci"
    reply = messages[0]
    assert reply["from"]["name"] == "codex-proj" and reply["to"]["name"] == "claude-proj"
    assert reply["replyTo"] == facts.messages[0]["id"] and reply["hop"] == 2
    assert one["messages"] == messages[:1]
    for error in errors:
        assert "limit" in error["error"]


async def test_status(dashboard: Running) -> None:
    with trio.fail_after(TIMEOUT):
        async with dashboard.client() as client:
            body = await get_json(client, "/api/status")
    assert body == {
        "mode": "broker",
        "home": str(dashboard.home),
        "database": True,
        "readOnly": False,
        "hopLimit": 10,
    }

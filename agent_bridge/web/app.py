"""The dashboard app (SPEC §6): a Quart-Trio app over read-only reads of bridge.db.

The app never writes: every handler opens its own read-only connection through
`store.reader.reading` (no migration, no broker needed) on a worker thread, so SQLite never
blocks the Trio loop. Decision lookups are `domain` + `store.queries`, the same functions the
MCP tools and the CLI use.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import apsw
import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.routing import BaseConverter

from agent_bridge import domain, paths
from agent_bridge.store import queries, reader
from agent_bridge.store.schema import SchemaError
from agent_bridge.web import auth

STATIC = Path(__file__).with_name("static")
STATIC_TYPES = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
READ_THREADS = 4  # concurrent read-only connections; a laptop page makes about four requests at once
MESSAGES_DEFAULT = 50
MESSAGES_MAX = 500
HISTORY_PREFIX = b"/api/decisions/"
HISTORY_SUFFIX = b"/history"

Live = Callable[[], Collection[str]]

FORBIDDEN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agent-bridge dashboard: forbidden</title></head>
<body><h1>Forbidden</h1>
<p>Open the dashboard with the URL that <code>agent-bridge dashboard</code> prints.
It carries a token that changes every time the dashboard starts.</p></body></html>
"""
# Sent instead of a 303 when the token arrives through a navigation from another site (the
# `--open` redirect file, a link): browsers would withhold a SameSite=Strict cookie on a redirect
# that continues such a chain, while a refresh started by this page is a same-origin navigation.
ENTER_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="0; url=/">
<title>agent-bridge dashboard</title></head>
<body><p><a href="/">Continue to the dashboard</a></p></body></html>
"""


class _AnyPath(BaseConverter):
    """Anything, `/` and empty included: a topic is checked by the domain rules, not the router."""

    regex = r"[\s\S]*"  # `.` would stop at a newline (%0A)
    part_isolating = False


class Reads:
    """Runs one read (a function of a read-only connection) on a worker thread."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.limiter = trio.CapacityLimiter(READ_THREADS)

    async def run(self, read: Callable[[apsw.Connection], Any], empty: Any) -> Any:
        return await trio.to_thread.run_sync(partial(self._read, read, empty), limiter=self.limiter)

    def _read(self, read: Callable[[apsw.Connection], Any], empty: Any) -> Any:
        with reader.reading(self.db) as conn:
            return empty if conn is None else read(conn)


def create_app(home: Path, *, port: int, token: str, live: Live | None = None) -> QuartTrio:
    """The dashboard for the state folder `home`, answering on `127.0.0.1:<port>` with `token`.

    `live` returns the ids of the sessions connected to the broker right now; None means the
    dashboard runs without a broker (standalone), so nothing is connected.
    """
    app = QuartTrio(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = 0  # read-only: no request bodies
    app.url_map.merge_slashes = False  # `a//b` is a topic, not a redirect
    app.url_map.converters["anypath"] = _AnyPath
    reads = Reads(paths.db_path(home))
    static_files = {name: (STATIC / name).read_bytes() for name in ("index.html", *STATIC_TYPES)}

    def json_response(data: Any, status: int = 200) -> Response:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return Response(body, status=status, content_type="application/json; charset=utf-8")

    def error(status: int, message: str) -> Response:
        return json_response({"error": message}, status)

    def forbidden() -> Response:
        if request.path.startswith("/api/"):
            return error(403, "forbidden")
        return Response(FORBIDDEN_PAGE, status=403, content_type="text/html; charset=utf-8")

    async def read(fn: Callable[[apsw.Connection], Any], empty: Any) -> Any:
        """Run a read, or raise _Unreadable with a message for people."""
        try:
            return await reads.run(fn, empty)
        except SchemaError as exc:
            raise _Unreadable(str(exc)) from None
        except apsw.Error as exc:
            raise _Unreadable(f"bridge.db could not be read: {type(exc).__name__}: {exc}") from None

    @app.before_request
    async def guard() -> Response | None:
        if not auth.host_ok(request.headers.getlist("Host"), port):
            return forbidden()
        is_page = request.path == "/"
        headers = request.headers
        if auth.cross_site(
            site=headers.get("Sec-Fetch-Site"),
            mode=headers.get("Sec-Fetch-Mode"),
            dest=headers.get("Sec-Fetch-Dest"),
            origin=headers.get("Origin"),
            port=port,
            page=is_page,
        ):
            return forbidden()
        if is_page and auth.TOKEN_PARAM in request.args:
            return None  # `index` checks the token and swaps it for the cookie
        if not auth.token_matches(request.cookies.get(auth.COOKIE), token):
            return forbidden()
        return None

    @app.after_request
    async def harden(response: Response) -> Response:
        for name in auth.CORS_HEADERS:
            response.headers.pop(name, None)
        for name, value in auth.SECURITY_HEADERS.items():
            response.headers[name] = value
        # No keep-alive. With Quart-Trio on Hypercorn (0.18) an idle keep-alive connection never
        # gets its idle timer back after a response (the timer task is started from the request's
        # already-cancelled scope), so it would stay open until the client leaves and hold every
        # shutdown for the whole graceful timeout. A loopback connect per request costs nothing.
        response.headers["Connection"] = "close"
        return response

    @app.errorhandler(_Unreadable)
    async def unreadable(exc: _Unreadable) -> Response:
        return error(503, str(exc))

    @app.errorhandler(404)
    async def not_found(exc: Exception) -> Response:
        return error(404, "not found") if request.path.startswith("/api/") else Response("not found", 404)

    @app.errorhandler(405)
    async def not_allowed(exc: Exception) -> Response:
        return error(405, "method not allowed: the dashboard is read-only (GET)")

    @app.errorhandler(500)
    async def internal(exc: Exception) -> Response:
        return error(500, "internal error; see the broker log")

    @app.get("/")
    async def index() -> Response:
        if auth.TOKEN_PARAM in request.args:
            given = request.args.get(auth.TOKEN_PARAM)
            if not auth.token_matches(given, token):
                return forbidden()
            from_elsewhere = request.headers.get("Sec-Fetch-Site", "none").lower() not in ("none", "same-origin")
            if from_elsewhere:
                response = Response(ENTER_PAGE, status=200, content_type="text/html; charset=utf-8")
            else:
                response = Response("", status=303, headers={"Location": "/"})
            response.set_cookie(auth.COOKIE, token, httponly=True, samesite="Strict", path="/")
            return response
        return Response(static_files["index.html"], content_type="text/html; charset=utf-8")

    @app.get("/static/<name>")
    async def static(name: str) -> Response:
        content_type = STATIC_TYPES.get(name)
        if content_type is None:
            return Response("not found", 404)
        return Response(static_files[name], content_type=content_type)

    @app.get("/api/status")
    async def status() -> Response:
        return json_response(
            {
                "mode": "standalone" if live is None else "broker",
                "home": str(home),
                "database": paths.db_path(home).exists(),
                "readOnly": True,
            }
        )

    @app.get("/api/decisions")
    async def decisions() -> Response:
        try:
            needle, lookup = _filters()
        except domain.InputError as exc:
            return error(400, str(exc))
        found = await read(partial(queries.query_decisions, needle=needle, lookup=lookup), [])
        return json_response({"decisions": found})

    @app.get("/api/decisions/<anypath:topic>/history")
    async def history(topic: str) -> Response:
        try:
            normalized = domain.normalize_topic(_raw_topic(topic))
            needle, lookup = _filters()
        except domain.InputError as exc:
            return error(400, str(exc))
        found = await read(
            partial(queries.query_decisions, needle=needle, lookup=lookup, history=True, topic=normalized), []
        )
        # Beside the decision objects, never inside them: the topic's retractions, newest first.
        retracted = await read(partial(queries.retractions, topic=normalized), [])
        return json_response({"topic": normalized, "decisions": found, "retractions": retracted})

    @app.get("/api/sessions")
    async def sessions() -> Response:
        peers = await read(queries.list_peers, [])
        connected = set(live()) if live is not None else set()
        for peer in peers:
            peer["connected"] = peer["id"] in connected
        return json_response({"sessions": peers})

    @app.get("/api/messages")
    async def messages() -> Response:
        raw = request.args.get("limit", "")
        if raw == "":
            limit = MESSAGES_DEFAULT
        else:
            try:
                limit = int(raw)
            except ValueError:
                limit = 0
            if not 1 <= limit <= MESSAGES_MAX:
                return error(400, f"limit: expected an integer 1..{MESSAGES_MAX}, got {_short(raw)}")
        found = await read(partial(queries.recent_messages, limit=limit), [])
        return json_response({"messages": found})

    return app


class _Unreadable(Exception):
    """bridge.db exists but cannot be read (a newer schema, corruption, permissions)."""


def _filters() -> tuple[str | None, domain.Scope | None]:
    """`q` and `scope` of the current request, checked by the domain rules. No implicit context:
    an absent (or empty) scope means every scope."""
    needle = domain.normalize_query(request.args.get("q"))
    raw_scope = request.args.get("scope")
    lookup = None if raw_scope is None or raw_scope == "" else domain.parse_scope(raw_scope)
    return needle, lookup


def _raw_topic(routed: str) -> str:
    """The topic exactly as the client percent-encoded it.

    The router sees a path the server already decoded (`%2F` became `/`, invalid UTF-8 became
    U+FFFD); the raw path keeps the bytes, so a bad encoding is an error instead of a guess.
    """
    raw = request.scope.get("raw_path")
    if not isinstance(raw, bytes) or not (raw.startswith(HISTORY_PREFIX) and raw.endswith(HISTORY_SUFFIX)):
        return routed
    encoded = raw[len(HISTORY_PREFIX) : len(raw) - len(HISTORY_SUFFIX)]
    try:
        return unquote_to_bytes(encoded).decode("utf-8")
    except UnicodeDecodeError:
        raise domain.InputError("topic: not valid UTF-8 once percent-decoded (use encodeURIComponent)") from None


def _short(value: str, limit: int = 40) -> str:
    return json.dumps(value if len(value) <= limit else value[:limit] + "…", ensure_ascii=False)

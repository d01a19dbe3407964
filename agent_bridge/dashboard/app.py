"""The dashboard app (SPEC §6): a Quart-Trio app over read-only reads of bridge.db, and the
owner's actions.

The app never writes bridge.db itself: every read opens its own read-only connection through
`store.reader.reading` (no migration, no broker needed) on a worker thread, so SQLite never
blocks the Trio loop. The owner's actions (record, retract, send, forget, answer) are POSTs that go to
the broker exactly as the command line does (`owner.broker_call` on a worker thread, author
`cli`), after three checks on top of the cookie: the page's own token in `X-AB-Token`, an
`Origin` that is the dashboard's, and a JSON body. Every other method gets 405. Decision lookups
are `domain` + `store.queries`, the same functions the MCP tools and the CLI use; what only the
dashboard asks (receipts, notices) is `dashboard.reads`.

`GET /api/events` is the one long-lived response: a server-sent event stream that says
"something changed" (`dashboard.changes` explains what feeds it), so the page fetches again instead
of polling. It carries no data of its own.

This module builds the app and holds what guards every request (the Host, cross-site and cookie
checks, the security headers, the error answers) and the page itself; the API routes are in
`dashboard.routes`, the live stream in `dashboard.live`, what they share in `dashboard.state`.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.routing import BaseConverter

from agent_bridge.common import paths
from agent_bridge.dashboard import auth, routes
from agent_bridge.dashboard import live as live_streams
from agent_bridge.dashboard.live import LiveStreams
from agent_bridge.dashboard.state import (
    ACTION_BODY_MAX,
    STATIC_TYPES,
    Dashboard,
    Hub,
    Live,
    Unreadable,
    error,
)
from agent_bridge.store.feed import ChangeFeed

FORBIDDEN_STYLE = """
body{margin:0;min-height:100vh;display:flex;align-items:center;justify-content:center;padding:1rem;
font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","DejaVu Sans",sans-serif;
background:#f4f6fa;color:#1d2330}
main{max-width:34rem;background:#fff;border:1px solid #e3e7ee;border-radius:10px;padding:1.4rem 1.6rem}
h1{font-size:1.2rem;margin:0 0 .6rem}
p{margin:.5rem 0}
code{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;background:#e8eefc;color:#2f5bd3;
padding:.05rem .35rem;border-radius:4px;overflow-wrap:anywhere}
.muted{color:#667085;font-size:.9rem}
@media (prefers-color-scheme:dark){body{background:#12151c;color:#e6e9ef}\
main{background:#1a1f29;border-color:#2b3240}
code{background:#22304f;color:#7c9ef0}.muted{color:#98a2b3}}
"""
FORBIDDEN_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">\
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>agent-bridge dashboard: not authorized</title><style>{FORBIDDEN_STYLE}</style></head>
<body><main><h1>This dashboard link is not valid (any more)</h1>
<p>The agent-bridge dashboard opens only through the URL it prints. That URL carries a token
that changes every time the dashboard starts, so links and tabs from an earlier start stop working.</p>
<p>To get a fresh URL, run <code>agent-bridge dashboard</code> in a terminal and open the URL it
prints, or run <code>agent-bridge dashboard --open</code> to open it in your browser.</p>
<p class="muted">The address must be 127.0.0.1, localhost or [::1] with the dashboard's port.</p>
</main></body></html>
"""
# The forbidden page is styled inline (it cannot load /static/app.css without the cookie), so its
# CSP allows exactly that one style block by hash; everything else stays as strict as elsewhere.
FORBIDDEN_CSP = auth.CSP.replace(
    "style-src 'self'",
    "style-src 'sha256-" + base64.b64encode(hashlib.sha256(FORBIDDEN_STYLE.encode()).digest()).decode() + "'",
)
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


def create_app(
    home: Path,
    *,
    port: int,
    token: str,
    live: Live | None = None,
    changes: ChangeFeed | None = None,
    closing: trio.Event | None = None,
    hub: Hub | None = None,
) -> QuartTrio:
    """The dashboard for the state folder `home`, answering on `127.0.0.1:<port>` with `token`.

    `live` returns the ids of the sessions connected to the broker right now; None means the
    dashboard runs without a broker (standalone), so nothing is connected.
    `changes`: the broker's feed of store commits; None: the app watches bridge.db itself while
    a live stream is open. `closing`: set when the server stops taking requests; it ends the
    live streams, which would otherwise hold the shutdown until its deadline.

    The routes are registered by area, each from one function: the request guard, the response
    headers, the error answers, the page itself (here), the API's reads and the owner's actions
    (dashboard.routes), the live stream (dashboard.live).
    """
    app = QuartTrio(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = ACTION_BODY_MAX  # only the owner's actions have bodies
    app.url_map.merge_slashes = False  # `a//b` is a topic, not a redirect
    app.url_map.converters["anypath"] = _AnyPath
    dash = Dashboard(home, port=port, token=token, live=live, hub=hub)
    _guard(app, dash)
    _harden(app)
    _errors(app)
    _page(app, dash)
    routes.register(app, dash)
    streams = LiveStreams(app, paths.db_path(home), mode=dash.mode(), changes=changes, closing=closing)
    live_streams.register(app, streams)
    return app


def _forbidden() -> Response:
    if request.path.startswith("/api/"):
        return error(403, "forbidden")
    return Response(FORBIDDEN_PAGE, status=403, content_type="text/html; charset=utf-8")


def _not_allowed() -> Response:
    return error(405, "method not allowed: GET reads; the owner's actions are POSTs from the page")


def _guard(app: QuartTrio, dash: Dashboard) -> None:
    """Every request: the Host and cross-site checks first, then the cookie (or the printed URL's
    token, which only `index` takes)."""
    port, token = dash.port, dash.token

    @app.before_request
    async def guard() -> Response | None:
        if not auth.host_ok(request.headers.getlist("Host"), port):
            return _forbidden()
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
            return _forbidden()
        if request.method not in ("GET", "HEAD") and request.routing_exception is not None:
            return _not_allowed()  # PUT, DELETE, OPTIONS…, and POST where no action is
        if is_page and auth.TOKEN_PARAM in request.args:
            return None  # `index` checks the token and swaps it for the cookie
        if not auth.token_matches(request.cookies.get(auth.COOKIE), token):
            return _forbidden()
        return None


def _harden(app: QuartTrio) -> None:
    """Every response: no CORS, the security headers, no keep-alive."""

    @app.after_request
    async def harden(response: Response) -> Response:
        for name in auth.CORS_HEADERS:
            response.headers.pop(name, None)
        for name, value in auth.SECURITY_HEADERS.items():
            response.headers[name] = value
        if response.status_code == 403 and response.mimetype == "text/html":
            response.headers["Content-Security-Policy"] = FORBIDDEN_CSP
        # No keep-alive. With Quart-Trio on Hypercorn (0.18) an idle keep-alive connection never
        # gets its idle timer back after a response (the timer task is started from the request's
        # already-cancelled scope), so it would stay open until the client leaves and hold every
        # shutdown for the whole graceful timeout. A loopback connect per request costs nothing.
        response.headers["Connection"] = "close"
        return response


def _errors(app: QuartTrio) -> None:
    """The error answers: JSON under /api/, text elsewhere."""

    @app.errorhandler(Unreadable)
    async def unreadable(exc: Unreadable) -> Response:
        return error(503, str(exc))

    @app.errorhandler(404)
    async def not_found(exc: Exception) -> Response:
        return error(404, "not found") if request.path.startswith("/api/") else Response("not found", 404)

    @app.errorhandler(405)
    async def not_allowed(exc: Exception) -> Response:
        return _not_allowed()

    @app.errorhandler(500)
    async def internal(exc: Exception) -> Response:
        return error(500, "internal error; see the broker log")


def _page(app: QuartTrio, dash: Dashboard) -> None:
    """The page, its static files, and the way in: the printed URL's token becomes the cookie."""
    token = dash.token

    @app.get("/")
    async def index() -> Response:
        if auth.TOKEN_PARAM in request.args:
            given = request.args.get(auth.TOKEN_PARAM)
            if not auth.token_matches(given, token):
                return _forbidden()
            from_elsewhere = request.headers.get("Sec-Fetch-Site", "none").lower() not in (
                "none",
                "same-origin",
            )
            if from_elsewhere:
                response = Response(ENTER_PAGE, status=200, content_type="text/html; charset=utf-8")
            else:
                response = Response("", status=303, headers={"Location": "/"})
            response.set_cookie(auth.COOKIE, token, httponly=True, samesite="Strict", path="/")
            return response
        return Response(dash.page, content_type="text/html; charset=utf-8")

    @app.get("/static/<name>")
    async def static(name: str) -> Response:
        content_type = STATIC_TYPES.get(name)
        if content_type is None:
            return Response("not found", 404)
        return Response(dash.static_files[name], content_type=content_type)

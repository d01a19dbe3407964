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
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Collection
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import apsw
import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.routing import BaseConverter

from agent_bridge.common import config, domain, marks, paths
from agent_bridge.common.rows import Peer
from agent_bridge.dashboard import auth, reads
from agent_bridge.dashboard.changes import watch_database
from agent_bridge.ipc import owner
from agent_bridge.store import job_queries, queries, question_queries, reader, search
from agent_bridge.store.feed import ChangeFeed
from agent_bridge.store.schema import SchemaError

STATIC = Path(__file__).with_name("static")
STATIC_TYPES = {
    "app.js": "text/javascript; charset=utf-8",
    "alerts.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
READ_THREADS = 4  # concurrent read-only connections; a laptop page makes about four requests at once
MESSAGES_DEFAULT = 50
MESSAGES_MAX = 500
HISTORY_PREFIX = b"/api/decisions/"  # a topic's endpoints: <prefix><encodeURIComponent(topic)><suffix>
HISTORY_SUFFIX = b"/history"
RECEIPTS_SUFFIX = b"/receipts"
STREAMS_PER_CLIENT = 4  # live streams one client address may hold; a browser allows 6 connections per host
HEARTBEAT = 15.0  # seconds between keep-alive comments on an idle stream (finds clients that left)
CHANGE_GAP = 0.5  # at least this long between two change events: a busy broker commits thousands a second
RETRY_MS = 2000  # what the stream asks EventSource to wait before reconnecting
ACTION_BODY_MAX = 64 * 1024  # an owner action's JSON body: a decision text is at most 4,000 characters
ACTION_TOKEN_HEADER = "X-AB-Token"
TOKEN_META = b'<meta name="ab-token" content="">'
RETRACT_SUFFIX = b"/retract"
log = logging.getLogger("agent_bridge.dashboard")

Live = Callable[[], Collection[str]]

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


def create_app(
    home: Path,
    *,
    port: int,
    token: str,
    live: Live | None = None,
    changes: ChangeFeed | None = None,
    closing: trio.Event | None = None,
) -> QuartTrio:
    """The dashboard for the state folder `home`, answering on `127.0.0.1:<port>` with `token`.

    `live` returns the ids of the sessions connected to the broker right now; None means the
    dashboard runs without a broker (standalone), so nothing is connected.
    `changes`: the broker's feed of store commits; None: the app watches bridge.db itself while
    a live stream is open. `closing`: set when the server stops taking requests; it ends the
    live streams, which would otherwise hold the shutdown until its deadline.

    The routes are registered by area, each from one function: the request guard, the response
    headers, the error answers, the page itself, the reads, the owner's actions, the owner's
    questions, the jobs, the live stream.
    """
    app = QuartTrio(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = ACTION_BODY_MAX  # only the owner's actions have bodies
    app.url_map.merge_slashes = False  # `a//b` is a topic, not a redirect
    app.url_map.converters["anypath"] = _AnyPath
    dash = _Dashboard(app, home, port=port, token=token, live=live, changes=changes, closing=closing)
    _guard(app, dash)
    _harden(app)
    _errors(app)
    _page(app, dash)
    _reads(app, dash)
    _decision_reads(app, dash)
    _actions(app, dash)
    _questions(app, dash)
    _jobs(app, dash)
    _search(app, dash)
    _events(app, dash)
    return app


class _Dashboard:
    """What the routes share: the state folder, the secrets the guard checks, the read pool,
    what is connected, and the change feed behind the live stream."""

    def __init__(
        self,
        app: QuartTrio,
        home: Path,
        *,
        port: int,
        token: str,
        live: Live | None,
        changes: ChangeFeed | None,
        closing: trio.Event | None,
    ) -> None:
        self.app = app
        self.home = home
        self.port = port
        self.token = token
        self.live = live
        db = paths.db_path(home)
        self.reader_pool = Reads(db)
        self.hop_limit = _hop_limit(home)
        self.feed = changes if changes is not None else ChangeFeed()
        self.watcher = _DatabaseWatcher(db, self.feed) if changes is None else None
        self.stopping = closing if closing is not None else trio.Event()
        self.streams: weakref.WeakSet[_EventStream] = weakref.WeakSet()
        self.static_files = {name: (STATIC / name).read_bytes() for name in ("index.html", *STATIC_TYPES)}
        # The page's token for actions (SPEC §6): fresh per start, only ever inside the page, which
        # another origin cannot read; the cookie alone (sent with a cross-site form too) is not enough.
        self.page_token = auth.new_token()
        index = self.static_files["index.html"]
        self.page = index.replace(TOKEN_META, f'<meta name="ab-token" content="{self.page_token}">'.encode())
        assert self.page != index, "index.html lacks the ab-token meta tag"

    def mode(self) -> str:
        return "standalone" if self.live is None else "broker"

    def connected(self) -> set[str]:
        return set(self.live()) if self.live is not None else set()

    async def read(self, fn: Callable[[apsw.Connection], Any], empty: Any) -> Any:
        """Run a read, or raise _Unreadable with a message for people."""
        try:
            return await self.reader_pool.run(fn, empty)
        except SchemaError as exc:
            raise _Unreadable(str(exc)) from None
        except apsw.Error as exc:
            raise _Unreadable(f"bridge.db could not be read: {type(exc).__name__}: {exc}") from None

    def with_connected(self, found: list[reads.DecisionReceipt]) -> list[dict[str, Any]]:
        connected = self.connected()
        return [entry.to_json(connected=entry.session.id in connected) for entry in found]

    async def action_body(self, allowed: set[str]) -> dict[str, Any] | Response:
        """The checked JSON object of an action, or the refusal to answer."""
        if not auth.token_matches(request.headers.get(ACTION_TOKEN_HEADER), self.page_token):
            return _error(
                403, f"forbidden: an action needs the page's token in {ACTION_TOKEN_HEADER} (reload the page)"
            )
        origin = request.headers.get("Origin")
        if origin is None or origin.lower() not in auth.allowed_origins(self.port):
            return _error(403, "forbidden: an action must come from the dashboard's own page (Origin)")
        if request.mimetype != "application/json":
            return _error(
                400, f"Content-Type: expected application/json, got {_short(request.mimetype or 'nothing')}"
            )
        raw = await request.get_data(as_text=False)
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            return _error(400, "body: not a JSON object")
        if not isinstance(body, dict):
            return _error(400, "body: expected a JSON object")
        unknown = sorted(set(body) - allowed)
        if unknown:
            return _error(
                400,
                f"body: unknown field {_short(unknown[0])} "
                f"(it takes: {', '.join(sorted(allowed)) or 'none'})",
            )
        return body

    async def owner_action(self, op: str, args: dict[str, Any]) -> Response:
        if self.live is None:
            return _error(
                503,
                "this dashboard is read-only: no broker was running when it started; "
                "start one (agent-bridge up --detach), "
                "then open its dashboard (agent-bridge dashboard --open)",
            )
        try:
            result = await trio.to_thread.run_sync(partial(owner.broker_call, op, home=self.home, **args))
        except owner.CommandError as exc:
            return _error(400 if exc.code == owner.BAD_ARGUMENTS else 503, str(exc))
        except OSError as exc:
            return _error(503, f"{type(exc).__name__}: {exc}")
        if isinstance(result, dict):
            result.pop(domain.UNMATCHED_ADDRESSES, None)  # what `--json` prints
        return _json_response(result)

    async def stream_events(self, stream: _EventStream) -> AsyncIterator[bytes]:
        feed, watcher, stopping = self.feed, self.watcher, self.stopping
        feed.listeners += 1
        try:
            if watcher is not None and not await watcher.ensure_running(self.app):
                return  # no way to see changes: the page falls back to polling
            seen = feed.version
            hello = json.dumps({"version": seen, "mode": self.mode()})
            yield f"retry: {RETRY_MS}\nevent: hello\ndata: {hello}\n\n".encode()
            while not stopping.is_set():
                with trio.move_on_after(HEARTBEAT):
                    await _first_of(partial(feed.wait_beyond, seen), stopping.wait)
                if stopping.is_set() or (watcher is not None and watcher.failed):
                    return
                if feed.version == seen:
                    yield b": keep-alive\n\n"
                    continue
                seen = feed.version
                yield f"event: change\ndata: {json.dumps({'version': seen})}\n\n".encode()
                with trio.move_on_after(CHANGE_GAP):
                    await stopping.wait()
        finally:
            feed.listeners -= 1
            stream.closed = True


def _json_response(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status=status, content_type="application/json; charset=utf-8")


def _error(status: int, message: str) -> Response:
    return _json_response({"error": message}, status)


def _forbidden() -> Response:
    if request.path.startswith("/api/"):
        return _error(403, "forbidden")
    return Response(FORBIDDEN_PAGE, status=403, content_type="text/html; charset=utf-8")


def _not_allowed() -> Response:
    return _error(405, "method not allowed: GET reads; the owner's actions are POSTs from the page")


def _guard(app: QuartTrio, dash: _Dashboard) -> None:
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

    @app.errorhandler(_Unreadable)
    async def unreadable(exc: _Unreadable) -> Response:
        return _error(503, str(exc))

    @app.errorhandler(404)
    async def not_found(exc: Exception) -> Response:
        return _error(404, "not found") if request.path.startswith("/api/") else Response("not found", 404)

    @app.errorhandler(405)
    async def not_allowed(exc: Exception) -> Response:
        return _not_allowed()

    @app.errorhandler(500)
    async def internal(exc: Exception) -> Response:
        return _error(500, "internal error; see the broker log")


def _page(app: QuartTrio, dash: _Dashboard) -> None:
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


def _reads(app: QuartTrio, dash: _Dashboard) -> None:
    """GET /api/status, /api/sessions, /api/messages: read-only reads of bridge.db and of what is
    connected now."""
    read = dash.read

    @app.get("/api/status")
    async def status() -> Response:
        return _json_response(
            {
                "mode": dash.mode(),
                "home": str(dash.home),
                "database": paths.db_path(dash.home).exists(),
                "readOnly": dash.live is None,  # standalone (no broker): reads only (SPEC §1)
                "hopLimit": dash.hop_limit,
            }
        )

    @app.get("/api/sessions")
    async def sessions() -> Response:
        peers = await read(queries.list_peers, [])
        connected = dash.connected()
        states = await trio.to_thread.run_sync(
            partial(_states, dash.home, peers, connected), limiter=dash.reader_pool.limiter
        )
        return _json_response({"sessions": [
            {**p.to_json(), "connected": p.id in connected, **state.to_json()}
            for p, state in zip(peers, states, strict=True)
        ]})

    @app.get("/api/messages")
    async def messages() -> Response:
        try:
            limit = _messages_limit(request.args.get("limit", ""))
        except domain.InputError as exc:
            return _error(400, str(exc))
        kind = request.args.get("kind", "")
        if kind not in ("", *reads.MESSAGE_KINDS):
            return _error(
                400, f'kind: expected "message" or "notice" (or nothing for both), got {_short(kind)}'
            )
        found = await read(
            partial(reads.recent_messages, limit=limit, kind=kind or None, hop_limit=dash.hop_limit), []
        )
        return _json_response({"messages": found})


def _decision_reads(app: QuartTrio, dash: _Dashboard) -> None:
    """GET /api/decisions…, /api/receipts: decisions, a topic's history, who got what."""
    read = dash.read

    @app.get("/api/decisions")
    async def decisions() -> Response:
        try:
            needle, lookup = _filters()
        except domain.InputError as exc:
            return _error(400, str(exc))
        found = await read(partial(reads.decisions_json, needle=needle, lookup=lookup), [])
        return _json_response({"decisions": found})

    @app.get("/api/decisions/<anypath:topic>/history")
    async def history(topic: str) -> Response:
        try:
            normalized = domain.normalize_topic(_raw_topic(topic))
            needle, lookup = _filters()
        except domain.InputError as exc:
            return _error(400, str(exc))
        found = await read(
            partial(reads.decisions_json, needle=needle, lookup=lookup, history=True, topic=normalized), []
        )
        # Beside the decision objects, never inside them: the topic's retractions, newest first.
        retracted = await read(partial(reads.retractions_json, topic=normalized), [])
        return _json_response({"topic": normalized, "decisions": found, "retractions": retracted})

    @app.get("/api/decisions/<anypath:topic>/receipts")
    async def topic_receipts(topic: str) -> Response:
        """Who every revision of a topic was queued for, and who has acknowledged it."""
        try:
            normalized = domain.normalize_topic(_raw_topic(topic, RECEIPTS_SUFFIX))
        except domain.InputError as exc:
            return _error(400, str(exc))
        found = await read(partial(_topic_receipts, topic=normalized), [])
        return _json_response({"topic": normalized, "receipts": dash.with_connected(found)})

    @app.get("/api/receipts")
    async def receipts() -> Response:
        """Receipts of every current decision (the decisions table shows them per row)."""
        found = await read(_current_receipts, [])
        return _json_response({"receipts": dash.with_connected(found)})


def _states(home: Path, peers: list[Peer], connected: set[str]) -> list[marks.SessionState]:
    """Each session's busy/idle/offline state, from the hooks' marks (files: off the loop)."""
    return [
        marks.session_state(home, p.host_session_id, connected=p.id in connected, last_seen=p.last_seen_at)
        for p in peers
    ]


def _topic_receipts(conn: apsw.Connection, *, topic: str) -> list[reads.DecisionReceipt]:
    revisions = queries.query_decisions(conn, history=True, topic=topic)
    return reads.decision_receipts(conn, [d.id for d in revisions])


def _current_receipts(conn: apsw.Connection) -> list[reads.DecisionReceipt]:
    return reads.decision_receipts(conn, [d.id for d in queries.query_decisions(conn)])


def _messages_limit(raw: str) -> int:
    """`limit` of /api/messages: MESSAGES_DEFAULT when absent or empty."""
    if raw == "":
        return MESSAGES_DEFAULT
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MESSAGES_MAX:
        raise domain.InputError(f"limit: expected an integer 1..{MESSAGES_MAX}, got {_short(raw)}")
    return limit


def _actions(app: QuartTrio, dash: _Dashboard) -> None:
    """The owner's actions (SPEC §6): POSTs that take the command line's code path, author `cli`."""
    action_body, owner_action = dash.action_body, dash.owner_action

    @app.post("/api/decisions")
    async def record_decision() -> Response:
        body = await action_body({"topic", "text", "scope"})
        if isinstance(body, Response):
            return body
        args = {"topic": body.get("topic"), "text": body.get("text"), "scope": body.get("scope", "all"),
                "project": "/"}  # the CLI's folder, used only for an omitted scope, which here is "all"
        return await owner_action("decide", args)

    @app.post("/api/decisions/<anypath:topic>/retract")
    async def retract_decision(topic: str) -> Response:
        body = await action_body({"reason"})
        if isinstance(body, Response):
            return body
        try:
            raw = _raw_topic(topic, RETRACT_SUFFIX)
        except domain.InputError as exc:
            return _error(400, str(exc))
        return await owner_action("retract", {"topic": raw, **body})

    @app.post("/api/messages")
    async def send_message() -> Response:
        body = await action_body({"to", "text"})
        if isinstance(body, Response):
            return body
        return await owner_action("send", {"to": body.get("to"), "text": body.get("text")})

    @app.post("/api/sessions/<anypath:session>/forget")
    async def forget_session(session: str) -> Response:
        body = await action_body(set())
        if isinstance(body, Response):
            return body
        return await owner_action("forget", {"sessions": [session]})


def _questions(app: QuartTrio, dash: _Dashboard) -> None:
    """Owner questions (SPEC §4.6): GET /api/questions, read-only; POST
    /api/questions/<id>/answer, an owner action (`agent-bridge answer`'s code path)."""

    @app.get("/api/questions")
    async def questions() -> Response:
        """Questions agents asked the owner, oldest first: the open ones (every one with `all=1`)."""
        every = request.args.get("all", "")
        if every not in ("", "0", "1"):
            return _error(400, f"all: expected 1 (every question) or 0 (open ones), got {_short(every)}")
        found = await dash.read(partial(question_queries.list_questions, include_closed=every == "1"), [])
        return _json_response({"questions": [q.to_json() for q in found]})

    @app.post("/api/questions/<anypath:question>/answer")
    async def answer_question(question: str) -> Response:
        """`{"text"}`, `{"option": N}` (from 1) or `{"decline": "reason"}`, as `agent-bridge answer`;
        `scope` with an answer records the decision for that scope instead of the question's."""
        body = await dash.action_body({"text", "option", "decline", "scope"})
        if isinstance(body, Response):
            return body
        return await dash.owner_action("answer", {"questionId": question, **body})


def _jobs(app: QuartTrio, dash: _Dashboard) -> None:
    """Jobs (SPEC §4.7): GET /api/jobs, read-only; POST /api/jobs/<id>/cancel, an owner action
    (`agent-bridge jobs cancel`'s code path)."""

    @app.get("/api/jobs")
    async def jobs() -> Response:
        """Jobs agents delegated, oldest first: running and queued ones (every one with `all=1`)."""
        every = request.args.get("all", "")
        if every not in ("", "0", "1"):
            return _error(400, f"all: expected 1 (every job) or 0 (running and queued), got {_short(every)}")
        found = await dash.read(partial(job_queries.jobs, every=every == "1"), [])
        return _json_response({"jobs": [j.to_json() for j in found]})

    @app.post("/api/jobs/<anypath:job>/cancel")
    async def cancel_job(job: str) -> Response:
        """A queued job ends at once; a running one is stopped (its parent gets the result)."""
        body = await dash.action_body(set())
        if isinstance(body, Response):
            return body
        return await dash.owner_action("job_cancel", {"jobId": job})


def _search(app: QuartTrio, dash: _Dashboard) -> None:
    """GET /api/search?q=: messages, decisions and questions by words (SPEC §4.6 "Search"), read-only,
    as `agent-bridge search --json` prints them; 503 for a database from before the search index."""

    @app.get("/api/search")
    async def search_everything() -> Response:
        query = request.args.get("q", "")
        try:
            words = domain.search_words(query)
        except domain.InputError as exc:
            return _error(400, str(exc))
        hits, more = await dash.read(partial(search.search, words=words), ([], False))
        return _json_response({"query": query, "results": [h.to_json() for h in hits], "more": more})


def _events(app: QuartTrio, dash: _Dashboard) -> None:
    """GET /api/events: the live stream."""

    @app.get("/api/events")
    async def events() -> Response:
        """Server-sent events: `hello` once, then `change` whenever bridge.db changed (at most
        one per CHANGE_GAP), and a keep-alive comment when idle. The stream ends when the
        dashboard stops; a restarted one has a new token, so a reconnect gets 403."""
        client = request.remote_addr or "?"
        if sum(1 for s in dash.streams if s.client == client and not s.closed) >= STREAMS_PER_CLIENT:
            return _error(
                429,
                f"too many live streams from this client (at most {STREAMS_PER_CLIENT}); "
                "the page polls instead",
            )
        stream = _EventStream(client, dash.stream_events)
        dash.streams.add(stream)
        response = Response(stream, content_type="text/event-stream; charset=utf-8")
        response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut the stream after a minute
        return response


class _EventStream:
    """One live stream's body. Counted against its client's limit until it is closed, or until
    it is dropped unstarted (a client gone before the body began: `streams` holds it weakly)."""

    def __init__(self, client: str, run: Callable[[_EventStream], AsyncIterator[bytes]]) -> None:
        self.client = client
        self.closed = False
        self._run = run
        self._body: AsyncIterator[bytes] | None = None  # made on first use: no cycle keeps an unstarted one

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> bytes:
        if self.closed:
            raise StopAsyncIteration
        if self._body is None:
            self._body = self._run(self)
        return await self._body.__anext__()

    async def aclose(self) -> None:
        self.closed = True
        if self._body is not None:
            await self._body.aclose()  # type: ignore[attr-defined]


class _DatabaseWatcher:
    """Standalone: runs `watch_database` in the app's nursery while any stream listens."""

    def __init__(self, db: Path, feed: ChangeFeed) -> None:
        self.db = db
        self.feed = feed
        self.running = False
        self.failed = False  # the watcher died: streams end, so their pages poll instead

    async def ensure_running(self, app: QuartTrio) -> bool:
        """Start watching unless it runs already; returns once the watcher read its first state.
        False when it cannot watch."""
        if not self.running:
            self.running, self.failed = True, False
            try:
                await app.nursery.start(self._watch)
            except RuntimeError:  # it failed before it started (and logged why)
                return False
        return not self.failed

    async def _watch(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await watch_database(self.db, self.feed, task_status=task_status)
        except Exception:  # a background task logs its failure instead of ending the dashboard
            log.exception("watching %s for the live stream failed; pages fall back to polling", self.db)
            self.failed = True
            self.feed.notify()  # wake the streams, so they see it and end
        finally:
            self.running = False


async def _first_of(*waits: Callable[[], Any]) -> None:
    """Return as soon as any of `waits` returns."""
    async with trio.open_nursery() as nursery:
        for wait in waits:

            async def run(wait: Callable[[], Any] = wait) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(run)


def _hop_limit(home: Path) -> int | None:
    """The hop limit sessions of this home run with (active vs passive messages); None when
    the configuration cannot be read (the broker would refuse to start on it too)."""
    try:
        return config.load(home).hop_limit
    except config.ConfigError:
        return None


class _Unreadable(Exception):
    """bridge.db exists but cannot be read (a newer schema, corruption, permissions)."""


def _filters() -> tuple[str | None, domain.Scope | None]:
    """`q` and `scope` of the current request, checked by the domain rules. No implicit context:
    an absent (or empty) scope means every scope."""
    needle = domain.normalize_query(request.args.get("q"))
    raw_scope = request.args.get("scope")
    lookup = None if raw_scope is None or raw_scope == "" else domain.parse_scope(raw_scope)
    return needle, lookup


def _raw_topic(routed: str, suffix: bytes = HISTORY_SUFFIX) -> str:
    """The topic exactly as the client percent-encoded it.

    The router sees a path the server already decoded (`%2F` became `/`, invalid UTF-8 became
    U+FFFD); the raw path keeps the bytes, so a bad encoding is an error instead of a guess.
    """
    raw = request.scope.get("raw_path")
    if not isinstance(raw, bytes) or not (raw.startswith(HISTORY_PREFIX) and raw.endswith(suffix)):
        return routed
    encoded = raw[len(HISTORY_PREFIX) : len(raw) - len(suffix)]
    try:
        return unquote_to_bytes(encoded).decode("utf-8")
    except UnicodeDecodeError:
        raise domain.InputError(
            "topic: not valid UTF-8 once percent-decoded (use encodeURIComponent)"
        ) from None


def _short(value: str, limit: int = 40) -> str:
    return json.dumps(value if len(value) <= limit else value[:limit] + "…", ensure_ascii=False)

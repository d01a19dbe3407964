"""What the dashboard's routes share (the app is `dashboard.app`): the state folder, the
secrets the guard checks, the pool of read-only reads on worker threads, what is connected, the
checks an owner's action passes before it goes to the broker, and the JSON answers.

A read that fails because of bridge.db itself (a newer schema, corruption, permissions) raises
`Unreadable`, which the app answers with 503 and a message for people.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from functools import partial
from pathlib import Path
from typing import Any

import apsw
import trio
from quart import Response, request

from agent_bridge.common import config, domain, paths
from agent_bridge.dashboard import auth, reads
from agent_bridge.ipc import owner
from agent_bridge.store import reader
from agent_bridge.store.migration import SchemaError

STATIC = Path(__file__).with_name("static")
STATIC_TYPES = {
    "app.js": "text/javascript; charset=utf-8",
    "alerts.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
READ_THREADS = 4  # concurrent read-only connections; a laptop page makes about four requests at once
ACTION_BODY_MAX = 64 * 1024  # an owner action's JSON body: a decision text is at most 4,000 characters
ACTION_TOKEN_HEADER = "X-AB-Token"
TOKEN_META = b'<meta name="ab-token" content="">'

Live = Callable[[], Collection[str]]
Hub = Callable[[], "dict[str, Any] | None"]  # the broker's federation status (SPEC §10), None: none


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


class Dashboard:
    """What the routes share: the state folder, the secrets the guard checks, the read pool,
    what is connected, and the checks and the call of an owner's action."""

    def __init__(
        self, home: Path, *, port: int, token: str, live: Live | None, hub: Hub | None = None
    ) -> None:
        self.home = home
        self.port = port
        self.token = token
        self.live = live
        self.hub = hub  # the broker's hub connection (SPEC §10); None without federation
        db = paths.db_path(home)
        self.reader_pool = Reads(db)
        self.hop_limit = hop_limit(home)
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
        """Run a read, or raise Unreadable with a message for people."""
        try:
            return await self.reader_pool.run(fn, empty)
        except SchemaError as exc:
            raise Unreadable(str(exc)) from None
        except apsw.Error as exc:
            raise Unreadable(f"bridge.db could not be read: {type(exc).__name__}: {exc}") from None

    def with_connected(self, found: list[reads.DecisionReceipt]) -> list[dict[str, Any]]:
        connected = self.connected()
        return [entry.to_json(connected=entry.session.id in connected) for entry in found]

    async def action_body(self, allowed: set[str]) -> dict[str, Any] | Response:
        """The checked JSON object of an action, or the refusal to answer."""
        if not auth.token_matches(request.headers.get(ACTION_TOKEN_HEADER), self.page_token):
            return error(
                403, f"forbidden: an action needs the page's token in {ACTION_TOKEN_HEADER} (reload the page)"
            )
        origin = request.headers.get("Origin")
        if origin is None or origin.lower() not in auth.allowed_origins(self.port):
            return error(403, "forbidden: an action must come from the dashboard's own page (Origin)")
        if request.mimetype != "application/json":
            return error(
                400, f"Content-Type: expected application/json, got {short(request.mimetype or 'nothing')}"
            )
        raw = await request.get_data(as_text=False)
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            return error(400, "body: not a JSON object")
        if not isinstance(body, dict):
            return error(400, "body: expected a JSON object")
        unknown = sorted(set(body) - allowed)
        if unknown:
            return error(
                400,
                f"body: unknown field {short(unknown[0])} "
                f"(it takes: {', '.join(sorted(allowed)) or 'none'})",
            )
        return body

    async def owner_action(self, op: str, args: dict[str, Any]) -> Response:
        if self.live is None:
            return error(
                503,
                "this dashboard is read-only: no broker was running when it started; "
                "start one (agent-bridge up --detach), "
                "then open its dashboard (agent-bridge dashboard --open)",
            )
        try:
            result = await trio.to_thread.run_sync(partial(owner.broker_call, op, home=self.home, **args))
        except owner.CommandError as exc:
            return error(400 if exc.code == owner.BAD_ARGUMENTS else 503, str(exc))
        except OSError as exc:
            return error(503, f"{type(exc).__name__}: {exc}")
        if isinstance(result, dict):
            result.pop(domain.UNMATCHED_ADDRESSES, None)  # what `--json` prints
        return json_response(result)


def json_response(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status=status, content_type="application/json; charset=utf-8")


def error(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


def hop_limit(home: Path) -> int | None:
    """The hop limit sessions of this home run with (active vs passive messages); None when
    the configuration cannot be read (the broker would refuse to start on it too)."""
    try:
        return config.load(home).hop_limit
    except config.ConfigError:
        return None


class Unreadable(Exception):
    """bridge.db exists but cannot be read (a newer schema, corruption, permissions)."""


def short(value: str, limit: int = 40) -> str:
    return json.dumps(value if len(value) <= limit else value[:limit] + "…", ensure_ascii=False)

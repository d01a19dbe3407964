"""The dashboard's API routes (SPEC §6), registered on the app by `register`: the read-only
reads of bridge.db (status, sessions, messages, decisions and a topic's history, receipts,
questions, jobs, search) and the owner's actions (record, retract, send, forget, answer, cancel a
job), which go to the broker exactly as the command line does.

Decision lookups are `domain` + `store.queries`, the same functions the MCP tools and the CLI
use; what only the dashboard asks (receipts, notices) is `dashboard.reads`. A topic in a path is
read from the raw, still percent-encoded path, so a bad encoding is an error instead of a guess.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import apsw
import trio
from quart import Response, request
from quart_trio import QuartTrio

from agent_bridge.common import domain, marks, paths
from agent_bridge.common.rows import Peer
from agent_bridge.dashboard import reads
from agent_bridge.dashboard.state import Dashboard, error, json_response, short
from agent_bridge.store import federation_queries, job_queries, queries, question_queries, search
from agent_bridge.store.ids import now_ms

MESSAGES_DEFAULT = 50
MESSAGES_MAX = 500
HISTORY_PREFIX = b"/api/decisions/"  # a topic's endpoints: <prefix><encodeURIComponent(topic)><suffix>
HISTORY_SUFFIX = b"/history"
RECEIPTS_SUFFIX = b"/receipts"
RETRACT_SUFFIX = b"/retract"


def register(app: QuartTrio, dash: Dashboard) -> None:
    """Every API route but the live stream, by area: the reads, the decisions' reads, the owner's
    actions, the owner's questions, the jobs, the search."""
    _reads(app, dash)
    _decision_reads(app, dash)
    _actions(app, dash)
    _questions(app, dash)
    _jobs(app, dash)
    _search(app, dash)


def _reads(app: QuartTrio, dash: Dashboard) -> None:
    """GET /api/status, /api/sessions, /api/messages: read-only reads of bridge.db and of what is
    connected now."""
    read = dash.read

    @app.get("/api/status")
    async def status() -> Response:
        return json_response(
            {
                "mode": dash.mode(),
                "home": str(dash.home),
                "database": paths.db_path(dash.home).exists(),
                "readOnly": dash.live is None,  # standalone (no broker): reads only (SPEC §1)
                "hopLimit": dash.hop_limit,
                **({} if dash.hub is None or dash.hub() is None else {"federation": await _federation(dash)}),
            }
        )

    @app.get("/api/sessions")
    async def sessions() -> Response:
        peers = await read(queries.list_peers, [])
        connected = dash.connected()
        states = await trio.to_thread.run_sync(
            partial(_states, dash.home, peers, connected), limiter=dash.reader_pool.limiter
        )
        team = await read(partial(federation_queries.remote_sessions, now=now_ms()), [])
        # with federation (SPEC §10): `machine` on every session, null here; without, as before
        here: dict[str, Any] = {"machine": None} if team or (dash.hub is not None and dash.hub()) else {}
        return json_response({"sessions": [
            *({**p.to_json(), "connected": p.id in connected, **here, **state.to_json()}
              for p, state in zip(peers, states, strict=True)),
            *(_remote(r) for r in team),  # the team's other machines
        ]})

    @app.get("/api/messages")
    async def messages() -> Response:
        try:
            limit = _messages_limit(request.args.get("limit", ""))
        except domain.InputError as exc:
            return error(400, str(exc))
        kind = request.args.get("kind", "")
        if kind not in ("", *reads.MESSAGE_KINDS):
            return error(
                400, f'kind: expected "message" or "notice" (or nothing for both), got {short(kind)}'
            )
        found = await read(
            partial(reads.recent_messages, limit=limit, kind=kind or None, hop_limit=dash.hop_limit), []
        )
        return json_response({"messages": found})


def _decision_reads(app: QuartTrio, dash: Dashboard) -> None:
    """GET /api/decisions…, /api/receipts: decisions, a topic's history, who got what."""
    read = dash.read

    @app.get("/api/decisions")
    async def decisions() -> Response:
        try:
            needle, lookup = _filters()
        except domain.InputError as exc:
            return error(400, str(exc))
        found = await read(partial(reads.decisions_json, needle=needle, lookup=lookup), [])
        return json_response({"decisions": found})

    @app.get("/api/decisions/<anypath:topic>/history")
    async def history(topic: str) -> Response:
        try:
            normalized = domain.normalize_topic(_raw_topic(topic))
            needle, lookup = _filters()
        except domain.InputError as exc:
            return error(400, str(exc))
        found = await read(
            partial(reads.decisions_json, needle=needle, lookup=lookup, history=True, topic=normalized), []
        )
        # Beside the decision objects, never inside them: the topic's retractions, newest first.
        retracted = await read(partial(reads.retractions_json, topic=normalized), [])
        return json_response({"topic": normalized, "decisions": found, "retractions": retracted})

    @app.get("/api/decisions/<anypath:topic>/receipts")
    async def topic_receipts(topic: str) -> Response:
        """Who every revision of a topic was queued for, and who has acknowledged it."""
        try:
            normalized = domain.normalize_topic(_raw_topic(topic, RECEIPTS_SUFFIX))
        except domain.InputError as exc:
            return error(400, str(exc))
        found = await read(partial(_topic_receipts, topic=normalized), [])
        return json_response({"topic": normalized, "receipts": dash.with_connected(found)})

    @app.get("/api/receipts")
    async def receipts() -> Response:
        """Receipts of every current decision (the decisions table shows them per row)."""
        found = await read(_current_receipts, [])
        return json_response({"receipts": dash.with_connected(found)})


def _remote(r: federation_queries.RemoteSession) -> dict[str, Any]:
    return {"id": r.id, "name": r.address, "agent": r.agent, "project": r.project, "hostSessionId": None,
            "kind": r.kind, "createdAt": None, "lastSeenAt": r.last_heard, "machine": r.machine,
            "connected": r.state != "offline", "state": r.state, "stateSince": r.last_heard}


async def _federation(dash: Dashboard) -> dict[str, Any]:
    """The status card's federation line: the hub as the broker has it, the machines heard."""
    hub = dash.hub() if dash.hub is not None else None
    machines = await dash.read(federation_queries.machines, [])
    outbox = await dash.read(federation_queries.outbox_stats, federation_queries.OutboxStats(0, None))
    return {**(hub or {}), "machines": [{"name": m.name, "heardAt": m.heard_at} for m in machines],
            "outbox": {"depth": outbox.depth, "oldest": outbox.oldest, "unconfirmed": outbox.unconfirmed,
                       "decisions": outbox.decisions, "awaitingFirstMachine": outbox.parked}}


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
        raise domain.InputError(f"limit: expected an integer 1..{MESSAGES_MAX}, got {short(raw)}")
    return limit


def _actions(app: QuartTrio, dash: Dashboard) -> None:
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
            return error(400, str(exc))
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


def _questions(app: QuartTrio, dash: Dashboard) -> None:
    """Owner questions (SPEC §4.6): GET /api/questions, read-only; POST
    /api/questions/<id>/answer, an owner action (`agent-bridge answer`'s code path)."""

    @app.get("/api/questions")
    async def questions() -> Response:
        """Questions agents asked the owner, oldest first: the open ones (every one with `all=1`)."""
        every = request.args.get("all", "")
        if every not in ("", "0", "1"):
            return error(400, f"all: expected 1 (every question) or 0 (open ones), got {short(every)}")
        found = await dash.read(partial(question_queries.list_questions, include_closed=every == "1"), [])
        return json_response({"questions": [q.to_json() for q in found]})

    @app.post("/api/questions/<anypath:question>/answer")
    async def answer_question(question: str) -> Response:
        """`{"text"}`, `{"option": N}` (from 1) or `{"decline": "reason"}`, as `agent-bridge answer`;
        `scope` with an answer records the decision for that scope instead of the question's."""
        body = await dash.action_body({"text", "option", "decline", "scope"})
        if isinstance(body, Response):
            return body
        return await dash.owner_action("answer", {"questionId": question, **body})


def _jobs(app: QuartTrio, dash: Dashboard) -> None:
    """Jobs (SPEC §4.7): GET /api/jobs, read-only; POST /api/jobs/<id>/cancel, an owner action
    (`agent-bridge jobs cancel`'s code path)."""

    @app.get("/api/jobs")
    async def jobs() -> Response:
        """Jobs agents delegated, oldest first: running and queued ones (every one with `all=1`)."""
        every = request.args.get("all", "")
        if every not in ("", "0", "1"):
            return error(400, f"all: expected 1 (every job) or 0 (running and queued), got {short(every)}")
        found = await dash.read(partial(job_queries.jobs, every=every == "1"), [])
        return json_response({"jobs": [j.to_json() for j in found]})

    @app.post("/api/jobs/<anypath:job>/cancel")
    async def cancel_job(job: str) -> Response:
        """A queued job ends at once; a running one is stopped (its parent gets the result)."""
        body = await dash.action_body(set())
        if isinstance(body, Response):
            return body
        return await dash.owner_action("job_cancel", {"jobId": job})


def _search(app: QuartTrio, dash: Dashboard) -> None:
    """GET /api/search?q=: messages, decisions and questions by words (SPEC §4.6 "Search"), read-only,
    as `agent-bridge search --json` prints them; 503 for a database from before the search index."""

    @app.get("/api/search")
    async def search_everything() -> Response:
        query = request.args.get("q", "")
        try:
            words = domain.search_words(query)
        except domain.InputError as exc:
            return error(400, str(exc))
        hits, more = await dash.read(partial(search.search, words=words), ([], False))
        return json_response({"query": query, "results": [h.to_json() for h in hits], "more": more})


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

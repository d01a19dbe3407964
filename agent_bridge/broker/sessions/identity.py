"""Who is who (SPEC §3): which session record a connection is, and when two records are one.

The broker's dispatch calls in here at hello (`attach`), at the end of a connection
(`detach`), for a hook's report (`reports`: sessions.reports) and for an identity an MCP
server saw itself (`learn`). The pairing rules live here and nowhere else:

1. Resume. A connection that presents a session id with that session's secret (handed out at
   its hello) is that session, whatever else it says: an MCP server keeps its session across
   broker restarts. Only the secret's hash is stored.
2. Host session id. Strongest source first (`RANK_*`): `--host-session-id`, a hook's report
   for the host instance, `CLAUDE_CODE_SESSION_ID`, Codex `_meta`. One connection holds a host
   session id at a time: a stronger source takes it from a weaker one, a tie keeps the
   incumbent, and the refused connection is told why (`Refused`) and backs off.
3. Host instance. Without a host session id, the host instance (nearest agent host, else the
   MCP server's parent, on pid and start time) names the session it ran before, when exactly
   one of its sessions is not connected: a host restarting its MCP server gets it back.
4. Tentative. A new record with no host identity (or only one from the environment) that has
   made no tool call gets no decision notices (the ones it missed are queued if it becomes
   real) and, if it leaves that way (a health check), leaves nothing behind.
5. Names are never uuid-shaped and never another session's id or host session id.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw
import trio

from agent_bridge import hosts
from agent_bridge.broker.args import (
    ADDRESS_MAX,
    no_unknown,
    opt_str,
    parse_host,
    parse_parent,
    parse_resume,
)
from agent_bridge.broker.sessions.registry import Registry
from agent_bridge.broker.sessions.reports import HookReports
from agent_bridge.broker.sessions.session import (
    RANK_CLAUDE_ENV,
    RANK_CODEX_META,
    RANK_EXPLICIT,
    RANK_HOOK,
    RANK_NONE,
    Link,
    Session,
)
from agent_bridge.common import domain
from agent_bridge.common.domain import InputError
from agent_bridge.common.projectkey import project_key
from agent_bridge.common.rows import Peer
from agent_bridge.ipc import frames
from agent_bridge.ipc.protocol import Refused
from agent_bridge.store.ids import now_ms

if TYPE_CHECKING:
    from agent_bridge.broker.storage import StoreCalls

log = logging.getLogger("agent_bridge.identity")

SECRET_BYTES = 32
SAID_MEMORY = 1000  # refusals already logged (per host session id and process): each once
SOURCE_NAMES = {
    RANK_NONE: "no host identity",
    RANK_CODEX_META: "Codex tool-call _meta",
    RANK_CLAUDE_ENV: "CLAUDE_CODE_SESSION_ID",
    RANK_HOOK: "a hook's report",
    RANK_EXPLICIT: "--host-session-id",
}
HELLO_ARGS = {
    "agent",
    "project",
    "kind",
    "name",
    "hostSessionId",
    "claudeSessionId",
    "host",
    "chain",
    "pid",
    "resume",
}


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def choose_host_session(
    explicit: str | None, host_candidates: list[str], claude_env: str | None
) -> tuple[str | None, int, bool]:
    """(host session id, the rank of its source, ambiguous) from what a hello carries."""
    if explicit is not None:
        return explicit, RANK_EXPLICIT, False
    if len(host_candidates) == 1:
        return host_candidates[0], RANK_HOOK, False
    if len(host_candidates) > 1:
        return None, RANK_NONE, True  # several threads on one host: never guess
    if claude_env is not None:
        return claude_env, RANK_CLAUDE_ENV, False
    return None, RANK_NONE, False


def is_tentative(how: str, rank: int) -> bool:
    """A connection that may be a health check: a record made by this hello, unless its host
    session id came from the command line or a hook's report for its host (one from the
    environment is no proof: `claude mcp list` hands every server it probes a fresh
    CLAUDE_CODE_SESSION_ID). A record found again (resumed, by host session id or host
    instance) was a session before: it stays one."""
    return how == "new" and rank < RANK_HOOK


def takes_over(rank: int, incumbent_rank: int) -> bool:
    """A second connection for one host session id wins only with a stronger source."""
    return rank > incumbent_rank


class Identity:
    """The rules above, over the connected sessions (`registry`), the store (`db`), the home
    folder (hooks' reports) and the broker's `stop` (set once it is shutting down)."""

    def __init__(self, registry: Registry, db: StoreCalls, home: Path, stop: trio.Event) -> None:
        self.registry = registry
        self._db = db
        self.home = home
        self.stop = stop
        self.lock = trio.Lock()  # attach/learn/identify change who is who: one at a time
        self._said: set[str] = set()
        self.reports = HookReports(self, db, home)  # what hooks say about the host they run under

    # --- hello ---------------------------------------------------------------------

    async def attach(self, conn: Link, args: dict[str, Any]) -> Session:
        no_unknown(args, HELLO_ARGS, "hello")
        agent = domain.normalize_agent(args.get("agent", hosts.DEFAULT.name))
        project = domain.normalize_folder(args.get("project"), what="project")
        kind = args.get("kind", "interactive")
        if kind not in ("interactive", "job"):
            raise InputError(f"kind: expected \"interactive\" or \"job\", got {kind!r}")
        name = opt_str(args, "name", ADDRESS_MAX)
        if name is not None:
            domain.check_session_name(name)
        explicit = opt_str(args, "hostSessionId", ADDRESS_MAX)
        claude_env = opt_str(args, "claudeSessionId", ADDRESS_MAX)
        host = parse_host(args.get("host"))
        instance = host or parse_parent(args.get("chain"))
        resume = parse_resume(args.get("resume"))
        pid = args.get("pid") if isinstance(args.get("pid"), int) else None
        db, registry = self._db, self.registry

        async with self.lock:
            await self.reports.ingest()
            peer, how, hsid, rank, _ambiguous = await self._find_record(
                resume, explicit, claude_env, host, instance, pid, agent=agent, project=project, kind=kind
            )
            if name is not None and await db.session_addresses_taken(
                name, excluding=None if peer is None else peer.id
            ):
                raise InputError(
                    f"name: {name!r} is another session's id or host session id; choose another name"
                )
            if peer is not None:
                held = registry.get(peer.id)
                if held is not None:
                    if how != "resumed" and not takes_over(rank, held.rank):
                        raise self._refusal(hsid, held, rank, pid)
                    log.info("session %s: a new connection (%s) replaces its previous one", held.name, how)
                    registry.drop(held)
                    await held.conn.aclose()
            now = now_ms()
            if peer is not None:
                base = peer.name if how == "resumed" else name or peer.name
                free = await self._free_name(base, peer.id)
                if how == "resumed":  # a resumed session is exactly what it was
                    peer = await db.update_peer(peer.id, name=free, last_seen_at=now)
                else:
                    peer = await db.update_peer(
                        peer.id, name=free, last_seen_at=now, project=project, agent=agent, kind=kind
                    )
            else:
                base = name or domain.session_name(agent, project)
                peer = await db.create_peer(
                    agent=agent,
                    name=await self._free_name(base, None),
                    project=project,
                    kind=kind,
                    host_session_id=hsid,
                    now=now,
                )
            if how == "resumed":
                assert resume is not None  # only a hello that presented one is resumed
                secret = resume[1]
            else:  # a new holder: an earlier secret for this record stops working
                secret = secrets.token_urlsafe(SECRET_BYTES)
                await db.set_secret(peer.id, hash_secret(secret))
            if instance is not None:
                await db.record_instance_session(*instance, peer.id, now)
            session = Session(conn=conn, peer=peer, host=host, rank=rank if hsid else RANK_NONE)
            session.secret, session.instance = secret, instance
            session.tentative = is_tentative(how, rank)
            registry.add(session)
            if hsid is not None and not session.tentative:
                try:
                    await self.catch_up(session)
                except BaseException:
                    registry.drop(session)  # the hello fails: no session without a connection task
                    raise
        log.info(
            "session %s connected (%s, %s)", session.name, session.id, hsid or f"no host session id, {how}"
        )
        return session

    async def _find_record(
        self,
        resume: tuple[str, str] | None,
        explicit: str | None,
        claude_env: str | None,
        host: tuple[int, int] | None,
        instance: tuple[int, int] | None,
        pid: int | None,
        *,
        agent: str,
        project: str,
        kind: str,
    ) -> tuple[Peer | None, str, str | None, int, bool]:
        """The existing record a hello names, by rules 1 to 3 of this module, as (record or
        None, how it was found, host session id, the rank of its source, ambiguous)."""
        db = self._db
        if resume is not None:
            peer = await self._resumable(*resume, pid)
            if peer is not None:
                hsid = peer.host_session_id
                return peer, "resumed", hsid, _resumed_rank(hsid, explicit), False
        candidates = [] if host is None else await db.host_sessions_for(*host)
        hsid, rank, ambiguous = choose_host_session(explicit, candidates, claude_env)
        if ambiguous:
            log.warning(
                "host %s runs %d sessions; identity ambiguous until _meta or a hook", host, len(candidates)
            )
        if hsid is not None:
            peer = await db.peer_by_host_session(hsid)
            return peer, "host session" if peer is not None else "new", hsid, rank, False
        if instance is not None and not ambiguous:
            ran = await db.instance_sessions(*instance, agent=agent, project=project, kind=kind)
            free = [p for p in ran if p not in self.registry]
            if len(free) == 1:
                return await db.get_peer(free[0]), "host instance", None, RANK_NONE, False
        return None, "new", None, RANK_NONE, ambiguous

    async def _resumable(self, peer_id: str, secret: str, pid: int | None) -> Peer | None:
        """The session `peer_id` names (after any merge), when `secret` is its secret."""
        peer = await self._db.peer_with_secret(peer_id, hash_secret(secret))
        if peer is not None:
            return peer
        self._say_once(
            f"resume:{peer_id}:{pid}",
            "a connection presented session %s with a secret that is not its own; not resumed",
            peer_id,
        )
        return None

    async def _free_name(self, base: str, own_id: str | None) -> str:
        """`base` deduplicated against connected sessions' names and every session's id and
        host session id (a name must never capture another session's address)."""
        db = self._db
        taken = self.registry.connected_names()
        while True:
            name = domain.dedupe_name(base, taken)
            if not await db.session_addresses_taken(name, excluding=own_id):
                return name
            taken.add(name)

    def _refusal(self, hsid: str | None, held: Session, rank: int, pid: int | None) -> Refused:
        reason = (
            f"host session {hsid} is already connected as {held.name} (identified by "
            f"{SOURCE_NAMES.get(held.rank, held.rank)}); this connection's claim "
            f"({SOURCE_NAMES.get(rank, rank)}) does not outrank it, so it waits and retries"
        )
        self._say_once(f"refused:{hsid}:{pid}", "refused a second connection (pid %s): %s", pid, reason)
        return Refused(reason)

    def _say_once(self, key: str, message: str, *args: Any) -> None:
        if key in self._said:
            return
        if len(self._said) >= SAID_MEMORY:
            self._said.clear()
        self._said.add(key)
        log.warning(message, *args)

    # --- the end of a connection, and its first tool call ----------------------------

    async def detach(self, session: Session) -> None:
        if not self.registry.holds(session):
            return
        self.registry.drop(session)
        db = self._db
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                # Only a connection that left: at a broker shutdown its MCP server will resume it.
                leaving = session.tentative and not self.stop.is_set()
                if leaving and await db.forget_unused_peer(session.id):
                    log.info(
                        "session %s left without a host identity or a tool call; nothing kept", session.name
                    )
                    return
                log.info("session %s disconnected", session.name)
                if not self.stop.is_set():  # at a shutdown, written for every session at once
                    await db.touch_peers([session.id], now_ms())
            # last seen is a courtesy; a failing disk must not crash this
            except (OSError, apsw.Error) as exc:
                log.warning("could not record when %s was last seen: %s", session.name, exc)

    async def on_request(self, session: Session) -> None:
        """The session made a tool call: it is a real session from now on."""
        if session.tentative:
            session.tentative = False
            await self.queue_missed(session)

    async def confirm(self, session: Session) -> None:
        """A source as strong as a hook vouches for the session's host session id: it is real."""
        if session.tentative and session.rank >= RANK_HOOK:
            session.tentative = False
            await self.queue_missed(session)

    async def queue_missed(self, session: Session) -> None:
        """Decisions recorded while the session was tentative, now that it is not."""
        if session.tentative:
            return
        if session.host_session_id:  # the catch-up its hello did not queue covers them (SPEC §4.4)
            session.missed.clear()
            await self.catch_up(session)
            return
        if not session.missed:
            return
        ids, session.missed = session.missed, []
        queued = await self._db.catch_up(session.view(), now_ms(), only=ids, key_of=project_key)
        if queued:
            session.poke()

    # --- learning a host session id ------------------------------------------------------

    async def learn_from_session(self, session: Session, hsid: str, source: str) -> bool:
        rank = {"codex-meta": RANK_CODEX_META, "claude-env": RANK_CLAUDE_ENV}.get(source, RANK_CODEX_META)
        async with self.lock:
            return await self.learn(session, hsid, rank)

    async def learn(self, session: Session, hsid: str, rank: int) -> bool:
        """`session` is host session `hsid` (by a source of strength `rank`). Caller holds the lock."""
        registry, db = self.registry, self._db
        if session.host_session_id == hsid:
            session.rank = max(session.rank, rank)
            await self.confirm(session)
            return True
        if session.host_session_id and rank < session.rank:
            return False  # a weaker source never overrides a stronger one
        if (
            session.host_session_id
            and rank == RANK_HOOK
            and session.rank == RANK_HOOK
            and session.peer.agent not in hosts.EXCLUSIVE
        ):
            # Several Codex threads on one host: never guess which one this connection is.
            log.warning("session %s: host reports another thread %s; identity ambiguous", session.name, hsid)
            return False
        other = await db.peer_by_host_session(hsid)
        if other is not None and other.id != session.id:
            if other.id in registry:
                self._say_once(
                    f"held:{hsid}:{session.id}",
                    "host session %s is already connected as %s; not pairing %s",
                    hsid,
                    other.name,
                    session.name,
                )
                return False
            # The connection is that earlier session: same id, same name if free, same receipts.
            old_id = session.id
            await db.absorb_peer(old_id, other.id)
            name = domain.dedupe_name(other.name, registry.connected_names(excluding=session))
            peer = await db.update_peer(
                other.id,
                name=name,
                project=session.peer.project,
                agent=session.peer.agent,
                kind=session.peer.kind,
                last_seen_at=now_ms(),
            )
            # registered under its old id until here: never unregistered while connected
            registry.drop(session)
            session.peer = peer
            registry.add(session)
            # What the connection is showing now (session.showing) is the merged record's: its
            # ack, a Stop check and a crash before the ack (persist_offers) all look under the new id.
            log.info("connection of %s is the earlier session %s (%s)", old_id, session.name, hsid)
        else:
            previous = session.host_session_id
            session.peer = await db.update_peer(session.id, host_session_id=hsid)
            if previous is None:
                await db.adopt_host_key(session.id, hsid)
        session.rank = rank
        session.tentative = False
        session.missed.clear()  # the catch-up below queues every current decision it has not had
        await self.catch_up(session)
        session.poke(replay=True)
        session.notify(frames.Identity(session.public()))
        return True

    async def catch_up(self, session: Session) -> None:
        if session.is_job or not session.host_session_id:
            return
        queued = await self._db.catch_up(session.view(), now_ms(), key_of=project_key)
        if queued:
            log.info("catch-up: %d decision(s) queued for %s", queued, session.name)
            session.poke()


def _resumed_rank(hsid: str | None, explicit: str | None) -> int:
    """How strongly a resumed session's host session id is known: explicit when this hello
    names it so, else a hook's strength (it was learned before, by a source no longer at hand)."""
    if hsid is None:
        return RANK_NONE
    return RANK_EXPLICIT if explicit == hsid else RANK_HOOK

"""The broker's state and its request handlers: sessions, decisions, messages, identity.

Everything that changes bridge.db goes through the StoreRunner (the only writer); the
in-memory state is which sessions are connected right now.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import apsw
import trio

from agent_bridge import domain, ledger, paths
from agent_bridge.config import Settings
from agent_bridge.daemon.sessions import (
    RANK_CLAUDE_ENV,
    RANK_CODEX_META,
    RANK_EXPLICIT,
    RANK_HOOK,
    RANK_NONE,
    Session,
)
from agent_bridge.daemon.storage import StoreRunner
from agent_bridge.domain import CLI_AGENT, InputError, SessionView
from agent_bridge.ipc import protocol
from agent_bridge.ipc.stream import FramedStream
from agent_bridge.store.writer import CLI_AUTHOR, Outgoing, Recipient, host_key, now_ms

log = logging.getLogger("agent_bridge.broker")

ADDRESS_MAX = 200
EXCLUSIVE_HOSTS = frozenset({"claude"})  # one conversation per host process; Codex may run several


class Broker:
    def __init__(
        self,
        store: StoreRunner,
        settings: Settings,
        home: Path,
        stop: trio.Event,
        *,
        fault: Callable[[str], None] = lambda point: None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.home = home
        self.stop = stop
        self.fault = fault
        self.sessions: dict[str, Session] = {}  # peer id -> the connected session
        self.started_at = now_ms()
        self.socket_path = ""
        self.web_url: str | None = None
        self._identity_lock = trio.Lock()  # attach/learn/identify change who is who: one at a time
        # Messages a session's MCP server is showing its host and has not acknowledged yet
        # (peer id -> message ids): kept here, so an offer costs no commit; an acknowledgement
        # writes receipts.delivered_at with acked_at, and what is left when a connection ends
        # is written then (persist_offers). Pushes of these are marked as repeats.
        self.offered: dict[str, set[str]] = {}

    # --- state -----------------------------------------------------------------------

    def connected_ids(self) -> set[str]:
        return set(self.sessions)

    def connected_names(self, *, excluding: Session | None = None) -> set[str]:
        return {s.name for s in self.sessions.values() if s is not excluding}

    def find_connected(self, address: str) -> Session | None:
        for s in self.sessions.values():
            if address in (s.id, s.name, s.host_session_id):
                return s
        return None

    # --- attach / detach -------------------------------------------------------------

    async def attach(self, conn: FramedStream, args: dict[str, Any]) -> Session:
        allowed = {"agent", "project", "kind", "name", "hostSessionId", "claudeSessionId", "host", "chain", "pid"}
        _no_unknown(args, allowed, "hello")
        agent = domain.normalize_agent(args.get("agent", "claude"))
        project = domain.normalize_folder(args.get("project"), what="project")
        kind = args.get("kind", "interactive")
        if kind not in ("interactive", "job"):
            raise InputError(f"kind: expected \"interactive\" or \"job\", got {kind!r}")
        name = _opt_str(args, "name", ADDRESS_MAX)
        if name is not None and not domain.AGENT_NAME.match(name.replace(" ", "-")):
            raise InputError("name: letters, digits, '.', '_' or '-' only, at most 40 characters")
        explicit = _opt_str(args, "hostSessionId", ADDRESS_MAX)
        claude_env = _opt_str(args, "claudeSessionId", ADDRESS_MAX)
        host = _parse_host(args.get("host"))

        async with self._identity_lock:
            await self.ingest_reports()
            hsid, rank, ambiguous = explicit, RANK_EXPLICIT if explicit else RANK_NONE, False
            if hsid is None and host is not None:
                candidates = await self.store.run(self.store.store.host_sessions_for, *host)
                if len(candidates) == 1:
                    hsid, rank = candidates[0], RANK_HOOK
                elif len(candidates) > 1:
                    ambiguous = True
                    log.warning("host %s runs %d sessions; identity ambiguous until _meta or a hook", host, len(candidates))
            if hsid is None and claude_env and not ambiguous:
                hsid, rank = claude_env, RANK_CLAUDE_ENV
            now = now_ms()
            peer = None
            if hsid is not None:
                peer = await self.store.run(self.store.store.peer_by_host_session, hsid)
            if peer is not None:
                held = self.sessions.get(peer["id"])
                if held is not None:  # a reloaded MCP server whose old connection is not gone yet
                    log.info("session %s reconnected; closing its previous connection", peer["name"])
                    self._drop(held)
                    await held.conn.aclose()
                base = name or peer["name"]
                final = domain.dedupe_name(base, self.connected_names())
                peer = await self.store.run(
                    self.store.store.update_peer,
                    peer["id"],
                    name=final,
                    project=project,
                    agent=agent,
                    kind=kind,
                    lastSeenAt=now,
                )
            else:
                base = name or domain.session_name(agent, project)
                final = domain.dedupe_name(base, self.connected_names())
                peer = await self.store.run(
                    self.store.store.create_peer,
                    agent=agent,
                    name=final,
                    project=project,
                    kind=kind,
                    host_session_id=hsid,
                    now=now,
                )
            session = Session(conn=conn, peer=peer, host=host, rank=rank if hsid else RANK_NONE, ambiguous=ambiguous)
            self.sessions[session.id] = session
            if hsid is not None:
                try:
                    await self._catch_up(session)
                except BaseException:
                    self._drop(session)  # the hello fails: no session without a connection task
                    raise
        log.info("session %s connected (%s, %s)", session.name, session.id, hsid or "pending identity")
        return session

    def _drop(self, session: Session) -> None:
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]

    async def detach(self, session: Session) -> None:
        if self.sessions.get(session.id) is not session:
            return
        self._drop(session)
        log.info("session %s disconnected", session.name)
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await self.store.run(self.store.store.touch_peers, [session.id], now_ms())
            except (OSError, apsw.Error) as exc:  # last seen is a courtesy; a failing disk must not crash this
                log.warning("could not record when %s was last seen: %s", session.name, exc)

    # --- identity (SPEC §3) -----------------------------------------------------------

    async def learn(self, session: Session, hsid: str, rank: int) -> bool:
        """`session` is host session `hsid` (by a source of strength `rank`). Caller holds the lock."""
        store = self.store.store
        if session.host_session_id == hsid:
            session.rank = max(session.rank, rank)
            return True
        if session.host_session_id and rank < session.rank:
            return False  # a weaker source never overrides a stronger one
        if session.host_session_id and rank == RANK_HOOK and session.rank == RANK_HOOK and session.peer["agent"] not in EXCLUSIVE_HOSTS:
            session.ambiguous = True  # several Codex threads on one host: never guess
            log.warning("session %s: host reports another thread %s; identity ambiguous", session.name, hsid)
            return False
        other = await self.store.run(store.peer_by_host_session, hsid)
        if other is not None and other["id"] != session.id:
            if other["id"] in self.sessions:
                log.warning("host session %s is already connected as %s; not pairing %s", hsid, other["name"], session.name)
                session.ambiguous = True
                return False
            # The connection is that earlier session: same id, same name if free, same receipts.
            old_id = session.id
            await self.store.run(store.absorb_peer, old_id, other["id"])
            name = domain.dedupe_name(other["name"], self.connected_names(excluding=session))
            peer = await self.store.run(
                store.update_peer,
                other["id"],
                name=name,
                project=session.peer["project"],
                agent=session.peer["agent"],
                kind=session.peer["kind"],
                lastSeenAt=now_ms(),
            )
            self._drop(session)  # registered under its old id until here: never unregistered while connected
            session.peer = peer
            self.sessions[session.id] = session
            log.info("connection of %s is the earlier session %s (%s)", old_id, session.name, hsid)
        else:
            previous = session.host_session_id
            session.peer = await self.store.run(store.update_peer, session.id, hostSessionId=hsid)
            if previous is None:
                await self.store.run(store.adopt_host_key, session.id, hsid)
        session.rank = rank
        session.ambiguous = False
        await self._catch_up(session)
        session.poke(replay=True)
        session.notify(protocol.push("identity", session=session.public()))
        return True

    async def _catch_up(self, session: Session) -> None:
        if session.is_job or not session.host_session_id:
            return
        queued = await self.store.run(self.store.store.catch_up, session.view(), now_ms())
        if queued:
            log.info("catch-up: %d decision(s) queued for %s", queued, session.name)
            session.poke()

    async def identify(self, args: dict[str, Any]) -> dict[str, Any]:
        """A hook reports the host session id of the host it runs under."""
        allowed = {"hostSessionId", "agent", "host", "chain", "cwd", "source", "event", "at"}
        _no_unknown(args, allowed, "identify")
        hsid = _req_str(args, "hostSessionId", ADDRESS_MAX)
        agent = domain.normalize_agent(args.get("agent", "claude"))
        host = _parse_host(args.get("host"))
        async with self._identity_lock:
            return await self._identify(hsid, agent, host)

    async def _identify(self, hsid: str, agent: str, host: tuple[int, int] | None) -> dict[str, Any]:
        store = self.store.store
        if host is not None:
            await self.store.run(
                store.record_host_instance, host[0], host[1], hsid, agent, now_ms(), exclusive=agent in EXCLUSIVE_HOSTS
            )
        bound = self.find_connected(hsid)
        if bound is not None and bound.host_session_id == hsid:
            bound.rank = max(bound.rank, RANK_HOOK)
            return {"session": bound.public(), "paired": True}
        candidates = [s for s in self.sessions.values() if host is not None and s.host == host]
        if len(candidates) == 1:
            paired = await self.learn(candidates[0], hsid, RANK_HOOK)
            return {"session": candidates[0].public() if paired else None, "paired": paired}
        if len(candidates) > 1:
            log.warning("host %s has %d connected sessions; cannot tell which is %s", host, len(candidates), hsid)
            return {"session": None, "paired": False, "ambiguous": True}
        peer = await self.store.run(store.peer_by_host_session, hsid)
        session = None if peer is None else {k: peer.get(k) for k in ("id", "name", "agent", "project", "hostSessionId", "kind")}
        return {"session": session, "paired": False}

    async def ingest_reports(self) -> int:
        """Identity reports hooks left in the home folder while no broker ran."""
        folder = self.home / paths.REPORTS_DIR
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return 0
        count = 0
        for entry in names:
            if not entry.endswith(".json"):
                continue
            path = folder / entry
            try:
                report = json.loads(path.read_text(encoding="utf-8"))
                hsid = _req_str(report, "hostSessionId", ADDRESS_MAX)
                agent = domain.normalize_agent(report.get("agent", "claude"))
                host = _parse_host(report.get("host"))
                await self._identify(hsid, agent, host)
                count += 1
            except (OSError, ValueError, InputError) as exc:
                log.warning("ignored identity report %s: %s", entry, exc)
            try:
                path.unlink()
            except OSError:
                pass
        return count

    # --- requests from sessions --------------------------------------------------------

    async def handle(self, session: Session | None, op: str, args: dict[str, Any]) -> Any:
        if session is None:
            if op == "identify":
                return await self.identify(args)
            if op == "stop_check":
                return await self.stop_check(args)
            if op == "stop_ack":
                return await self.stop_ack(args)
            if op == "status":
                return self.status()
            if op == "shutdown":
                return {"stopping": True}  # the connection sets `stop` once this answer is sent
            if op == "ping":
                return "pong"
            command = self.COMMAND_OPS.get(op)
            if command is not None:
                return await command(self, args)
            raise InputError(f"{op}: needs a session connection (send hello first)")
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise InputError(f"{op}: not available on a session connection")
        return await handler(session, args)

    async def op_ping(self, session: Session, args: dict[str, Any]) -> Any:
        return "pong"

    async def op_status(self, session: Session, args: dict[str, Any]) -> Any:
        return self.status()

    async def op_whoami(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, set(), "whoami")
        return session.public()

    async def op_peers(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, {"project"}, "peers")
        project = args.get("project")
        if project is not None:
            project = domain.normalize_folder(project, what="project")
        rows = await self.store.run(self.store.store.list_peers)
        out = []
        for row in rows:
            if project is not None and row["project"] != project:
                continue
            item = {k: row[k] for k in ("id", "name", "agent", "project", "hostSessionId", "kind")}
            item["connected"] = row["id"] in self.sessions
            out.append(item)
        out.sort(key=lambda p: (not p["connected"], p["name"]))
        return out

    async def op_decide(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, {"topic", "text", "scope", "source_message_id"}, "decide")
        return await self._decide(session.view(), session.peer["agent"], session.peer["project"], args)

    async def _decide(self, author: SessionView, author_agent: str, project: str, args: dict[str, Any]) -> Any:
        """One revision by `author`; an omitted scope is `project` (the author's folder)."""
        topic = domain.normalize_topic(args.get("topic"))
        text = domain.normalize_text(args.get("text"))
        raw_scope = args.get("scope")
        scope = {"project": project} if raw_scope is None else domain.parse_scope(raw_scope)
        source = args.get("source_message_id")
        if not isinstance(source, str) or len(source) > ADDRESS_MAX:
            source = None  # provenance that names no bridge message is stored as null (SPEC §4.1)
        recipients = [
            Recipient(s.view(), host_key(s.view()))
            for s in self.sessions.values()
            if not s.is_job and domain.scope_applies(scope, s.view())
        ]
        decision, delivered = await self.store.run(
            self.store.store.record_decision,
            author=author,
            author_agent=author_agent,
            topic=topic,
            text=text,
            scope=scope,
            source_message_id=source,
            recipients=recipients,
            now=now_ms(),
            fault=self.fault,
        )
        for r in recipients:
            target = self.sessions.get(r.session.id)
            if target is not None:
                target.poke()
        return {"decision": decision, "deliveredTo": delivered}

    async def op_decisions(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, {"query", "scope", "history"}, "decisions")
        needle = domain.normalize_query(args.get("query"))
        history = args.get("history", False)
        if not isinstance(history, bool):
            raise InputError(f"history: expected true or false, got {history!r}")
        raw_scope = args.get("scope")
        lookup = {"project": session.peer["project"]} if raw_scope is None else domain.parse_scope(raw_scope)
        caller = session.view().addresses if domain.scope_kind(lookup) == "project" else frozenset()
        return await self.store.run(
            self.store.store.decisions, needle=needle, lookup=lookup, caller_addresses=caller, history=history
        )

    async def op_send(self, session: Session, args: dict[str, Any]) -> Any:
        (result,) = await self.send_batch(session, [args])
        if isinstance(result, InputError):
            raise result
        return result

    async def send_batch(self, session: Session, batch: list[dict[str, Any]]) -> list[dict[str, Any] | InputError]:
        """Sends of one session that arrived together, answered in order: each is checked on
        its own (a bad one gets its error, the others go on); the good ones are committed in
        one transaction. A client that pipelines its sends gets a group commit."""
        results: list[tuple[Outgoing | InputError, int | None]] = []
        for args in batch:
            try:
                results.append(await self._plan_send(args))
            except InputError as exc:
                results.append((exc, None))
        planned = [r for r, _ in results if isinstance(r, Outgoing)]
        if not planned:
            return [r for r, _ in results if isinstance(r, InputError)]
        now = now_ms()
        messages = iter(await self.store.run(self.store.store.send_messages, session.id, planned, now, fault=self.fault))
        for to_id in {o.to_id for o in planned}:
            recipient = self.sessions.get(to_id)
            if recipient is not None:
                recipient.poke()
        out: list[dict[str, Any] | InputError] = []
        for r, last_seen in results:
            if isinstance(r, Outgoing):
                connected = r.to_id in self.sessions
                out.append({
                    "message": next(messages),
                    "recipientConnected": connected,
                    "recipientLastSeen": now if connected else last_seen,
                })
            else:
                out.append(r)
        return out

    async def _plan_send(self, args: dict[str, Any]) -> tuple[Outgoing, int | None]:
        """The message to store, and when its recipient was last seen (for one not connected)."""
        _no_unknown(args, {"to", "text", "reply_to"}, "send")
        to = _req_str(args, "to", ADDRESS_MAX)
        text = domain.normalize_message_text(args.get("text"))
        reply_to = _opt_str(args, "reply_to", ADDRESS_MAX)
        target = self.find_connected(to)
        last_seen = None
        if target is not None:
            to_id = target.id
        else:
            found = await self.store.run(self.store.store.find_peers_by_address, to)
            if not found:
                raise InputError(f"to: no session is addressed by {to!r} (use a name, id or host session id from peers)")
            to_id, last_seen = found[0]["id"], found[0].get("lastSeenAt")
        parent_hop = None
        if reply_to is not None:
            parent_hop = await self.store.run(self.store.store.message_hop, reply_to)
            if parent_hop is None:
                raise InputError(f"reply_to: no message with id {reply_to!r}")
        return Outgoing(to_id, text, domain.reply_hop(parent_hop), reply_to), last_seen

    async def op_offer(self, session: Session, args: dict[str, Any]) -> Any:
        """The MCP server is about to show these messages to its host (SPEC §3): remember it,
        so that shown again after an acknowledgement that never came, they are marked. The MCP
        server does not wait for this answer: the frame is in the socket before it writes."""
        _no_unknown(args, {"ids"}, "offer")
        ids = _message_ids(args)
        offered = self.offered.setdefault(session.id, set())
        before = [i for i in ids if i in offered]
        offered.update(ids)
        return {"repeat": before}

    async def op_withdraw(self, session: Session, args: dict[str, Any]) -> Any:
        """The host cancelled the call that offered these: they are not being shown after all."""
        _no_unknown(args, {"ids"}, "withdraw")
        ids = _message_ids(args)
        offered = self.offered.get(session.id)
        if offered is not None:
            offered.difference_update(ids)
        return {"withdrawn": len(ids)}

    async def op_ack(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, {"ids"}, "ack")
        ids = _message_ids(args)
        acked = await self.store.run(self.store.store.ack, session.id, ids, now_ms(), fault=self.fault)
        offered = self.offered.get(session.id)
        if offered is not None:
            offered.difference_update(ids)
            if not offered:
                del self.offered[session.id]
        return {"acked": acked}

    async def persist_offers(self, peer_id: str) -> None:
        """Write the session's offers that no acknowledgement followed (its MCP server died
        between showing and acknowledging) to receipts.delivered_at, for a later broker."""
        offered = self.offered.get(peer_id)
        if not offered:
            return
        persisted = sorted(offered)
        await self.store.run(self.store.store.offer, peer_id, persisted, now_ms())
        offered.difference_update(persisted)  # receipts.delivered_at marks them from now on
        if not offered and self.offered.get(peer_id) is offered:
            del self.offered[peer_id]

    async def ingest_ledgers(self) -> int:
        """Offers and acknowledgements that processes now gone (an MCP server killed while the
        broker was down, a Stop hook) left in the home folder: applied, then removed."""
        count = 0
        for path, record in await trio.to_thread.run_sync(ledger.orphans, self.home):
            if record is not None:
                peer_id, now = record["peerId"], now_ms()
                if record["offered"]:
                    await self.store.run(self.store.store.offer, peer_id, record["offered"], now)
                if record["acked"]:
                    acked = record["acked"]
                    await self.store.run(self.store.store.ack, peer_id, acked, now)
                    holder = self.sessions.get(peer_id)
                    if holder is not None:
                        holder.notify(protocol.push("acked", ids=acked))
                log.info("applied %d offer(s) and %d acknowledgement(s) left for %s in %s",
                         len(record["offered"]), len(record["acked"]), peer_id, path.name)
                count += 1
            else:
                log.warning("ignored unreadable acknowledgement file %s", path.name)
            path.unlink(missing_ok=True)
        return count

    async def op_learn_identity(self, session: Session, args: dict[str, Any]) -> Any:
        """The MCP server saw its host session id (Codex tool-call `_meta`)."""
        _no_unknown(args, {"hostSessionId", "source"}, "learn_identity")
        hsid = _req_str(args, "hostSessionId", ADDRESS_MAX)
        source = str(args.get("source") or "codex-meta")
        rank = {"codex-meta": RANK_CODEX_META, "claude-env": RANK_CLAUDE_ENV}.get(source, RANK_CODEX_META)
        async with self._identity_lock:
            learned = await self.learn(session, hsid, rank)
        return {"session": session.public(), "learned": learned}

    # --- the command line: `agent-bridge decide | send | retract | forget | sessions` ----

    async def cmd_decide(self, args: dict[str, Any]) -> Any:
        """`agent-bridge decide`: the rules of the MCP tool, the author `cli`; an omitted scope
        is the folder the command ran in (`project`)."""
        _no_unknown(args, {"topic", "text", "scope", "project"}, "decide")
        project = domain.normalize_folder(args.get("project"), what="project")
        rest = {k: v for k, v in args.items() if k != "project"}
        return await self._decide(CLI_AUTHOR, CLI_AGENT, project, rest)

    async def cmd_send(self, args: dict[str, Any]) -> Any:
        """`agent-bridge send`: the rules of the MCP tool, the sender `cli`."""
        _no_unknown(args, {"to", "text"}, "send")
        (result,) = await self.send_batch(_CLI_SENDER, [args])  # type: ignore[arg-type]
        if isinstance(result, InputError):
            raise result
        return result

    async def cmd_retract(self, args: dict[str, Any]) -> Any:
        _no_unknown(args, {"topic", "reason"}, "retract")
        topic = domain.normalize_topic(args.get("topic"))
        reason = args.get("reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise InputError("reason: expected a string")
            reason = reason.strip() or None
            if reason is not None and len(reason) > domain.TEXT_MAX:
                raise InputError(f"reason: at most {domain.TEXT_MAX} characters, got {len(reason)}")
        retraction, notified = await self.store.run(
            self.store.store.retract,
            topic=topic,
            reason=reason,
            author=CLI_AUTHOR,
            author_agent=CLI_AGENT,
            connected=[s.view() for s in self.sessions.values()],
            now=now_ms(),
            fault=self.fault,
        )
        for peer_id, _ in notified:
            target = self.sessions.get(peer_id)
            if target is not None:
                target.poke()
        return {"retraction": retraction, "notified": [name for _, name in notified]}

    async def cmd_connected(self, args: dict[str, Any]) -> Any:
        """The ids of the connected sessions (`agent-bridge sessions` reads the rest itself)."""
        _no_unknown(args, set(), "connected")
        return sorted(self.sessions)

    async def cmd_forget(self, args: dict[str, Any]) -> Any:
        """Forget sessions that are not connected: by address, or every one last seen more than
        `goneForMs` ago. A connected or unknown address refuses the whole request."""
        _no_unknown(args, {"sessions", "goneForMs"}, "forget")
        addresses, gone_for = args.get("sessions"), args.get("goneForMs")
        if (addresses is None) == (gone_for is None):
            raise InputError("forget: give session addresses or goneForMs, not both and not neither")
        store = self.store.store
        async with self._identity_lock:  # nobody connects as one of them while they are forgotten
            if addresses is not None:
                if not isinstance(addresses, list) or not addresses or not all(
                    isinstance(a, str) and a.strip() and len(a) <= ADDRESS_MAX for a in addresses
                ):
                    raise InputError("sessions: expected a non-empty list of session names, ids or host session ids")
                ids: list[str] = []
                for address in addresses:
                    address = address.strip()
                    held = self.find_connected(address)
                    if held is not None:
                        raise InputError(
                            f"{address!r} is connected ({held.name}); only gone sessions can be forgotten "
                            "(a gone record that shares its name: forget it by its id, see `agent-bridge sessions`)"
                        )
                    found = await self.store.run(store.find_peers_by_address, address)
                    if not found:
                        raise InputError(f"no session is addressed by {address!r} (see `agent-bridge sessions`)")
                    ids.extend(p["id"] for p in found if p["id"] not in ids)
            else:
                if isinstance(gone_for, bool) or not isinstance(gone_for, int) or gone_for < 0:
                    raise InputError("goneForMs: expected a non-negative integer (milliseconds)")
                candidates = await self.store.run(store.sessions_last_seen_before, now_ms() - gone_for)
                ids = [i for i in candidates if i not in self.sessions]
            forgotten = await self.store.run(store.forget_peers, ids, now_ms(), fault=self.fault)
        for item in forgotten:
            log.info("forgot session %s (%s); dropped %d queued message(s)",
                     item["session"]["name"], item["session"]["id"], len(item["dropped"]))
        return {"forgotten": forgotten}

    COMMAND_OPS: dict[str, Callable[[Broker, dict[str, Any]], Any]] = {
        "decide": cmd_decide,
        "send": cmd_send,
        "retract": cmd_retract,
        "forget": cmd_forget,
        "connected": cmd_connected,
    }

    # --- control requests (hooks, CLI) ----------------------------------------------

    async def stop_check(self, args: dict[str, Any]) -> dict[str, Any]:
        """The Stop hook fetches the session's active messages. They are recorded as offered,
        not acknowledged: the hook acknowledges them (`stop_ack`) once it has written them to
        its host, so a hook that times out or is killed first loses nothing (SPEC §3)."""
        result = await self.identify(args)
        await self.ingest_ledgers()
        peer_id = await self._stop_peer(args["hostSessionId"])
        if peer_id is None:
            return {"session": result.get("session"), "messages": []}
        pending = await self.store.run(self.store.store.unacked, peer_id, limit=1000)
        # What the connected MCP server is showing right now is acknowledged by it: not again here.
        showing = self.offered.get(peer_id, set()) if peer_id in self.sessions else set()
        active = [
            m
            for m in pending
            if m["kind"] != "decision" and domain.is_active(m["hop"], self.settings.hop_limit)
            and m["id"] not in showing
        ]
        for m in active:
            m.pop("_seq", None)
            m.pop("_acked", None)
        if active:
            ids = [m["id"] for m in active]
            before = set(await self.store.run(self.store.store.offer, peer_id, ids, now_ms()))
            for m in active:
                if m["id"] in before:
                    m["repeat"] = True
            holder = self.sessions.get(peer_id)
            if holder is not None:  # its MCP server marks its copies: shown again, they are repeats
                holder.notify(protocol.push("offered", ids=ids))
        return {"session": result.get("session"), "sessionId": peer_id, "messages": active}

    async def stop_ack(self, args: dict[str, Any]) -> dict[str, Any]:
        """The Stop hook wrote these messages to its host: acknowledge them, and tell the
        session's MCP server not to show them again."""
        _no_unknown(args, {"hostSessionId", "ids"}, "stop_ack")
        hsid = _req_str(args, "hostSessionId", ADDRESS_MAX)
        ids = _message_ids(args)
        peer_id = await self._stop_peer(hsid)
        if peer_id is None:
            raise InputError(f"hostSessionId: no session has host session id {hsid!r}")
        acked = await self.store.run(self.store.store.ack, peer_id, ids, now_ms(), fault=self.fault)
        holder = self.sessions.get(peer_id)
        if holder is not None and ids:
            holder.notify(protocol.push("acked", ids=ids))
        return {"acked": acked}

    async def _stop_peer(self, hsid: str) -> str | None:
        connected = self.find_connected(hsid)
        if connected is not None and connected.host_session_id == hsid:
            return connected.id
        peer = await self.store.run(self.store.store.peer_by_host_session, hsid)
        return peer["id"] if peer else None

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "socket": self.socket_path,
            "web": self.web_url,
            "startedAt": self.started_at,
            "sessions": len(self.sessions),
            "hopLimit": self.settings.hop_limit,
            "home": str(self.home),
            "schemaVersion": self.store.store.schema_version,  # never the connection: the worker thread owns it
        }


class _CliSender(NamedTuple):
    """What `send_batch` needs of its sender, for a send from the command line."""

    id: str


_CLI_SENDER = _CliSender(CLI_AUTHOR.id)


# --- argument checks ----------------------------------------------------------------


def _no_unknown(args: dict[str, Any], allowed: set[str], op: str) -> None:
    extra = sorted(set(args) - allowed)
    if extra:
        known = ", ".join(sorted(allowed)) or "none"
        raise InputError(f"{op}: unknown argument {extra[0]!r} (allowed: {known})")


def _req_str(args: dict[str, Any], key: str, limit: int) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{key}: expected a non-empty string")
    if len(value) > limit:
        raise InputError(f"{key}: at most {limit} characters")
    return value.strip()


def _message_ids(args: dict[str, Any]) -> list[str]:
    ids = args.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) and len(i) <= ADDRESS_MAX for i in ids):
        raise InputError("ids: expected a list of message ids")
    if len(ids) > ledger.IDS_MAX:
        raise InputError(f"ids: at most {ledger.IDS_MAX} per request")
    return ids


def _opt_str(args: dict[str, Any], key: str, limit: int) -> str | None:
    if args.get(key) is None:
        return None
    return _req_str(args, key, limit)


def _parse_host(raw: object) -> tuple[int, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("host: expected {\"pid\": int, \"start\": int, \"exe\": str} or null")
    pid, start = raw.get("pid"), raw.get("start")
    if not isinstance(pid, int) or not isinstance(start, int) or isinstance(pid, bool) or isinstance(start, bool):
        raise InputError("host: pid and start must be integers")
    return pid, start

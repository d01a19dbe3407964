"""The broker's state and its request handlers: sessions, decisions, messages, identity.

Everything that changes bridge.db goes through the StoreRunner (the only writer); the
in-memory state is which sessions are connected right now.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import apsw
import trio

from agent_bridge import display, domain, ledger
from agent_bridge.config import Settings
from agent_bridge.daemon import questions
from agent_bridge.daemon.args import ADDRESS_MAX
from agent_bridge.daemon.args import no_unknown as _no_unknown
from agent_bridge.daemon.args import opt_str as _opt_str
from agent_bridge.daemon.args import req_str as _req_str
from agent_bridge.daemon.identity import Identity
from agent_bridge.daemon.registry import Registry
from agent_bridge.daemon.sessions import Link, Session
from agent_bridge.daemon.storage import StoreCalls, StoreRunner
from agent_bridge.domain import CLI_AGENT, InputError, SessionView
from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import Acked, Offered
from agent_bridge.rows import Decision, Message, Peer
from agent_bridge.store.decisions import Recipient, host_key
from agent_bridge.store.ids import now_ms
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.peers import CLI_AUTHOR

RETRACTION_TOPICS_MAX = 2_000  # one `decisions` history answer's topics
LAST_SEEN_GRACE = 5.0  # seconds a stopping broker gives the last-seen write of its sessions
WAIT_ACTIVE_MAX_MS = 60_000  # longest `wait_active`: a waiter that died unseen holds a task at most this long
WAIT_ACTIVE_POLL = 0.5  # seconds between looks when no change feed runs (no dashboard)

log = logging.getLogger("agent_bridge.broker")


async def no_pause(point: str) -> None:
    return None


# The handler of each op of the protocol (ipc.protocol.OPS), registered by the decorators below:
# one for a session's connection, one for a control request (hooks, the command line).
SessionHandler = Callable[["Broker", Session, dict[str, Any]], Awaitable[Any]]
ControlHandler = Callable[["Broker", dict[str, Any]], Awaitable[Any]]
SESSION_HANDLERS: dict[str, SessionHandler] = {}
CONTROL_HANDLERS: dict[str, ControlHandler] = {}
_H = TypeVar("_H", bound=Callable[..., Awaitable[Any]])


def session_op(name: str) -> Callable[[_H], _H]:
    """Register a Broker method as the handler of op `name` on a session's connection."""

    def register(handler: _H) -> _H:
        SESSION_HANDLERS[name] = handler
        return handler

    return register


def control_op(name: str) -> Callable[[_H], _H]:
    """Register a Broker method as the handler of op `name` as a control request."""

    def register(handler: _H) -> _H:
        CONTROL_HANDLERS[name] = handler
        return handler

    return register


class Broker:
    def __init__(
        self,
        store: StoreRunner,
        settings: Settings,
        home: Path,
        stop: trio.Event,
        *,
        fault: Callable[[str], None] = lambda point: None,
        pause: Callable[[str], Awaitable[None]] = no_pause,
    ) -> None:
        self.store = store
        self.db = StoreCalls(store)  # the Store's methods, each run on the store's thread
        self.settings = settings
        self.home = home
        self.stop = stop
        self.fault = fault
        self.registry = Registry()  # the connected sessions
        self.sessions = self.registry.sessions  # peer id -> the connected session (read here)
        self.started_at = now_ms()
        self.socket_path = ""
        self.web_url: str | None = None
        # Tests only: awaited at points where a request has resolved its addresses and not
        # yet stored anything ("send:resolved", "decide:resolved"), to run a concurrent
        # identity merge there deterministically. A no-op otherwise.
        self.pause = pause
        self.identity = Identity(self.registry, self.db, home, stop)
        # The store's commit feed (web.changes.ChangeFeed, set by daemon.root with the
        # dashboard): `wait_active` waits on it.
        self.changes: Any = None

    # --- state -----------------------------------------------------------------------

    def connected_ids(self) -> set[str]:
        return set(self.sessions)

    async def record_last_seen(self) -> None:
        """Every connected session's last-seen time, in one transaction (the broker is stopping)."""
        with trio.CancelScope(shield=True), trio.move_on_after(LAST_SEEN_GRACE):
            try:
                await self.db.touch_peers(list(self.sessions), now_ms())
            except (OSError, apsw.Error) as exc:  # a courtesy: a failing disk must not stop the shutdown
                log.warning("could not record when the connected sessions were last seen: %s", exc)

    def find_connected(self, address: str) -> Session | None:
        return self.registry.find_connected(address)

    # --- identity (SPEC §3): daemon.identity has the rules --------------------------------

    async def attach(self, conn: Link, args: dict[str, Any]) -> Session:
        return await self.identity.attach(conn, args)

    async def detach(self, session: Session) -> None:
        await self.identity.detach(session)

    async def identify(self, args: dict[str, Any]) -> dict[str, Any]:
        return await self.identity.identify(args)

    async def ingest_reports(self) -> int:
        return await self.identity.ingest_reports()

    # --- requests from sessions --------------------------------------------------------

    async def handle(self, session: Session | None, op: str, args: dict[str, Any]) -> Any:
        if session is None:
            control = CONTROL_HANDLERS.get(op)
            if control is None:
                raise InputError(f"{op}: needs a session connection (send hello first)")
            return await control(self, args)
        handler = SESSION_HANDLERS.get(op)
        if handler is None:
            raise InputError(f"{op}: not available on a session connection")
        if op not in ("ping", "status"):
            await self.identity.on_request(session)
        return await handler(self, session, args)

    @session_op("ping")
    async def op_ping(self, session: Session, args: dict[str, Any]) -> Any:
        return "pong"

    @session_op("status")
    async def op_status(self, session: Session, args: dict[str, Any]) -> Any:
        return self.status()

    @session_op("whoami")
    async def op_whoami(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, set(), "whoami")
        return session.public()

    @session_op("peers")
    async def op_peers(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, {"project"}, "peers")
        project = args.get("project")
        if project is not None:
            project = domain.normalize_folder(project, what="project")
        rows = await self.db.list_peers()
        listed = [p for p in rows if project is None or p.project == project]
        listed.sort(key=lambda p: (p.id not in self.sessions, p.name))
        return [{**p.public(), "connected": p.id in self.sessions} for p in listed]

    @session_op("decide")
    async def op_decide(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, {"topic", "text", "scope", "source_message_id"}, "decide")
        return await self._decide(session.view(), session.peer.agent, session.peer.project, args)

    async def _decide(self, author: SessionView, author_agent: str, project: str, args: dict[str, Any]) -> Any:
        """One revision by `author`; an omitted scope is `project` (the author's folder)."""
        topic = domain.normalize_topic(args.get("topic"))
        text = domain.normalize_text(args.get("text"))
        raw_scope = args.get("scope")
        scope = {"project": project} if raw_scope is None else domain.parse_scope(raw_scope)
        source = args.get("source_message_id")
        if not isinstance(source, str) or len(source) > ADDRESS_MAX:
            source = None  # provenance that names no bridge message is stored as null (SPEC §4.1)
        notified, held_back, recipients = self.decision_recipients(scope)
        await self.pause("decide:resolved")
        decision, delivered = await self.db.record_decision(
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
        delivered = await self.decision_recorded(decision, delivered, notified, held_back)
        result: dict[str, Any] = {"decision": decision.to_json(), "deliveredTo": delivered}
        unmatched = await self._unmatched_addresses(scope)
        if unmatched:  # beside the seed's object, never in it: the tool shows them in a second block
            result[domain.UNMATCHED_ADDRESSES] = unmatched
        return result

    def decision_recipients(self, scope: domain.Scope) -> tuple[list[Session], list[Session], list[Recipient]]:
        """The connected non-job sessions in a decision's scope: (those notified now, those held
        back while tentative, the notified ones' receipts' keys). `decide` and `answer` alike."""
        in_scope = [s for s in self.sessions.values() if not s.is_job and domain.scope_applies(scope, s.view())]
        notified = [s for s in in_scope if not s.tentative]
        held_back = [s for s in in_scope if s.tentative]
        return notified, held_back, [Recipient(s.view(), host_key(s.view())) for s in notified]

    async def decision_recorded(
        self, decision: Decision, delivered: list[str], notified: list[Session], held_back: list[Session]
    ) -> list[str]:
        """After a decision's commit: wake the notified sessions, queue the held-back ones' notices
        for their first tool call; the sorted names of the sessions in scope (`deliveredTo`)."""
        for s in notified:  # the session objects: one may have been merged into another record meanwhile
            s.poke()
        for s in held_back:  # no notice while tentative: queued if it becomes a real session
            s.missed.append(decision.id)
            await self.identity.queue_missed(s)
        # A tentative session is a connected session in scope (SPEC §4.1): it is named, and its one
        # notice is queued at its first tool call; a health check that leaves first keeps nothing.
        return sorted({*delivered, *(s.name for s in held_back)})

    async def _unmatched_addresses(self, scope: domain.Scope) -> list[str]:
        """The addresses of a `{"sessions": [...]}` scope that name no known session (SPEC §4.1)."""
        if domain.scope_kind(scope) != "sessions":
            return []
        assert isinstance(scope, dict)
        return [a for a in scope["sessions"]
                if self.find_connected(a) is None and not await self.db.find_peers_by_address(a)]

    @session_op("decisions")
    async def op_decisions(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, {"query", "scope", "history"}, "decisions")
        needle = domain.normalize_query(args.get("query"))
        history = args.get("history", False)
        if not isinstance(history, bool):
            raise InputError(f"history: expected true or false, got {history!r}")
        raw_scope = args.get("scope")
        lookup = {"project": session.peer.project} if raw_scope is None else domain.parse_scope(raw_scope)
        caller = session.view().addresses if domain.scope_kind(lookup) == "project" else frozenset()
        found = await self.db.decisions(needle=needle, lookup=lookup, caller_addresses=caller, history=history)
        return [d.to_json() for d in found]

    @session_op("retractions")
    async def op_retractions(self, session: Session, args: dict[str, Any]) -> Any:
        """The retraction records of the topics a `decisions` history listed."""
        _no_unknown(args, {"topics"}, "retractions")
        topics = args.get("topics")
        if not isinstance(topics, list) or len(topics) > RETRACTION_TOPICS_MAX:
            raise InputError(f"topics: expected a list of at most {RETRACTION_TOPICS_MAX} topics, got {topics!r:.80}")
        found = await self.db.retractions(sorted({domain.normalize_topic(t) for t in topics}))
        return [r.to_json() for r in found]

    @session_op("send")
    async def op_send(self, session: Session, args: dict[str, Any]) -> Any:
        (result,) = await self.send_batch(session, [args])
        if isinstance(result, InputError):
            raise result
        return result

    async def send_batch(
        self, session: Session | None, batch: list[dict[str, Any]]
    ) -> list[dict[str, Any] | InputError]:
        """Sends of one session (None: the command line) that arrived together, answered in
        order: each is checked on its own (a bad one gets its error, the others go on); the good
        ones are committed in one transaction. A client that pipelines its sends gets a group
        commit."""
        results: list[tuple[Outgoing | InputError, int | None]] = []
        for args in batch:
            try:
                results.append(await self._plan_send(args, "peers" if session is not None else SESSIONS_COMMAND))
            except InputError as exc:
                results.append((exc, None))
        planned = [r for r, _ in results if isinstance(r, Outgoing)]
        if not planned:
            return [r for r, _ in results if isinstance(r, InputError)]
        if session is not None:
            await self.identity.on_request(session)
        await self.pause("send:resolved")
        now = now_ms()
        sender_id = CLI_AUTHOR.id if session is None else session.id
        sent = await self.db.send_messages(sender_id, planned, now, fault=self.fault)
        messages = iter(sent)
        for to_id in {m.to_id for m in sent}:  # as stored: an address may have followed a merge
            recipient = self.sessions.get(to_id)
            if recipient is not None:
                recipient.poke()
        out: list[dict[str, Any] | InputError] = []
        for r, last_seen in results:
            if isinstance(r, Outgoing):
                message = next(messages)
                connected = message.to_id in self.sessions  # the record it reached
                out.append({
                    "message": message.to_json(),
                    "recipientConnected": connected,
                    "recipientLastSeen": now if connected else last_seen,
                })
            else:
                out.append(r)
        return out

    async def _plan_send(self, args: dict[str, Any], listing: str) -> tuple[Outgoing, int | None]:
        """The message to store, and when its recipient was last seen (for one not connected).
        `listing`: where the sender finds the sessions' addresses (the peers tool, or
        `agent-bridge sessions` for the command line)."""
        _no_unknown(args, {"to", "text", "reply_to"}, "send")
        to = _req_str(args, "to", ADDRESS_MAX)
        text = domain.normalize_message_text(args.get("text"))
        reply_to = _opt_str(args, "reply_to", ADDRESS_MAX)
        target = self.find_connected(to)
        last_seen = None
        if target is not None and not target.tentative:
            to_id = target.id
        else:  # a session that may still vanish (daemon.identity) gets a message only if nobody else is addressed
            tentative = {s.id for s in self.sessions.values() if s.tentative}
            found = [p for p in await self.db.find_peers_by_address(to) if p.id not in tentative]
            if found:
                chosen = _one_session("to", to, found, listing)
                to_id, last_seen = chosen.id, chosen.last_seen_at
            elif target is not None:
                to_id = target.id
            else:
                raise InputError(f"to: no session is addressed by {to!r} (use a name, id or host session id from {listing})")
        parent_hop = None
        if reply_to is not None:
            parent_hop = await self.db.message_hop(reply_to)
            if parent_hop is None:
                raise InputError(f"reply_to: no message with id {reply_to!r}")
        return Outgoing(to_id, text, domain.reply_hop(parent_hop), reply_to), last_seen

    @session_op("offer")
    async def op_offer(self, session: Session, args: dict[str, Any]) -> Any:
        """A bridge-protocol client is about to show these messages to its host (SPEC §3): its
        showing machine has them as maybe written, so that shown again after an acknowledgement
        that never came, they are marked. The client does not wait for this answer: the frame
        is in the socket before it writes."""
        _no_unknown(args, {"ids"}, "offer")
        return {"repeat": session.showing.client_offers(_message_ids(args))}

    @session_op("withdraw")
    async def op_withdraw(self, session: Session, args: dict[str, Any]) -> Any:
        """The host cancelled the call that offered these: they are not being shown after all."""
        _no_unknown(args, {"ids"}, "withdraw")
        ids = _message_ids(args)
        session.showing.client_withdraws(ids)
        return {"withdrawn": len(ids)}

    @session_op("ack")
    async def op_ack(self, session: Session, args: dict[str, Any]) -> Any:
        _no_unknown(args, {"ids"}, "ack")
        ids = _message_ids(args)
        acked = await self.db.ack(session.id, ids, now_ms(), fault=self.fault)
        session.showing.elsewhere(ids)  # recorded: done
        return {"acked": acked}

    async def persist_offers(self, session: Session) -> None:
        """The connection ended: what it offered or wrote and no recorded acknowledgement
        followed (its MCP server died between showing and acknowledging) goes to
        receipts.delivered_at, so a later connection shows them as repeats. If the store
        cannot take them now, they are written before that record is served again."""
        offered, written = session.showing.unconfirmed()
        ids = [*self.registry.offers_to_record.pop(session.id, []), *offered, *written]
        if not ids:
            return
        try:
            await self.db.offer(session.id, ids, now_ms())
        except BaseException:
            self.registry.park_offers(session.id, ids)
            raise

    async def record_parked_offers(self, peer_id: str) -> None:
        """Offers an earlier connection of `peer_id` left unrecorded (a store failure): written
        before this record's messages are pushed again (a failure here refuses the hello)."""
        parked = self.registry.offers_to_record.get(peer_id)
        if parked:
            await self.db.offer(peer_id, parked, now_ms())
            self.registry.offers_to_record.pop(peer_id, None)

    async def ingest_ledgers(self) -> int:
        """Offers and acknowledgements that processes now gone (an MCP server killed while the
        broker was down, a Stop hook) left in the home folder: applied, then removed. A file
        that is not a ledger record is moved aside by `ledger.orphans`, with a log line."""
        count = 0
        for record in await trio.to_thread.run_sync(ledger.orphans, self.home, log.warning):
            # The file names the record its writer knew; that record may have been merged since.
            peer_id = await self.db.resolve_peer(record.peer_id)
            now = now_ms()
            if record.offered:
                await self.db.offer(peer_id, record.offered, now)
            if record.acked:
                await self.db.ack(peer_id, record.acked, now)
                holder = self.sessions.get(peer_id)
                if holder is not None:
                    for i in range(0, len(record.acked), ledger.IDS_MAX):
                        holder.notify(Acked(record.acked[i:i + ledger.IDS_MAX]))
            log.info("applied %d offer(s) and %d acknowledgement(s) left for %s in %s",
                     len(record.offered), len(record.acked), peer_id, record.path.name)
            record.path.unlink(missing_ok=True)
            count += 1
        return count

    @session_op("learn_identity")
    async def op_learn_identity(self, session: Session, args: dict[str, Any]) -> Any:
        """The MCP server saw its host session id (Codex tool-call `_meta`)."""
        _no_unknown(args, {"hostSessionId", "source"}, "learn_identity")
        hsid = _req_str(args, "hostSessionId", ADDRESS_MAX)
        source = str(args.get("source") or "codex-meta")
        learned = await self.identity.learn_from_session(session, hsid, source)
        return {"session": session.public(), "learned": learned}

    # --- the command line: `agent-bridge decide | send | retract | forget | sessions` ----

    @control_op("decide")
    async def cmd_decide(self, args: dict[str, Any]) -> Any:
        """`agent-bridge decide`: the rules of the MCP tool, the author `cli`; an omitted scope
        is the folder the command ran in (`project`)."""
        _no_unknown(args, {"topic", "text", "scope", "project"}, "decide")
        project = domain.normalize_folder(args.get("project"), what="project")
        rest = {k: v for k, v in args.items() if k != "project"}
        return await self._decide(CLI_AUTHOR, CLI_AGENT, project, rest)

    @control_op("send")
    async def cmd_send(self, args: dict[str, Any]) -> Any:
        """`agent-bridge send`: the rules of the MCP tool, the sender `cli`."""
        _no_unknown(args, {"to", "text"}, "send")
        (result,) = await self.send_batch(None, [args])
        if isinstance(result, InputError):
            raise result
        return result

    @control_op("retract")
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
        retraction, notified = await self.db.retract(
            topic=topic,
            reason=reason,
            author=CLI_AUTHOR,
            author_agent=CLI_AGENT,
            connected=[s.view() for s in self.sessions.values() if not s.tentative],  # never a health check
            now=now_ms(),
            fault=self.fault,
        )
        for peer_id, _ in notified:
            target = self.sessions.get(peer_id)
            if target is not None:
                target.poke()
        return {"retraction": retraction.to_json(), "notified": [name for _, name in notified]}

    @control_op("connected")
    async def cmd_connected(self, args: dict[str, Any]) -> Any:
        """The ids of the connected sessions (`agent-bridge sessions` reads the rest itself)."""
        _no_unknown(args, set(), "connected")
        return sorted(self.sessions)

    @control_op("forget")
    async def cmd_forget(self, args: dict[str, Any]) -> Any:
        """Forget sessions that are not connected: by address, or every one last seen more than
        `goneForMs` ago. A connected or unknown address refuses the whole request."""
        _no_unknown(args, {"sessions", "goneForMs"}, "forget")
        addresses, gone_for = args.get("sessions"), args.get("goneForMs")
        if (addresses is None) == (gone_for is None):
            raise InputError("forget: give session addresses or goneForMs, not both and not neither")
        async with self.identity.lock:  # nobody connects as one of them while they are forgotten
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
                    found = await self.db.find_peers_by_address(address)
                    if not found:
                        raise InputError(f"no session is addressed by {address!r} (see {SESSIONS_COMMAND})")
                    chosen = _one_session("sessions", address, found, SESSIONS_COMMAND)
                    if chosen.id not in ids:
                        ids.append(chosen.id)
            else:
                if isinstance(gone_for, bool) or not isinstance(gone_for, int) or gone_for < 0:
                    raise InputError("goneForMs: expected a non-negative integer (milliseconds)")
                now = now_ms()  # longer than since 1970: nobody (and no integer past SQLite's 64 bits)
                candidates = await self.db.sessions_last_seen_before(now - min(gone_for, now + 1))
                ids = [i for i in candidates if i not in self.sessions]
            forgotten = await self.db.forget_peers(ids, now_ms(), fault=self.fault)
        for item in forgotten:
            log.info("forgot session %s (%s); dropped %d queued message(s)", item.peer.name, item.peer.id, len(item.dropped))
        return {"forgotten": [item.to_json() for item in forgotten]}

    # --- control requests (hooks, CLI) ----------------------------------------------

    @control_op("identify")
    async def cmd_identify(self, args: dict[str, Any]) -> Any:
        return await self.identify(args)

    @control_op("ping")
    async def cmd_ping(self, args: dict[str, Any]) -> Any:
        return "pong"

    @control_op("status")
    async def cmd_status(self, args: dict[str, Any]) -> Any:
        return self.status()

    @control_op("shutdown")
    async def cmd_shutdown(self, args: dict[str, Any]) -> Any:
        return {"stopping": True}  # the connection sets `stop` once this answer is sent

    @control_op("stop_check")
    async def stop_check(self, args: dict[str, Any]) -> dict[str, Any]:
        """The Stop hook fetches the session's active messages. They are recorded as offered,
        not acknowledged: the hook acknowledges them (`stop_ack`) once it has written them to
        its host, so a hook that times out or is killed first loses nothing (SPEC §3)."""
        result = await self.identify(args)
        await self.ingest_ledgers()
        peer_id = await self._stop_peer(args["hostSessionId"])
        if peer_id is None:
            return {"session": result.get("session"), "messages": []}
        active = await self._active_unacked(peer_id)
        if active:
            ids = [m.id for m in active]
            before = set(await self.db.offer(peer_id, ids, now_ms()))
            active = [m._replace(repeat=True) if m.id in before else m for m in active]
            holder = self.sessions.get(peer_id)
            if holder is not None:  # its MCP server marks its copies: shown again, they are repeats
                holder.notify(Offered(ids))
        return {"session": result.get("session"), "sessionId": peer_id, "messages": [m.to_json() for m in active]}

    async def _active_unacked(self, peer_id: str) -> list[Message]:
        """The session's unacknowledged active messages, oldest first, but those its connected
        MCP server is showing right now (acknowledged by it: not again by a hook)."""
        pending = await self.db.unacked(peer_id, limit=1000)
        showing = self.registry.showing_now(peer_id)
        return [
            m
            for m in pending
            if m.kind != "decision" and domain.is_active(m.hop, self.settings.hop_limit) and m.id not in showing
        ]

    @control_op("wait_active")
    async def wait_active(self, args: dict[str, Any]) -> dict[str, Any]:
        """A wake waiter (`agent-bridge hook wake`) waits here until the session with this host
        session id has an unacknowledged active message (`{"active": true}`), or `timeoutMs`
        passes (`{"active": false}`; it asks again). It hands nothing over: the waiter then
        fetches with `stop_check` and acknowledges with `stop_ack`, as a Stop hook does. Woken by
        every store commit (`changes`, the dashboard's feed), else it looks twice a second."""
        _no_unknown(args, {"hostSessionId", "timeoutMs"}, "wait_active")
        hsid = _req_str(args, "hostSessionId", ADDRESS_MAX)
        timeout = args.get("timeoutMs", WAIT_ACTIVE_MAX_MS)
        if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 <= timeout <= WAIT_ACTIVE_MAX_MS:
            raise InputError(f"timeoutMs: expected an integer 0..{WAIT_ACTIVE_MAX_MS}")
        feed = self.changes
        if feed is not None:
            feed.listeners += 1  # the store pokes the feed only while someone listens
        try:
            with trio.move_on_after(timeout / 1000):
                while True:
                    seen = feed.version if feed is not None else 0
                    peer_id = await self._stop_peer(hsid)
                    if peer_id is not None and await self._active_unacked(peer_id):
                        return {"active": True}
                    if feed is None:
                        await trio.sleep(WAIT_ACTIVE_POLL)
                    else:
                        await feed.wait_beyond(seen)
        finally:
            if feed is not None:
                feed.listeners -= 1
        return {"active": False}

    @control_op("stop_ack")
    async def stop_ack(self, args: dict[str, Any]) -> dict[str, Any]:
        """The Stop hook wrote these messages to its host: acknowledge them, and tell the
        session's MCP server not to show them again."""
        _no_unknown(args, {"hostSessionId", "ids"}, "stop_ack")
        hsid = _req_str(args, "hostSessionId", ADDRESS_MAX)
        ids = _message_ids(args)
        peer_id = await self._stop_peer(hsid)
        if peer_id is None:
            raise InputError(f"hostSessionId: no session has host session id {hsid!r}")
        acked = await self.db.ack(peer_id, ids, now_ms(), fault=self.fault)
        holder = self.sessions.get(peer_id)
        if holder is not None and ids:
            holder.notify(Acked(ids))
        return {"acked": acked}

    async def _stop_peer(self, hsid: str) -> str | None:
        connected = self.find_connected(hsid)
        if connected is not None and connected.host_session_id == hsid:
            return connected.id
        peer = await self.db.peer_by_host_session(hsid)
        return peer.id if peer else None

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "socket": self.socket_path,
            "web": self.web_url,
            "startedAt": self.started_at,
            "sessions": len(self.sessions),
            "hopLimit": self.settings.hop_limit,
            "home": str(self.home),
            "schemaVersion": self.db.schema_version,
        }


# Owner questions (SPEC §4.6): their handlers live in daemon.questions.
session_op("ask_owner")(questions.ask_owner)
control_op("answer")(questions.answer)


def check_handlers() -> None:
    """Every op the protocol admits has exactly the handlers its table entry says."""
    for where, handlers, names in (
        ("session", SESSION_HANDLERS, protocol.SESSION_OPS),
        ("control", CONTROL_HANDLERS, protocol.CONTROL_OPS),
    ):
        if set(handlers) != names:
            raise RuntimeError(f"{where} ops without a handler: {sorted(names - set(handlers))}; "
                               f"handlers of no {where} op: {sorted(set(handlers) - names)}")


check_handlers()


SESSIONS_COMMAND = "`agent-bridge sessions`"
CANDIDATES_SHOWN = 10  # sessions named in one ambiguity error


def _one_session(field: str, address: str, found: list[Peer], listing: str) -> Peer:
    """The one session `address` names among `found` (its matches, most recently seen first): an
    exact id wins; a name or host session id held by several gone sessions is refused with the
    candidates, never guessed (a name is reused once its session is gone)."""
    exact = [p for p in found if p.id == address]
    if exact:
        return exact[0]
    if len(found) == 1:
        return found[0]
    shown = "; ".join(f"{p.id} ({p.agent}, {p.project}, last seen {display.when(p.last_seen_at)})"
                      for p in found[:CANDIDATES_SHOWN])
    more = f"; and {len(found) - CANDIDATES_SHOWN} more" if len(found) > CANDIDATES_SHOWN else ""
    raise InputError(f"{field}: {address!r} names {len(found)} sessions that are not connected: "
                     f"{shown}{more}; give the id of the one you mean (see {listing})")


def _message_ids(args: dict[str, Any]) -> list[str]:
    ids = args.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) and len(i) <= ADDRESS_MAX for i in ids):
        raise InputError("ids: expected a list of message ids")
    if len(ids) > ledger.IDS_MAX:
        raise InputError(f"ids: at most {ledger.IDS_MAX} per request")
    return ids

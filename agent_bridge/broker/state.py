"""The broker's state and the dispatch of its requests.

Everything that changes bridge.db goes through the StoreRunner (the only writer); the
in-memory state is which sessions are connected right now. Each op of the protocol
(ipc.protocol.OPS) has its handler in a module of its domain, registered here with
`@session_op` / `@control_op`: broker.ops.messages (send, offer, withdraw, ack),
broker.ops.decisions (decide, decisions, retractions, retract), broker.ops.sessions (whoami,
peers, learn_identity, identify, connected, forget; ping, status, shutdown), broker.ops.hooks
(stop_check, stop_ack, wait_active), broker.ops.questions (ask_owner, answer). broker.ops.handlers
loads them all and checks them against the table (`check_handlers`); a Broker checks them again
when it is built.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import apsw
import trio

from agent_bridge.broker.sessions.identity import Identity
from agent_bridge.broker.sessions.registry import Registry
from agent_bridge.broker.sessions.session import Link, Session
from agent_bridge.broker.storage import StoreCalls, StoreRunner
from agent_bridge.common import ledger
from agent_bridge.common.config import Settings
from agent_bridge.common.domain import InputError
from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import Acked
from agent_bridge.store.ids import now_ms

LAST_SEEN_GRACE = 5.0  # seconds a stopping broker gives the last-seen write of its sessions

log = logging.getLogger("agent_bridge.broker")


async def no_pause(point: str) -> None:
    return None


# The handler of each op of the protocol (ipc.protocol.OPS), registered by the decorators below
# (in the broker.ops modules): one for a session's connection, one for a control request
# (hooks, the command line). Each takes the Broker first.
SessionHandler = Callable[["Broker", Session, dict[str, Any]], Awaitable[Any]]
ControlHandler = Callable[["Broker", dict[str, Any]], Awaitable[Any]]
SESSION_HANDLERS: dict[str, SessionHandler] = {}
CONTROL_HANDLERS: dict[str, ControlHandler] = {}
_H = TypeVar("_H", bound=Callable[..., Awaitable[Any]])


def session_op(name: str) -> Callable[[_H], _H]:
    """Register `handler(broker, session, args)` as the handler of op `name` on a session's connection."""

    def register(handler: _H) -> _H:
        SESSION_HANDLERS[name] = handler
        return handler

    return register


def control_op(name: str) -> Callable[[_H], _H]:
    """Register `handler(broker, args)` as the handler of op `name` as a control request."""

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
        # The store's commit feed (dashboard.changes.ChangeFeed, set by broker.root with the
        # dashboard): `wait_active` waits on it.
        self.changes: Any = None
        self.waiters: Any = None  # broker.feeds.waiters.Waiters: the wake waiters, set by broker.root
        self.pending: Any = None  # broker.feeds.postbox.Pending: the hooks' post box, set by broker.root
        self.federation: Any = None  # broker.federation.Federation while config.toml has [federation]
        # The job supervisor (broker.jobs.supervisor.Supervisor), started by broker.root beside the listener.
        self.jobs: Any = None
        check_handlers()  # a Broker without its handlers would refuse every request

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

    # --- identity (SPEC §3): broker.sessions.identity has the rules --------------------------------

    async def attach(self, conn: Link, args: dict[str, Any]) -> Session:
        return await self.identity.attach(conn, args)

    async def detach(self, session: Session) -> None:
        await self.identity.detach(session)

    async def identify(self, args: dict[str, Any]) -> dict[str, Any]:
        return await self.identity.reports.identify(args)

    async def ingest_reports(self) -> int:
        return await self.identity.reports.ingest()

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

    async def stop_check(self, args: dict[str, Any]) -> Any:
        """The Stop hook's request (broker.ops.hooks), as a hook sends it."""
        return await self.handle(None, "stop_check", args)

    async def persist_offers(self, session: Session) -> None:
        """The connection ended: what it offered or wrote and no recorded acknowledgement
        followed (its MCP server died between showing and acknowledging) goes to the receipts
        (offered: maybe shown; written: shown), so a later connection shows them as repeats.
        If the store cannot take them now, the machine is parked and written before the next
        session is served (`record_parked_offers`)."""
        offered, written = session.showing.unconfirmed()
        if not offered and not written:
            return
        try:
            await self.db.offer(session.id, [*offered, *written], now_ms(), shown=written)
        except BaseException:
            self.registry.park(session.id, session.showing)
            raise

    async def record_parked_offers(self) -> None:
        """What ended connections left unrecorded (a store failure), written before a hello is
        served (a failure here refuses that hello), under the record each showed for as it
        is now (it may have been merged since)."""
        while self.registry.parked:
            peer_id, machine = self.registry.parked[0]
            offered, written = machine.unconfirmed()
            await self.db.offer(
                await self.db.resolve_peer(peer_id), [*offered, *written], now_ms(), shown=written
            )
            self.registry.parked.pop(0)

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
            # wake waiters held now, and the passes that answered them (one query each)
            "waiters": 0 if self.waiters is None else self.waiters.held(),
            "waiterPasses": 0 if self.waiters is None else self.waiters.passes,
            **({} if self.federation is None else {"federation": self.federation.status()}),
        }


def check_handlers() -> None:
    """Every op the protocol admits has exactly the handlers its table entry says (once
    broker.ops.handlers has loaded them)."""
    for where, handlers, names in (
        ("session", SESSION_HANDLERS, protocol.SESSION_OPS),
        ("control", CONTROL_HANDLERS, protocol.CONTROL_OPS),
    ):
        if set(handlers) != names:
            raise RuntimeError(f"{where} ops without a handler: {sorted(names - set(handlers))}; "
                               f"handlers of no {where} op: {sorted(set(handlers) - names)} "
                               "(broker.ops.handlers loads the modules that register them)")



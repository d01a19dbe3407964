"""The federation task (SPEC §10): one task of the broker's serving nursery, started when
config.toml has [federation]. It owns the hub connection (federation.transport, nats-py on an
asyncio loop of its own thread) and carries out core.federation's two machines; bridge.db stays
the record of truth, the hub only carries.

- Sending: every row of the store's outbox (a message to another machine's session, committed
  with it; a receipt going back; a decision or retraction for the team) is handed to the
  `Outbox` machine, and published as it says, with the row's id as `Nats-Msg-Id`. A PubAck or an
  unknown outcome goes back to the machine; its marks (relayed, unconfirmed, done) to the store.
  A send to another machine hands its row and body to the machine itself (kick), and its
  publish starts there, before its sender is answered, with no read of the outbox; the rest (receipts and the
  team's decisions that became due, rows a restart left) the task finds by following the
  store's commit feed like the broker's other followers, at most one look per GAP.
- Receiving (`Receiving`, beside `Presence`): one loop per kind (messages, receipts,
  decisions) pulls from this machine's durable consumer, applies each delivery in one
  transaction (by id: a repeat stores nothing), and only after that commit acks it to the
  stream (`Inbound`): a batch's acks go out with the next pull, in the same write, no reply
  awaited; a body this machine can never store is logged and terminated; a store failure acks
  nothing, so the hub delivers it again.
- Presence: this machine's connected sessions, published on change and every PRESENCE_EVERY;
  the other machines' read back every PRESENCE_READ and recorded (a machine silent for 90 s
  shows its sessions offline: core.federation.session_state).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from agent_bridge.broker.ops.decisions import decision_recipients
from agent_bridge.broker.state import Broker
from agent_bridge.common import domain, marks
from agent_bridge.common.projectkey import project_key
from agent_bridge.core import envelopes as env
from agent_bridge.core import federation as fed
from agent_bridge.federation import subjects
from agent_bridge.federation.errors import FederationError, StoreLost
from agent_bridge.federation.loop import BridgeClosed, Submitted
from agent_bridge.federation.settings import FederationSettings
from agent_bridge.federation.transport import Incoming, Published, Transport, open_transport
from agent_bridge.store.decisions import Recipient, host_key
from agent_bridge.store.federation import Applied
from agent_bridge.store.feed import Following
from agent_bridge.store.ids import now_ms

log = logging.getLogger("agent_bridge.federation")

GAP = 0.2  # seconds at least between two looks at the outbox after commits (a kick comes at once)
POLL = 1.0  # seconds between looks without a commit feed (a broker without one: tests)
FETCH_BATCH = 64  # deliveries pulled at once
FETCH_WAIT = 1.0  # seconds a pull waits on the hub for its first delivery (a long poll there)
RETRY = 1.0  # seconds after a receive loop's failure (the hub away, the store busy) before it pulls again
# Receipts and decisions published at once: a look's burst of them takes turns with a message's
# publish and delivery instead of all of them going first (messages: core.federation.MAX_IN_FLIGHT)
BACKGROUND_PUBLISHES = 4
PRESENCE_EVERY = 30.0  # seconds between two announcements of an unchanged presence
PRESENCE_LOOK = 1.0  # seconds between looks at whether this machine's sessions changed
PRESENCE_READ = 2.0  # seconds between reads of the other machines' presence
FORGET_LOOK = 10.0  # seconds between looks for the team's sessions and machines gone long enough to forget


@dataclass
class Federation:
    """The broker's side of the team: what `federation status` and `peers` ask of it."""

    broker: Broker
    settings: FederationSettings
    transport: Transport
    outbox: fed.Outbox = field(default_factory=fed.Outbox)
    inbound: fed.Inbound = field(default_factory=fed.Inbound)
    ready: trio.Event = field(default_factory=trio.Event)  # connected once and the streams exist
    last_error: str | None = None
    last_error_at: int | None = None
    _kick: trio.Event = field(default_factory=trio.Event)
    _lost: trio.Event = field(default_factory=trio.Event)  # the hub answered it has lost its store
    _restored: trio.Event = field(default_factory=trio.Event)  # send_outbox handed the machine the rows
    _publishing: trio.Nursery | None = None  # send_outbox's, once it runs
    _known: set[tuple[str, str]] = field(default_factory=set)  # the outbox rows the machine was handed
    _handed: set[tuple[str, str]] = field(default_factory=set)  # ... by a send, since the last look began
    _unstarted: set[tuple[str, str]] = field(default_factory=set)  # publishes started, not yet running
    _background: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(BACKGROUND_PUBLISHES)
    )

    @property
    def machine(self) -> str:
        return self.settings.machine

    def kick(self, message_id: str | None = None, outgoing: tuple[str, bytes] | None = None) -> None:
        """A send committed message `message_id` and its outbox row (`outgoing`: its machine and
        body, as stored): published now, without reading the outbox back, its hop to the hub's
        thread started before the send is answered. Without an id: look now (a publish ended,
        the next may go)."""
        if message_id is None or self._publishing is None:  # before send_outbox runs: its first look
            self._kick.set()
            return
        key = (fed.MSG, message_id)
        self._handed.add(key)
        if key not in self._known:
            self._known.add(key)
            now = now_ms()
            self.outbox.queued(fed.OutboxRow(message_id, fed.MSG, now), now)
            handed = None if outgoing is None else (message_id, outgoing)
            self._start(self._publishing, self.outbox.tick(now), handed)

    async def publishes_first(self) -> None:
        """Let the publishes a send started go out before its sender is answered: the message
        leaves one answer sooner (as a local send's delivery goes first). Trio runs a batch of
        ready tasks in either order, so a second pass is needed half the time."""
        for _ in range(2):
            if not self._unstarted:
                return
            await trio.lowlevel.cancel_shielded_checkpoint()

    def error(self, what: str, exc: BaseException) -> None:
        self.last_error, self.last_error_at = f"{what}: {exc}", now_ms()
        log.warning("federation: %s: %s", what, exc)
        if isinstance(exc, StoreLost):  # keep_connected makes the streams again
            self._lost.set()

    async def owe(self, rows: Sequence[tuple[fed.OutboxRow, fed.TeamCount]]) -> None:
        """A machine heard for the first time is owed these decisions and retractions (their rows
        committed with its presence, each with the team's count): published now, with their ids,
        or ended (it had confirmed one before it was heard)."""
        await self._restored.wait()  # a restore after this would hand the machine rows read before
        now = now_ms()
        for row, team in rows:
            key = (row.kind, row.id)
            self._known.add(key)
            self._handed.add(key)
            await self.carry_all(self.outbox.owed(row, team, now))
        self.kick()

    def status(self) -> dict[str, Any]:
        hub = self.transport.status
        return {
            "machine": self.machine,
            "team": self.settings.team,
            "url": self.settings.url,
            "connected": hub.connected,
            "since": None if hub.since is None else int(hub.since * 1000),
            "lastError": hub.last_error or self.last_error,
            "lastErrorAt": (int(hub.last_error_at * 1000) if hub.last_error_at is not None
                            else self.last_error_at),
            "reconnects": hub.reconnects,
        }

    # --- the hub connection ------------------------------------------------------------------

    async def keep_connected(self) -> None:
        """Connect (nats-py retries for ever), make sure of the streams, then follow the
        connection's ups and downs into the outbox machine. A hub that answers it has lost its
        store (no team stream, no consumer of ours: `StoreLost`, from any call) gets the streams
        made again on the same connection (the consumers are made again by the next fetches),
        and every row still owed to a machine is published again at once."""
        await self.transport.connect()
        await self._provision()
        self.outbox.hub_connected(now_ms())
        self.ready.set()
        self.kick()
        connected = True
        while True:
            await self._hub_event()
            if self._lost.is_set():
                self._lost = trio.Event()
                await self._provision()
                log.warning("federation: the hub had lost its store; its streams are made again")
                self.outbox.hub_lost_store(now_ms())
                self.kick()
            status = self.transport.status
            if status.connected and not connected:
                self.outbox.hub_connected(now_ms())
                self.kick()
            elif not status.connected and connected:
                self.outbox.hub_disconnected(now_ms())
                self.inbound.hub_disconnected()
            connected = status.connected

    async def _provision(self) -> None:
        """Until the hub has the team's streams (made, or found as they should be)."""
        while True:
            try:
                await self.transport.ensure_streams()
                return
            except FederationError as exc:
                self.error("the hub's streams", exc)
                await trio.sleep(RETRY)

    async def _hub_event(self) -> None:
        """Until the connection's status changes or the hub answers it has lost its store."""
        lost = self._lost
        async with trio.open_nursery() as race:

            async def on_status() -> None:
                await self.transport.status_changed()
                race.cancel_scope.cancel()

            async def on_lost() -> None:
                await lost.wait()
                race.cancel_scope.cancel()

            race.start_soon(on_status)
            race.start_soon(on_lost)

    # --- sending --------------------------------------------------------------------------------

    async def send_outbox(self) -> None:
        """Hand the outbox's rows to the machine and publish what it says. A send to another
        machine hands its row itself (kick), without a read; the store is looked at (receipts
        and decisions that became due queued, new rows read) only after commits, GAP apart."""
        db = self.broker.db
        rows = await db.outbox_rows()
        self.outbox.restore(rows, now_ms())
        self._known = {(row.kind, row.id) for row in rows}
        self._restored.set()
        looked, looked_at = -1, -math.inf  # the feed's version at the last look, and when (trio's clock)
        async with trio.open_nursery() as publishing:
            self._publishing = publishing
            try:
                with Following(self.broker.changes, POLL) as commits:
                    while True:
                        seen = commits.seen()
                        since = trio.current_time() - looked_at
                        stale = seen != looked or (commits.feed is None and since >= POLL)
                        if stale and since >= GAP:
                            looked, looked_at = seen, trio.current_time()
                            await self._look()
                        self._start(publishing, self.outbox.tick(now_ms()))
                        due = self.outbox.next_due()
                        within = math.inf if due is None else max(0.0, (due - now_ms()) / 1000)
                        if commits.seen() != looked:  # commits no look has covered: look again after GAP
                            within = min(within, max(0.0, looked_at + GAP - trio.current_time()))
                        await self._wait(commits, seen, within)
            finally:
                self._publishing = None  # a send while this ends: its row waits for the next start

    async def _look(self) -> None:
        """Queue the receipts and the team's decisions that became due, and hand the machine
        the rows it does not hold yet."""
        db, now = self.broker.db, now_ms()
        self._handed = set()
        await db.queue_receipt_updates(now)
        await db.queue_team_decisions(now, project_key)
        rows = await db.outbox_rows()
        for row in rows:
            if (row.kind, row.id) not in self._known:
                self.outbox.queued(row, now)
        # a row a send handed meanwhile may be newer than this read: still held
        self._known = {(row.kind, row.id) for row in rows} | self._handed

    def _start(
        self, publishing: trio.Nursery, actions: Sequence[fed.OutboxAction],
        handed: tuple[str, tuple[str, bytes]] | None = None,
    ) -> None:
        """Carry out the machine's actions, each a task; the publish of the message a send
        `handed` with its body starts here, the others once their task has read their row."""
        for action in actions:
            if isinstance(action, fed.Publish):
                started = None
                if handed is not None and (action.kind, action.id) == (fed.MSG, handed[0]):
                    machine, body = handed[1]
                    subject = self._subject(fed.MSG, machine)
                    with contextlib.suppress(BridgeClosed):  # closing: its task reads the row, as before
                        started = self.transport.start_publish(subject, body, action.msg_id)
                if started is None:
                    self._unstarted.add((action.kind, action.id))
                publishing.start_soon(self._publish, action, started)
            else:
                publishing.start_soon(self._carry_out, action)

    async def _wait(self, commits: Following, seen: int, within: float) -> None:
        """Until a kick, or `within` seconds, or a commit after `seen` (looked at GAP apart)."""
        kicked = self._kick
        async with trio.open_nursery() as race:

            async def on_kick() -> None:
                await kicked.wait()
                race.cancel_scope.cancel()

            async def on_commit() -> None:
                await commits.beyond(seen, within)
                if commits.seen() != seen:
                    await trio.sleep(GAP)
                race.cancel_scope.cancel()

            race.start_soon(on_kick)
            race.start_soon(on_commit)
        if kicked.is_set():
            self._kick = trio.Event()

    async def _publish(self, action: fed.Publish, started: Submitted[Published] | None = None) -> None:
        self._unstarted.discard((action.kind, action.id))
        if action.kind == fed.MSG:
            await self._publish_row(action, started)
        else:
            async with self._background:
                await self._publish_row(action)

    def _subject(self, kind: str, machine: str | None) -> str:
        team, me = self.settings.team, self.machine
        if kind == fed.MSG and machine is not None:
            return subjects.msg(team, me, machine)
        if kind == fed.RCPT and machine is not None:
            return subjects.rcpt(team, me, machine)
        return subjects.dec(team, me)

    async def _publish_row(self, action: fed.Publish, started: Submitted[Published] | None = None) -> None:
        if started is None:
            item = await self.broker.db.outbox_item(action.kind, action.id)
            if item is None:  # done meanwhile (confirmed: a receipt came): nothing to publish
                now = now_ms()
                done = (self.outbox.confirmed(action.kind, action.id, now) if action.kind in fed.CONFIRMED
                        else self.outbox.published(action.kind, action.id, now))
                await self.carry_all(done)
                return
            machine, body = item
            started = self.transport.start_publish(self._subject(action.kind, machine), body, action.msg_id)
        try:
            await started.result()
        except FederationError as exc:  # Unknown, HubError, NotConnected: the same id again later
            log.info("federation: %s %s not published yet: %s", action.kind, action.id, exc)
            if isinstance(exc, StoreLost):
                self.error("publishing", exc)
            await self.carry_all(self.outbox.not_published(action.kind, action.id, now_ms()))
        else:
            await self.carry_all(self.outbox.published(action.kind, action.id, now_ms()))
        self.kick()

    async def carry_all(self, actions: Sequence[fed.OutboxAction]) -> None:
        for action in actions:
            await self._carry_out(action)

    async def _carry_out(self, action: fed.OutboxAction) -> None:
        db = self.broker.db
        if isinstance(action, fed.MarkRelayed):
            team = await db.mark_relayed(action.kind, action.id, int(action.at))
            if team is not None:  # a decision: ended, parked or still awaited, as the machine says
                await self.carry_all(self.outbox.counted(action.id, team, now_ms()))
        elif isinstance(action, fed.MarkUnconfirmed):
            await db.mark_unconfirmed(action.id, int(action.at), action.kind)
        elif isinstance(action, fed.Drop):
            await db.drop_outbox_row(action.kind, action.id)


@dataclass
class Receiving:
    """What other machines sent: one loop per kind (messages, receipts, decisions) pulls from
    this machine's durable consumer, applies each delivery in one transaction and acks it to the
    stream only after that commit (core.federation.Inbound, the team's `inbound`)."""

    team: Federation
    _tokens: dict[int, Incoming] = field(default_factory=dict)
    _next_token: int = 0

    async def receive(self, kind: str) -> None:
        """Pull `kind` from this machine's consumer for ever; each delivery committed, then acked.
        The acks of a batch go out with the next pull, in the same write to the hub (no reply
        awaited: one lost is delivered again after ack_wait, and stored by id)."""
        await self.team.ready.wait()
        acks: list[Incoming] = []  # committed, not acked yet
        while True:
            try:
                delivered = await self.team.transport.fetch(kind, FETCH_BATCH, FETCH_WAIT, acks)  # type: ignore[arg-type]
            except FederationError as exc:  # the acks too: delivered again, stored by id
                self.team.error(f"receiving {kind}", exc)
                await trio.sleep(RETRY)
                continue
            finally:
                acks = []
            for incoming in delivered:
                await self._receive_one(kind, incoming, acks)
                # a batch applied on the loop (short transactions) lets a send or a delivery in between
                await trio.lowlevel.checkpoint()

    async def _receive_one(self, kind: str, incoming: Incoming, acks: list[Incoming]) -> None:
        token = self._next_token
        self._next_token += 1
        self._tokens[token] = incoming
        try:
            for action in self.team.inbound.fetched(token):
                if isinstance(action, fed.Apply):
                    self._ack_all(await self._apply(kind, token, incoming), acks)
                elif isinstance(action, fed.AckStream):
                    self._ack_all([action], acks)
        finally:
            self._tokens.pop(token, None)

    async def _apply(self, kind: str, token: int, incoming: Incoming) -> list[fed.InboundAction]:
        """Commit one delivery; what the machine says to do after the commit (its ack)."""
        try:
            outcome = await self._store(kind, incoming)
        except (env.EnvelopeError, domain.InputError) as exc:  # never storable here: said once, dropped
            log.warning("federation: a %s from %s could not be stored (%s); dropped",
                        kind, incoming.sender, exc)
            self.team.inbound.rejected(token)
            await self._term(incoming)
            return []
        except Exception as exc:  # noqa: BLE001 - the store could not commit now: the hub delivers it again
            self.team.error(f"storing a {kind} from {incoming.sender}", exc)
            self.team.inbound.store_failed(token)
            return []
        if outcome is Applied.WAITING:  # needs a record not here yet: delivered again after ack_wait
            self.team.inbound.store_failed(token)
            return []
        return self.team.inbound.applied(token)

    async def _store(self, kind: str, incoming: Incoming) -> Applied:
        db, now, sender = self.team.broker.db, now_ms(), incoming.sender
        if kind == fed.MSG:
            message = env.decode_message(incoming.body)
            applied = await db.apply_remote_message(sender, message, now)
            if applied is Applied.NEW:
                await self._arrived(message.to_id)
            # its receipt row goes back at the outbox's next look after commits (GAP): a kick now
            # would put that look's store calls before the recipient's delivery read
            return applied
        if kind == fed.RCPT:
            receipt = env.decode_receipt(incoming.body)
            if receipt.kind == fed.DEC:  # a decision of ours stored there: the last one awaited ends it
                count = await db.apply_decision_receipt(sender, receipt, now)
                if count is not None:
                    await self.team.carry_all(self.team.outbox.counted(receipt.message_id, count, now))
                return Applied.NEW
            await db.apply_remote_receipt(sender, receipt, now)
            await self.team.carry_all(self.team.outbox.receipt(receipt.message_id, receipt.state, now))
            return Applied.NEW
        record = env.decode_decision(incoming.body)
        recipients: list[Recipient] = []
        if isinstance(record, env.DecisionEnvelope) and record.project_key is None:
            _, _, recipients = decision_recipients(self.team.broker, domain.ALL)
        elif isinstance(record, env.DecisionEnvelope):  # the sessions here whose folder has its key
            sessions = [s for s in self.team.broker.sessions.values() if not s.is_job and not s.tentative]
            keys = await trio.to_thread.run_sync(lambda: [_key_of(s.peer.project) for s in sessions])
            recipients = [Recipient(s.view(), host_key(s.view()))
                          for s, key in zip(sessions, keys, strict=True) if key == record.project_key]
        connected = [s.view() for s in self.team.broker.sessions.values() if not s.tentative]
        applied = await db.apply_remote_decision(sender, record, now, recipients, connected, project_key)
        if applied is Applied.NEW:
            for session in list(self.team.broker.sessions.values()):
                session.poke()
        return applied

    async def _arrived(self, to_id: str) -> None:
        """A message from another machine was committed for `to_id`: its delivery task reads it,
        and the hooks' post box shows it."""
        session = self.team.broker.sessions.get(to_id)
        if session is not None:
            session.poke()
        peer = session.peer if session is not None else await self.team.broker.db.get_peer(to_id)
        if peer is not None and peer.host_session_id and self.team.broker.pending is not None:
            await self.team.broker.pending.add({peer.host_session_id})

    def _ack_all(self, actions: Sequence[fed.InboundAction], acks: list[Incoming]) -> None:
        """The acks the machine asked for (each after its delivery's commit), for the next pull."""
        for action in actions:
            incoming = self._tokens.get(action.token) if isinstance(action, fed.AckStream) else None
            if incoming is not None:
                acks.append(incoming)

    async def _term(self, incoming: Incoming) -> None:
        try:
            await self.team.transport.term(incoming)
        except FederationError as exc:
            self.team.error("dropping an unreadable delivery", exc)


@dataclass
class Presence:
    """This machine's sessions announced to the team, and the other machines' recorded: a
    machine silent for 90 s shows its sessions offline (core.federation.session_state)."""

    team: Federation
    seq: dict[str, int] = field(default_factory=dict)  # the last presence read of each machine

    def presence(self) -> env.PresenceEnvelope:
        """This machine's connected sessions, as another machine lists them."""
        sessions = []
        for s in sorted(self.team.broker.sessions.values(), key=lambda s: s.name):
            if s.tentative:
                continue
            peer = s.peer
            state = marks.session_state(self.team.broker.home, peer.host_session_id, connected=True,
                                        last_seen=peer.last_seen_at).state
            sessions.append(env.PresenceSession(
                id=peer.id, name=peer.name, agent=peer.agent, project=peer.project,
                project_key=_key_of(peer.project), kind=peer.kind,
                state=state if state in ("busy", "idle") else "idle",
            ))
        return env.PresenceEnvelope(at=now_ms(), sessions=tuple(sessions))

    async def announce(self) -> None:
        """Publish this machine's presence when it changed, and every PRESENCE_EVERY."""
        await self.team.ready.wait()
        said: tuple[env.PresenceSession, ...] | None = None
        said_at = -math.inf
        while True:
            presence = await trio.to_thread.run_sync(self.presence)  # marks are files: off the loop
            if presence.sessions != said or trio.current_time() - said_at >= PRESENCE_EVERY:
                try:
                    await self.team.transport.publish_presence(env.encode(presence))
                    said, said_at = presence.sessions, trio.current_time()
                except FederationError as exc:
                    self.team.error("announcing this machine's sessions", exc)
            await trio.sleep(PRESENCE_LOOK)

    async def listen(self) -> None:
        """Record the other machines' presence as it changes; forget what the team stopped
        announcing for FORGET_AFTER_MS (a session gone there, a machine silent)."""
        await self.team.ready.wait()
        looked = -math.inf
        while True:
            if trio.current_time() - looked >= FORGET_LOOK:
                looked = trio.current_time()
                for gone in await self.team.broker.db.forget_remote(now_ms(), fed.FORGET_AFTER_MS):
                    log.info("federation: forgot %s (not announced for %d days)", gone,
                             fed.FORGET_AFTER_MS // 86_400_000)
            try:
                entries = await self.team.transport.read_presence()
            except FederationError as exc:
                self.team.error("reading the team's presence", exc)
                entries = []
            for entry in entries:
                if entry.machine == self.team.machine or self.seq.get(entry.machine) == entry.seq:
                    continue
                try:
                    presence = env.decode_presence(entry.body)
                except env.EnvelopeError as exc:
                    log.warning("federation: %s announced something unreadable: %s", entry.machine, exc)
                    self.seq[entry.machine] = entry.seq
                    continue
                heard = int(entry.time * 1000) if entry.time is not None else now_ms()
                owed = await self.team.broker.db.record_presence(
                    entry.machine, presence, min(heard, now_ms()), project_key)
                if owed:  # heard for the first time: owed what it has not confirmed
                    log.info("federation: machine %s heard for the first time; %d decisions and "
                             "retractions of ours counted again for it", entry.machine, len(owed))
                    await self.team.owe(owed)
                self.seq[entry.machine] = entry.seq
            await trio.sleep(PRESENCE_READ)


def _key_of(project: str) -> str | None:
    return project_key(Path(project)) if project else None


async def serve_federation(
    broker: Broker,
    settings: FederationSettings,
    *,
    task_status: trio.TaskStatus[Federation] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The team, until cancelled: started once the transport's thread runs (the hub may be away:
    this machine works locally meanwhile and catches up), closed with the broker."""
    async with open_transport(settings, connect=False) as transport:
        federation = Federation(broker, settings, transport)
        broker.federation = federation
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(federation.keep_connected)
                nursery.start_soon(federation.send_outbox)
                receiving = Receiving(federation)
                for kind in subjects.KINDS:
                    nursery.start_soon(receiving.receive, kind)
                presence = Presence(federation)
                nursery.start_soon(presence.announce)
                nursery.start_soon(presence.listen)
                task_status.started(federation)
        finally:
            broker.federation = None

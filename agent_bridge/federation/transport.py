"""The connection to the team's hub (SPEC §10): nats-py on the federation's asyncio loop, and the Trio
side that the broker calls.

    async with open_transport(settings) as transport:   # connects (and keeps reconnecting)
        await transport.ensure_streams()
        published = await transport.publish(subjects.msg(team, me, "devbox"), body, msg_id)
        for incoming in await transport.fetch("msg", batch=64, timeout=1.0):
            ...commit it locally...
            await transport.ack(incoming)                # only after the commit (STYLE 12)

Bodies are opaque bytes. The sending machine of what arrives is the subject's token (subjects.parse),
which the hub lets only that machine publish; never anything in the body.

Outcomes of a publish: `Published(seq, duplicate)` once the hub stored it (duplicate: a retry of an id
it had already stored within the duplicate window); `errors.Unknown` when it timed out or the
connection dropped before the answer (it may be stored: retry with the same id); `errors.HubError`
when the hub said no. Only the first two can happen to a message that was sent correctly.

nats-py is imported only when a transport is opened; without the `federation` extra that raises
MissingExtra with the one line to fix it.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import trio

from agent_bridge.federation import hub, subjects
from agent_bridge.federation.errors import (
    FederationError,
    HubError,
    NotConnected,
    StoreLost,
    Unknown,
    require,
)
from agent_bridge.federation.identity import read_seed
from agent_bridge.federation.loop import AsyncioBridge, Submitted, open_asyncio_bridge
from agent_bridge.federation.settings import FederationSettings

MSG_ID = "Nats-Msg-Id"
PUBLISH_TIMEOUT = 5.0  # then Unknown: the caller retries with the same id
API_TIMEOUT = 5.0  # stream and consumer requests, acks
# A delivered message not acked within this long is delivered again (num_delivered + 1). Long enough
# for a local commit on a busy machine; the receiver stores by id, so a redelivery is a no-op there.
ACK_WAIT = 30.0
MAX_ACK_PENDING = 1000  # at most this many delivered and unacked per consumer
RECONNECT_WAIT = 2.0  # between attempts to reach the hub; forever (a machine works on while away)
CLOSE_GRACE = 5.0
STREAM_EXISTS_DIFFERENT = 10058  # JetStream's "stream name already in use with a different configuration"
NOT_CLUSTERED = 10074  # "replicas > 1 not supported in non-clustered mode": a hub of one nats-server
STREAM_NOT_FOUND = 10059  # JetStream's "stream not found": the hub lost its store (or has not made it yet)
# On a hub of several nodes every stream is kept on 3 of them, so it survives losing one. Every machine
# asks for 3 first and for 1 only when the hub says it is a single server, so all of them ask for the
# same config, and a create of an existing stream stays a no-op.
CLUSTER_REPLICAS = 3


@dataclass(frozen=True)
class Status:
    """The hub connection, for `federation status` and the dashboard. Times are time.time()."""

    connected: bool = False
    since: float | None = None  # when it last connected (connected) or went away (not)
    last_error: str | None = None
    last_error_at: float | None = None
    reconnects: int = 0


@dataclass(frozen=True)
class Published:
    seq: int
    duplicate: bool  # the hub had this message id already (within its duplicate window)


@dataclass(frozen=True)
class Incoming:
    """One delivered message. `sender` and `to` come from the subject; `ack_token` is for ack() only."""

    subject: str
    kind: str
    sender: str
    to: str | None
    body: bytes
    msg_id: str | None
    num_delivered: int
    stream_seq: int
    ack_token: Any


@dataclass(frozen=True)
class StreamState:
    """What the hub says of one of the team's streams (for `federation status` and the tests)."""

    name: str
    replicas: int
    leader: str | None  # the node that leads it, on a hub of several
    messages: int


@dataclass(frozen=True)
class PresenceEntry:
    machine: str
    body: bytes
    seq: int
    time: float | None  # when the hub stored it (time.time() scale)


def stream_configs(team: str, replicas: int = 1) -> list[Any]:
    """The two streams as nats-py StreamConfigs: the same on every machine, so each one's create of an
    existing stream is a no-op. `replicas`: CLUSTER_REPLICAS on a clustered hub, else 1 (ensure_streams)."""
    api = require("nats.js.api")
    common = dict(
        storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.OLD,
        deny_delete=True,
        deny_purge=True,
        num_replicas=replicas,
    )
    return [
        api.StreamConfig(
            name=subjects.stream(team),
            subjects=subjects.stream_subjects(team),
            max_age=hub.MAX_AGE.total_seconds(),
            duplicate_window=hub.DUPLICATE_WINDOW.total_seconds(),
            **common,
        ),
        api.StreamConfig(
            name=subjects.presence_stream(team),
            subjects=subjects.presence_subjects(team),
            max_msgs_per_subject=1,
            max_age=hub.PRESENCE_MAX_AGE.total_seconds(),
            duplicate_window=hub.PRESENCE_DUPLICATE_WINDOW.total_seconds(),
            **common,
        ),
    ]


class _Wire:
    """The nats-py side; every method runs on the asyncio loop (through AsyncioBridge.call)."""

    def __init__(self, settings: FederationSettings, seed: str, ack_wait: float) -> None:
        self.settings = settings
        self._seed = seed
        self._ack_wait = ack_wait
        self.status = Status()
        self.on_status: Callable[[], None] = lambda: None  # called on the asyncio thread after each change
        self._nc: Any = None
        self._js: Any = None
        self._subs: dict[str, Any] = {}
        # Per kind: whether the last delivery said more wait on the hub (its num_pending). While
        # none do, a pull asks for one message: nats-py returns it as it arrives, where a pull
        # for several waits for the hub's "no more messages" after it.
        self._more: dict[str, bool] = {}

    def _set_status(self, status: Status, /, **changes: Any) -> None:
        """Replace the whole Status (read from the Trio thread without a lock), then say so."""
        self.status = replace(status, **changes)
        self.on_status()

    # nats-py's callbacks
    async def _on_error(self, exc: Exception) -> None:
        self._set_status(self.status, last_error=_describe(exc), last_error_at=time.time())

    async def _on_disconnected(self) -> None:
        self._set_status(self.status, connected=False, since=time.time())

    async def _on_reconnected(self) -> None:
        self._set_status(
            self.status, connected=True, since=time.time(), reconnects=self.status.reconnects + 1
        )

    async def connect(self) -> None:
        nats = require("nats")
        tls = None
        if self.settings.tls:
            assert self.settings.ca is not None  # settings.parse requires it
            tls = ssl.create_default_context(cafile=str(self.settings.ca))  # that CA only: pinned
        nc = nats.NATS()
        self._nc = nc  # so that close() reaches a connect still trying
        await nc.connect(
            servers=list(self.settings.servers),
            nkeys_seed_str=self._seed,
            inbox_prefix=subjects.inbox_prefix(self.settings.machine),
            name=f"agent-bridge {self.settings.team}/{self.settings.machine}",
            tls=tls,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=RECONNECT_WAIT,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        self._js = nc.jetstream(timeout=API_TIMEOUT)
        self._set_status(self.status, connected=True, since=time.time())

    def _jetstream(self) -> Any:
        if self._js is None or self._nc is None or self._nc.is_closed:
            raise NotConnected("not connected to the hub")
        return self._js

    async def ensure_streams(self) -> None:
        js_errors = require("nats.js.errors")
        js = self._jetstream()
        for replicas in (CLUSTER_REPLICAS, 1):
            for config in stream_configs(self.settings.team, replicas):
                try:
                    await js.add_stream(config)
                except js_errors.APIError as exc:
                    if exc.err_code == NOT_CLUSTERED and replicas > 1:
                        break  # a single server: the same streams with one replica
                    if exc.err_code == STREAM_EXISTS_DIFFERENT:
                        raise HubError(
                            f"the hub's stream {config.name} exists with another configuration (made "
                            "by another agent-bridge version?); the hub's admin must reconcile it"
                        ) from None
                    raise HubError(
                        f"the hub refused to create the stream {config.name}: {exc.description}"
                    ) from None
                except Exception as exc:
                    raise _unknown_or(exc, f"creating the stream {config.name}") from None
            else:
                return

    # asyncio side: nats-py takes its timeouts as arguments (no Trio cancel scope reaches here)
    async def publish(self, subject: str, body: bytes, msg_id: str, timeout: float) -> Published:  # noqa: ASYNC109
        js = self._jetstream()
        js_errors = require("nats.js.errors")
        try:
            ack = await js.publish(
                subject,
                body,
                timeout=timeout,
                stream=_stream_of(self.settings.team, subject),
                headers={MSG_ID: msg_id},
            )
        except js_errors.NoStreamResponseError:  # no stream took the subject: not stored
            raise StoreLost(
                f"publish {msg_id}: no stream answered (the hub's store lost, or the hub starting)"
            ) from None
        except js_errors.APIError as exc:
            raise HubError(f"publish {msg_id}: the hub refused it: {exc.description}") from None
        except Exception as exc:
            raise _unknown_or(exc, f"publish {msg_id}") from None
        return Published(seq=int(ack.seq), duplicate=bool(ack.duplicate))

    async def _subscription(self, kind: subjects.Kind) -> Any:
        sub = self._subs.get(kind)
        if sub is None:
            api = require("nats.js.api")
            team, me = self.settings.team, self.settings.machine
            name = subjects.consumer(me, kind)
            config = api.ConsumerConfig(
                name=name,
                durable_name=name,
                filter_subject=subjects.consumer_filter(team, me, kind),
                ack_policy=api.AckPolicy.EXPLICIT,
                ack_wait=self._ack_wait,
                deliver_policy=api.DeliverPolicy.ALL,
                max_ack_pending=MAX_ACK_PENDING,
                max_deliver=-1,
            )
            sub = await self._jetstream().pull_subscribe(
                config.filter_subject, durable=name, stream=subjects.stream(team), config=config
            )
            self._subs[kind] = sub
        return sub

    async def fetch(
        self, kind: subjects.Kind, batch: int, timeout: float, acks: Sequence[Any] = ()  # noqa: ASYNC109
    ) -> list[Incoming]:
        nats_errors = require("nats.errors")
        js_errors = require("nats.js.errors")
        for token in acks:  # written with the pull request below, no reply awaited
            try:
                await token.ack()
            except Exception as exc:
                raise _unknown_or(exc, "ack") from None
        try:
            sub = await self._subscription(kind)
        except js_errors.APIError as exc:
            if exc.err_code == STREAM_NOT_FOUND:
                raise StoreLost(f"making the {kind} consumer: the hub has no team stream") from None
            raise HubError(f"making the {kind} consumer: the hub refused: {exc.description}") from None
        except FederationError:
            raise
        except Exception as exc:
            raise _unknown_or(exc, f"making the {kind} consumer") from None
        try:
            msgs = await sub.fetch(batch if self._more.get(kind, True) else 1, timeout=timeout)
        except (nats_errors.TimeoutError, TimeoutError):  # nothing came (nats-py raises either)
            self._more[kind] = False
            return []
        except js_errors.ServiceUnavailableError:  # no responder: the hub has no such consumer (any more)
            self._subs.pop(kind, None)
            await _quietly(sub.unsubscribe())
            raise StoreLost(
                f"reading {kind}: the hub has no consumer {subjects.consumer(self.settings.machine, kind)} "
                "(its store lost?); it is made again at the next fetch"
            ) from None
        except js_errors.APIError as exc:
            raise HubError(f"reading {kind}: the hub refused: {exc.description}") from None
        except FederationError:
            raise
        except Exception as exc:
            raise _unknown_or(exc, f"reading {kind}") from None
        self._more[kind] = _more_pending(msgs)
        out: list[Incoming] = []
        for m in msgs:
            try:
                address = subjects.parse(self.settings.team, m.subject)
            except subjects.SubjectError:
                await m.term()  # cannot be one of ours (the consumer's filter): never deliver it again
                continue
            if kind == "dec" and address.sender == self.settings.machine:
                await m.ack_sync(timeout=API_TIMEOUT)  # our own decision, back from the hub: nothing to do
                continue
            meta = m.metadata
            out.append(
                Incoming(
                    subject=m.subject,
                    kind=address.kind,
                    sender=address.sender,
                    to=address.to,
                    body=bytes(m.data),
                    msg_id=(m.headers or {}).get(MSG_ID),
                    num_delivered=int(meta.num_delivered),
                    stream_seq=int(meta.sequence.stream),
                    ack_token=m,
                )
            )
        return out

    async def ack(self, token: Any) -> None:
        try:
            await token.ack_sync(timeout=API_TIMEOUT)
        except Exception as exc:
            raise _unknown_or(exc, "ack") from None

    async def streams(self) -> list[StreamState]:
        js_errors = require("nats.js.errors")
        js = self._jetstream()
        states = []
        for name in (subjects.stream(self.settings.team), subjects.presence_stream(self.settings.team)):
            try:
                info = await js.stream_info(name)
            except js_errors.APIError as exc:
                raise HubError(f"the stream {name}: {exc.description}") from None
            except Exception as exc:
                raise _unknown_or(exc, f"the stream {name}") from None
            leader = info.cluster.leader if info.cluster is not None else None
            states.append(
                StreamState(name, int(info.config.num_replicas or 1), leader, int(info.state.messages))
            )
        return states

    async def term(self, token: Any) -> None:
        try:
            await token.term()
            await self._nc.flush(timeout=API_TIMEOUT)
        except Exception as exc:
            raise _unknown_or(exc, "term") from None

    async def read_presence(self) -> list[PresenceEntry]:
        """The last presence message of every machine: one STREAM.MSG.GET per machine, walking the
        presence stream (one message per subject) by next_by_subj."""
        js_errors = require("nats.js.errors")
        js = self._jetstream()
        team = self.settings.team
        stream = subjects.presence_stream(team)
        entries: list[PresenceEntry] = []
        seq = 1
        while True:
            try:
                raw = await js.get_msg(stream, seq=seq, subject=f"{team}.presence.*", next=True)
            except js_errors.APIError as exc:
                if exc.err_code == STREAM_NOT_FOUND:
                    raise StoreLost("reading presence: the hub has no presence stream") from None
                if isinstance(exc, js_errors.NotFoundError):
                    return entries  # past the last machine's message
                raise HubError(f"reading presence: the hub refused: {exc.description}") from None
            except Exception as exc:
                raise _unknown_or(exc, "reading presence") from None
            try:
                address = subjects.parse(team, raw.subject or "")
            except subjects.SubjectError:
                address = None
            if address is not None and address.kind == "presence":
                stamp = raw.time.timestamp() if raw.time is not None else None
                entries.append(
                    PresenceEntry(address.sender, bytes(raw.data or b""), int(raw.seq or 0), stamp)
                )
            seq = int(raw.seq or seq) + 1

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        self._subs.clear()
        if nc is not None and not nc.is_closed:
            try:
                await nc.close()  # never drain(): it can hang its whole drain_timeout after a fetch
            except Exception as exc:  # a connect cut short leaves nats-py half set up; closing is best effort
                self._set_status(self.status, last_error=_describe(exc), last_error_at=time.time())
        self._set_status(self.status, connected=False, since=time.time())


async def _quietly(step: Any) -> None:
    """Await a clean-up step whose failure changes nothing (the subscription is dropped either way)."""
    try:
        await step
    except Exception:  # noqa: BLE001, S110 - best effort: nats-py's own clean-up of a dead subscription
        pass


def _more_pending(msgs: list[Any]) -> bool:
    """Whether the hub said, delivering the last of `msgs`, that more wait for this consumer."""
    try:
        return bool(msgs) and int(msgs[-1].metadata.num_pending) > 0
    except Exception:  # noqa: BLE001 - not a JetStream delivery's reply subject: pull several to be sure
        return True


def _stream_of(team: str, subject: str) -> str:
    kind = subjects.parse(team, subject).kind
    return subjects.presence_stream(team) if kind == "presence" else subjects.stream(team)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _unknown_or(exc: Exception, what: str) -> FederationError:
    """A timeout or a lost connection: Unknown; a closed connection: NotConnected; anything else from
    nats-py: HubError. Never a bare nats-py exception out of this module."""
    nats_errors = require("nats.errors")
    if isinstance(exc, nats_errors.ConnectionClosedError):
        return NotConnected(f"{what}: the connection to the hub is closed")
    if isinstance(
        exc,
        TimeoutError
        | nats_errors.TimeoutError
        | nats_errors.ConnectionReconnectingError
        | nats_errors.StaleConnectionError
        | nats_errors.FlushTimeoutError,
    ):
        return Unknown(f"{what}: no answer from the hub in time ({_describe(exc)}); outcome unknown")
    return HubError(f"{what}: {_describe(exc)}")


class Transport:
    """The Trio side of one hub connection: each method crosses into the asyncio loop and back."""

    def __init__(self, bridge: AsyncioBridge, wire: _Wire) -> None:
        self._bridge = bridge
        self._wire = wire
        self.settings = wire.settings
        self._status_changed = trio.Event()
        wire.on_status = lambda: bridge.to_trio(self._signal_status)
        # one fetch at a time per kind: nats-py's pull subscription is not made for overlapping fetches
        self._fetching = {kind: trio.Lock() for kind in subjects.KINDS}

    def _signal_status(self) -> None:
        self._status_changed.set()
        self._status_changed = trio.Event()

    @property
    def status(self) -> Status:
        return self._wire.status

    async def status_changed(self) -> Status:
        """Wait for the next change of `status` (connected, disconnected, an error) and return it."""
        await self._status_changed.wait()
        return self._wire.status

    async def connect(self) -> None:
        """Until connected: nats-py retries forever (a refused key shows in status.last_error)."""
        await self._bridge.call(self._wire.connect)

    async def ensure_streams(self) -> None:
        await self._bridge.call(self._wire.ensure_streams)

    async def publish(
        self,
        subject: str,
        body: bytes,
        msg_id: str,
        timeout: float = PUBLISH_TIMEOUT,  # noqa: ASYNC109 (an outcome: Unknown after it, not a cancel)
    ) -> Published:
        """Store `body` on the hub under `subject` (which must name this machine as sender) once per
        `msg_id`. Raises Unknown (retry with the same id) when the hub has not answered within `timeout`,
        HubError or NotConnected. (A Trio cancellation also ends it, as Cancelled: outcome unknown too.)"""
        return await self.start_publish(subject, body, msg_id, timeout).result()

    def start_publish(
        self, subject: str, body: bytes, msg_id: str, timeout: float = PUBLISH_TIMEOUT
    ) -> Submitted[Published]:
        """`publish`, started now: its `result()` is what `publish` returns or raises."""
        address = subjects.parse(self.settings.team, subject)
        if address.sender != self.settings.machine:
            raise ValueError(f"{subject!r} does not name this machine ({self.settings.machine}) as sender")
        if not msg_id:
            raise ValueError("msg_id: expected a non-empty id")
        return self._bridge.submit(self._wire.publish, subject, body, msg_id, timeout)

    async def fetch(
        self,
        kind: subjects.Kind,
        batch: int = 64,
        timeout: float = 1.0,  # noqa: ASYNC109 (the pull request's expiry on the hub, a long poll)
        acks: Sequence[Incoming] = (),
    ) -> list[Incoming]:
        """Up to `batch` messages of `kind` addressed to this machine (all but our own decisions), waiting
        at most `timeout` for the first; [] when none came. One only while the hub said, with the last
        delivery, that no more waited: it is returned as it arrives (a burst that came meanwhile is
        said pending by it, and the next fetch takes up to `batch`). `timeout` is the pull request's
        expiry on the hub: a Trio deadline instead would leave the request pending there, and messages
        it delivers later would wait out ack_wait unseen. `acks`: earlier deliveries of `kind`, each committed
        locally, acknowledged first, in the same write as the pull request and without waiting for
        the hub's reply (one that is lost is delivered again after ack_wait); Unknown when they
        could not be sent (the connection away)."""
        if kind not in subjects.KINDS:
            raise ValueError(f"kind: expected one of {', '.join(subjects.KINDS)}, got {kind!r}")
        tokens = [incoming.ack_token for incoming in acks]
        async with self._fetching[kind]:
            return await self._bridge.call(self._wire.fetch, kind, batch, timeout, tokens)

    async def ack(self, incoming: Incoming) -> None:
        """Acknowledge `incoming` to the hub: call only after it is committed locally. Unknown on a
        timeout (the hub redelivers what it did not get an ack for: the receiver dedupes by id)."""
        await self._bridge.call(self._wire.ack, incoming.ack_token)

    async def streams(self) -> list[StreamState]:
        """The team's two streams as the hub has them: replicas, leader node, message count."""
        return await self._bridge.call(self._wire.streams)

    async def term(self, incoming: Incoming) -> None:
        """Tell the hub never to deliver `incoming` again: for a body this machine can never store
        (malformed, from a newer version), after recording why. Otherwise it comes back every ack_wait."""
        await self._bridge.call(self._wire.term, incoming.ack_token)

    async def publish_presence(self, body: bytes) -> Published:
        subject = subjects.presence(self.settings.team, self.settings.machine)
        msg_id = f"{self.settings.machine}-{time.time_ns()}"
        return await self._bridge.call(self._wire.publish, subject, body, msg_id, PUBLISH_TIMEOUT)

    async def read_presence(self) -> list[PresenceEntry]:
        """Every machine's last presence message (ours included)."""
        return await self._bridge.call(self._wire.read_presence)


@asynccontextmanager
async def open_transport(
    settings: FederationSettings, *, ack_wait: float = ACK_WAIT, connect: bool = True
) -> AsyncIterator[Transport]:
    """A transport on its own asyncio loop thread, connected unless connect=False (then call
    `connect()`, in a task of its own: it returns only once the hub answers). Closed, and the thread
    gone, when the context exits. IdentityError for an unusable seed, MissingExtra without nats-py."""
    require("nats")
    seed = read_seed(settings.seed)
    async with open_asyncio_bridge() as bridge:
        wire = _Wire(settings, seed, ack_wait)
        transport = Transport(bridge, wire)
        try:
            if connect:
                await transport.connect()
            yield transport
        finally:
            with trio.move_on_after(CLOSE_GRACE) as scope:
                scope.shield = True
                await bridge.call(wire.close)

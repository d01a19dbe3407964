"""The broker's handlers of the hooks' requests: the Stop hook's `stop_check` and `stop_ack`,
and the wake waiter's `wait_active` (SPEC §3: a hook shows a session's active messages while
its MCP server cannot)."""

from __future__ import annotations

from typing import Any

import trio

from agent_bridge.broker.args import ADDRESS_MAX, message_ids
from agent_bridge.broker.args import no_unknown as _no_unknown
from agent_bridge.broker.args import req_str as _req_str
from agent_bridge.broker.state import Broker, control_op
from agent_bridge.common import domain
from agent_bridge.common.domain import InputError
from agent_bridge.common.rows import Message
from agent_bridge.ipc.frames import Acked, Offered
from agent_bridge.store.feed import Following
from agent_bridge.store.ids import now_ms

WAIT_ACTIVE_MAX_MS = 60_000  # longest `wait_active`: a waiter that died unseen holds a task at most this long
WAIT_ACTIVE_POLL = 0.5  # seconds between looks when no change feed runs (no dashboard)


@control_op("stop_check")
async def stop_check(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    """The Stop hook fetches the session's active messages. They are recorded as offered,
    not acknowledged: the hook acknowledges them (`stop_ack`) once it has written them to
    its host, so a hook that times out or is killed first loses nothing (SPEC §3). With
    `"wake": true` the fetch is an idle session's waiter's (hooks.wake), which hands them over
    to wake the session: a wake request is recorded for each, confirmed once they are shown."""
    wake = args.pop("wake", False)
    if not isinstance(wake, bool):
        raise InputError("wake: expected true or false")
    result = await broker.identify(args)
    await broker.ingest_ledgers()
    peer_id = await stop_peer(broker, args["hostSessionId"])
    if peer_id is None:
        return {"session": result.get("session"), "messages": []}
    active = await active_unacked(broker, peer_id)
    if active:
        ids = [m.id for m in active]
        # a repeat: offered before as the store knows, or as its MCP server knows (an answer the
        # host cancelled after it was written is not in the store until the connection ends)
        before = set(await broker.db.offer(peer_id, ids, now_ms(), wake=wake))
        before |= broker.registry.repeats_now(peer_id, ids)
        active = [m._replace(repeat=True) if m.id in before else m for m in active]
        holder = broker.sessions.get(peer_id)
        if holder is not None:  # its MCP server marks its copies: shown again, they are repeats
            holder.notify(Offered(ids))
    return {"session": result.get("session"), "sessionId": peer_id, "messages": [m.to_json() for m in active]}


@control_op("stop_ack")
async def stop_ack(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    """The Stop hook wrote these messages to its host: acknowledge them, and tell the
    session's MCP server not to show them again."""
    _no_unknown(args, {"hostSessionId", "ids"}, "stop_ack")
    hsid = _req_str(args, "hostSessionId", ADDRESS_MAX)
    ids = message_ids(args)
    peer_id = await stop_peer(broker, hsid)
    if peer_id is None:
        raise InputError(f"hostSessionId: no session has host session id {hsid!r}")
    acked = await broker.db.ack(peer_id, ids, now_ms(), fault=broker.fault)
    holder = broker.sessions.get(peer_id)
    if holder is not None and ids:
        holder.notify(Acked(ids))
    return {"acked": acked}


@control_op("wait_active")
async def wait_active(broker: Broker, args: dict[str, Any]) -> dict[str, Any]:
    """A wake waiter (`agent-bridge hook wake`) waits here until the session with this host
    session id has an unacknowledged active message (`{"active": true}`), or `timeoutMs`
    passes (`{"active": false}`; it asks again). It hands nothing over: the waiter then
    fetches with `stop_check` and acknowledges with `stop_ack`, as a Stop hook does. All the
    waiters are answered together (broker.feeds.waiters): one query per store commit."""
    _no_unknown(args, {"hostSessionId", "timeoutMs"}, "wait_active")
    hsid = _req_str(args, "hostSessionId", ADDRESS_MAX)
    timeout = args.get("timeoutMs", WAIT_ACTIVE_MAX_MS)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 <= timeout <= WAIT_ACTIVE_MAX_MS:
        raise InputError(f"timeoutMs: expected an integer 0..{WAIT_ACTIVE_MAX_MS}")
    waiters = broker.waiters
    deadline = trio.current_time() + timeout / 1000
    with Following(broker.changes, WAIT_ACTIVE_POLL) as commits, trio.move_on_after(timeout / 1000):
        while True:  # until the bridge knows the session (a waiter can start first)
            seen = commits.seen()
            peer_id = await stop_peer(broker, hsid)
            if peer_id is not None:
                break
            await commits.beyond(seen)
        left = max(0.0, deadline - trio.current_time())
        return {"active": await waiters.wait(peer_id, left)}
    return {"active": False}


async def stop_peer(broker: Broker, hsid: str) -> str | None:
    connected = broker.find_connected(hsid)
    if connected is not None and connected.host_session_id == hsid:
        return connected.id
    peer = await broker.db.peer_by_host_session(hsid)
    return peer.id if peer else None


async def active_unacked(broker: Broker, peer_id: str) -> list[Message]:
    """The session's unacknowledged active messages, oldest first, but those its connected
    MCP server is showing right now (acknowledged by it: not again by a hook)."""
    pending = await broker.db.unacked(peer_id, limit=1000)
    showing = broker.registry.showing_now(peer_id)
    return [
        m
        for m in pending
        if m.kind != "decision" and domain.is_active(m.hop, broker.settings.hop_limit) and m.id not in showing
    ]

"""The broker's handlers of messages: `send` (a session's, and `agent-bridge send`'s as the
sender `cli`; a session's pipelined sends share one commit, `send_batch`), and what a
bridge-protocol client says about showing them: `offer`, `withdraw`, `ack`."""

from __future__ import annotations

from typing import Any

from agent_bridge import domain
from agent_bridge.daemon.args import ADDRESS_MAX, SESSIONS_COMMAND, message_ids, one_session
from agent_bridge.daemon.args import no_unknown as _no_unknown
from agent_bridge.daemon.args import opt_str as _opt_str
from agent_bridge.daemon.args import req_str as _req_str
from agent_bridge.daemon.broker import Broker, control_op, session_op
from agent_bridge.daemon.sessions import Session
from agent_bridge.domain import InputError
from agent_bridge.store.ids import now_ms
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.peers import CLI_AUTHOR


@session_op("send")
async def op_send(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    (result,) = await send_batch(broker, session, [args])
    if isinstance(result, InputError):
        raise result
    return result


@control_op("send")
async def cmd_send(broker: Broker, args: dict[str, Any]) -> Any:
    """`agent-bridge send`: the rules of the MCP tool, the sender `cli`."""
    _no_unknown(args, {"to", "text"}, "send")
    (result,) = await send_batch(broker, None, [args])
    if isinstance(result, InputError):
        raise result
    return result


async def send_batch(
    broker: Broker, session: Session | None, batch: list[dict[str, Any]]
) -> list[dict[str, Any] | InputError]:
    """Sends of one session (None: the command line) that arrived together, answered in
    order: each is checked on its own (a bad one gets its error, the others go on); the good
    ones are committed in one transaction. A client that pipelines its sends gets a group
    commit."""
    results: list[tuple[Outgoing | InputError, int | None]] = []
    for args in batch:
        try:
            results.append(
                await plan_send(broker, args, "peers" if session is not None else SESSIONS_COMMAND)
            )
        except InputError as exc:
            results.append((exc, None))
    planned = [r for r, _ in results if isinstance(r, Outgoing)]
    if not planned:
        return [r for r, _ in results if isinstance(r, InputError)]
    if session is not None:
        await broker.identity.on_request(session)
    await broker.pause("send:resolved")
    now = now_ms()
    sender_id = CLI_AUTHOR.id if session is None else session.id
    sent = await broker.db.send_messages(sender_id, planned, now, fault=broker.fault)
    messages = iter(sent)
    for to_id in {m.to_id for m in sent}:  # as stored: an address may have followed a merge
        recipient = broker.sessions.get(to_id)
        if recipient is not None:
            recipient.poke()
    out: list[dict[str, Any] | InputError] = []
    for r, last_seen in results:
        if isinstance(r, Outgoing):
            message = next(messages)
            connected = message.to_id in broker.sessions  # the record it reached
            out.append({
                "message": message.to_json(),
                "recipientConnected": connected,
                "recipientLastSeen": now if connected else last_seen,
            })
        else:
            out.append(r)
    return out


async def plan_send(broker: Broker, args: dict[str, Any], listing: str) -> tuple[Outgoing, int | None]:
    """The message to store, and when its recipient was last seen (for one not connected).
    `listing`: where the sender finds the sessions' addresses (the peers tool, or
    `agent-bridge sessions` for the command line)."""
    _no_unknown(args, {"to", "text", "reply_to"}, "send")
    to = _req_str(args, "to", ADDRESS_MAX)
    text = domain.normalize_message_text(args.get("text"))
    reply_to = _opt_str(args, "reply_to", ADDRESS_MAX)
    target = broker.find_connected(to)
    last_seen = None
    if target is not None and not target.tentative:
        to_id = target.id
    else:  # a session that may still vanish (daemon.identity) gets a message only if nobody else is addressed
        tentative = {s.id for s in broker.sessions.values() if s.tentative}
        found = [p for p in await broker.db.find_peers_by_address(to) if p.id not in tentative]
        if found:
            chosen = one_session("to", to, found, listing)
            to_id, last_seen = chosen.id, chosen.last_seen_at
        elif target is not None:
            to_id = target.id
        else:
            raise InputError(
                f"to: no session is addressed by {to!r} (use a name, id or host session id from {listing})"
            )
    parent_hop = None
    if reply_to is not None:
        parent_hop = await broker.db.message_hop(reply_to)
        if parent_hop is None:
            raise InputError(f"reply_to: no message with id {reply_to!r}")
    return Outgoing(to_id, text, domain.reply_hop(parent_hop), reply_to), last_seen


@session_op("offer")
async def op_offer(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """A bridge-protocol client is about to show these messages to its host (SPEC §3): its
    showing machine has them as maybe written, so that shown again after an acknowledgement
    that never came, they are marked. The client does not wait for this answer: the frame
    is in the socket before it writes."""
    _no_unknown(args, {"ids"}, "offer")
    return {"repeat": session.showing.client_offers(message_ids(args))}


@session_op("withdraw")
async def op_withdraw(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """The host cancelled the call that offered these: they are not being shown after all."""
    _no_unknown(args, {"ids"}, "withdraw")
    ids = message_ids(args)
    session.showing.client_withdraws(ids)
    return {"withdrawn": len(ids)}


@session_op("ack")
async def op_ack(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    _no_unknown(args, {"ids"}, "ack")
    ids = message_ids(args)
    acked = await broker.db.ack(session.id, ids, now_ms(), fault=broker.fault)
    session.showing.elsewhere(ids)  # recorded: done
    return {"acked": acked}

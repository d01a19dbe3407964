"""The broker's handlers of messages: `send` (a session's, and `agent-bridge send`'s as the
sender `cli`; a session's pipelined sends share one commit, `send_batch`), and what a
bridge-protocol client says about showing them: `offer`, `withdraw`, `ack`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import trio

from agent_bridge import hosts
from agent_bridge.broker.args import ADDRESS_MAX, SESSIONS_COMMAND, message_ids, one_session
from agent_bridge.broker.args import no_unknown as _no_unknown
from agent_bridge.broker.args import opt_str as _opt_str
from agent_bridge.broker.args import req_str as _req_str
from agent_bridge.broker.sessions.session import Session
from agent_bridge.broker.state import Broker, control_op, no_pause, session_op
from agent_bridge.common import domain
from agent_bridge.common.domain import InputError
from agent_bridge.common.rows import Message, SentReceipt
from agent_bridge.common.tools import SENT_IDS_MAX, SENT_WAIT_MAX
from agent_bridge.store import queries
from agent_bridge.store.ids import now_ms
from agent_bridge.store.messages import Outgoing, Send, Stored
from agent_bridge.store.peers import CLI_AUTHOR


@session_op("send")
async def op_send(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """A session's send in its own request: a relay's call the MCP SDK serves (the plain ones
    are queued and sent together, broker.mcp.sends; a bridge-protocol client's pipelined sends
    are batched by its connection)."""
    (result,) = await send_batch(broker, session, [args])
    if isinstance(result, InputError):
        raise result
    return result


SEND_BATCH = 64  # sends of one session committed together at most (send_batch's callers)


@control_op("send")
async def cmd_send(broker: Broker, args: dict[str, Any]) -> Any:
    """`agent-bridge send` (and the dashboard's): the rules of the MCP tool, the sender `cli`;
    `project` (the command's folder) is where an agent kind or `*` looks for sessions."""
    (result,) = await send_batch(broker, None, [args])
    if isinstance(result, InputError):
        raise result
    return result


class Planned(NamedTuple):
    """A send to store, and when its one recipient was last seen (None: connected, or several)."""

    send: Send
    last_seen: int | None


class PlannedRemote(NamedTuple):
    """A send to a session of another machine (SPEC §10): its record here, and its state there."""

    to_id: str
    outgoing: Outgoing
    key: str | None
    address: str
    state: str


async def send_batch(
    broker: Broker, session: Session | None, batch: list[dict[str, Any]]
) -> list[dict[str, Any] | InputError]:
    """Sends of one session (None: the command line) that arrived together, answered in
    order: each is checked on its own (a bad one gets its error, the others go on); the good
    ones are committed in one transaction. A client that pipelines its sends gets a group
    commit. A send whose message_id stored messages before answers with those, marked
    `duplicate`, and stores, queues and wakes nothing."""
    sender_id = CLI_AUTHOR.id if session is None else session.id
    plans: list[Planned | PlannedRemote | SentRemote | Stored | InputError] = []
    for args in batch:
        try:
            plans.append(await plan_send(broker, session, args))
        except InputError as exc:
            plans.append(exc)
    for i, plan in enumerate(plans):
        if isinstance(plan, PlannedRemote):  # the message and its outbox row, one transaction
            plans[i] = await send_remote(broker, sender_id, plan)
    planned = [p.send for p in plans if isinstance(p, Planned)]
    done = iter(await commit_sends(broker, session, sender_id, planned) if planned else [])
    out: list[dict[str, Any] | InputError] = []
    for plan, args in zip(plans, batch, strict=True):
        if isinstance(plan, SentRemote):
            out.append(remote_result(plan.stored, plan.plan))
        elif isinstance(plan, Planned):
            result = next(done)
            if isinstance(result, InputError):
                out.append(result)
                continue
            out.append(await send_result(broker, result, plan.send.address, plan.last_seen))
        elif isinstance(plan, Stored):
            out.append(await send_result(broker, plan, args["to"].strip(), None))
        elif isinstance(plan, InputError):
            out.append(plan)
    return out


async def commit_sends(
    broker: Broker, session: Session | None, sender_id: str, planned: list[Send]
) -> list[Stored | InputError]:
    """The sends to sessions of this machine, in one transaction; their recipients' delivery
    tasks poked and their post box files there before the answer."""
    if session is not None and session.tentative:
        await broker.identity.on_request(session)
    if broker.pause is not no_pause:
        await broker.pause("send:resolved")
    stored = await broker.db.send(sender_id, planned, now_ms(), fault=broker.fault)
    hosts: set[str] = set()
    for to_id in {m.to_id for s in stored if isinstance(s, Stored) for m in s.messages}:
        recipient = broker.sessions.get(to_id)  # as stored: an address may have followed a merge
        if recipient is not None:
            recipient.poke()
        peer = recipient.peer if recipient is not None else await broker.db.get_peer(to_id)
        if peer is not None and peer.host_session_id:
            hosts.add(peer.host_session_id)
    if broker.pending is not None and hosts and not broker.pending.has_all(hosts):
        await broker.pending.add(hosts)  # what the sender sees sent, the hooks find in the post box
    return stored


class SendResult(dict[str, Any]):
    """The `send` tool's answer (send_result) as its JSON object, which also knows the message
    it names, so that it is written from the message's own text (`text`)."""

    message: Message | None = None  # the answer's "message", first of its keys; None: `*`

    def text(self, encode: Callable[[Any], str], spaced: bool = False) -> str:
        """The answer as `encode` writes it (the standard library's encoder: compact for a
        frame, `spaced` for a tool's text), its message taken from Message.to_json_text."""
        message = None if self.message is None else self.message.to_json_text(spaced)
        if message is None or next(iter(self)) != "message":
            return encode(self)
        rest = encode({k: v for k, v in self.items() if k != "message"})
        colon, comma = (": ", ", ") if spaced else (":", ",")
        return '{"message"' + colon + message + (comma + rest[1:] if len(self) > 1 else "}")


async def send_result(
    broker: Broker, stored: Stored, address: str, last_seen: int | None
) -> SendResult:
    """The `send` tool's answer (SPEC §5): the message and whether its recipient is connected
    (when it was last seen, if not); for `*`, the messages and their recipients' names."""
    messages = stored.messages
    out = SendResult()
    if address == domain.BROADCAST:
        out["messages"] = [m.to_json() for m in messages]
        out["recipients"] = [m.to_name for m in messages]
    else:
        (message,) = messages
        connected = message.to_id in broker.sessions  # the record it reached
        if not connected and (last_seen is None or stored.duplicate):
            peer = await broker.db.get_peer(message.to_id)
            last_seen = None if peer is None else peer.last_seen_at
        out.message = message
        out["message"] = message.to_json()
        out["recipientConnected"] = connected
        out["recipientLastSeen"] = now_ms() if connected else last_seen
    if stored.duplicate:
        out["duplicate"] = True
    return out


class SentRemote(NamedTuple):
    stored: Stored
    plan: PlannedRemote


async def send_remote(broker: Broker, sender_id: str, plan: PlannedRemote) -> SentRemote | InputError:
    o = plan.outgoing
    try:
        stored = await broker.db.queue_remote_message(
            sender_id, plan.to_id, o.text, o.hop, o.reply_to, now_ms(), key=plan.key, address=plan.address
        )
    except InputError as exc:
        return exc
    if broker.federation is not None:  # published now, before the sender is answered
        broker.federation.kick(None if stored.duplicate else stored.messages[0].id, stored.outgoing)
        await broker.federation.publishes_first()
    return SentRemote(stored, plan)


def remote_result(stored: Stored, plan: PlannedRemote) -> dict[str, Any]:
    """`send`'s answer for a session of another machine: `relayed` false until the hub has it
    (`sent` tells the rest: relayed, stored there, shown, acknowledged, or unconfirmed)."""
    (message,) = stored.messages
    out: dict[str, Any] = {
        "message": {**message.to_json(), "to": {"id": message.to_id, "name": plan.address}},
        "recipientConnected": plan.state != "offline",
        "recipientLastSeen": None,
        "relayed": False,
    }
    if stored.duplicate:
        out["duplicate"] = True
    return out


async def plan_remote(broker: Broker, to: str, text: str, reply_to: str | None,
                      key: str | None) -> PlannedRemote | None:
    """`name@machine` naming a session of another machine of the team, or None (not such an
    address, or no federation here)."""
    federation = broker.federation
    if federation is None or "@" not in to:
        return None
    name, _, machine = to.rpartition("@")
    if not name or machine == federation.machine:
        return None
    found = await broker.db.remote_session(name, machine, now_ms())
    if found is None:
        raise InputError(f"to: no session {name!r} is known on machine {machine!r} (see peers)")
    parent_hop = None
    if reply_to is not None:
        parent_hop = await broker.db.message_hop(reply_to)
        if parent_hop is None:
            raise InputError(f"reply_to: no message with id {reply_to!r}")
    hop = domain.reply_hop(parent_hop)
    return PlannedRemote(found.id, Outgoing(found.id, text, hop, reply_to), key, found.address, found.state)


_SEND_ARGS = frozenset({"to", "text", "reply_to", "message_id"})
_SEND_ARGS_CLI = _SEND_ARGS | {"project"}  # the command line names the project it sends from


async def plan_send(
    broker: Broker, session: Session | None, args: dict[str, Any]
) -> Planned | PlannedRemote | Stored:
    """The send to store and when its recipient was last seen (for one not connected); or,
    for a message_id that stored messages before, those (checked again when storing)."""
    _no_unknown(args, _SEND_ARGS if session is not None else _SEND_ARGS_CLI, "send")
    to = _req_str(args, "to", ADDRESS_MAX)
    text = domain.normalize_message_text(args.get("text"))
    reply_to = _opt_str(args, "reply_to", ADDRESS_MAX)
    key = None if args.get("message_id") is None else domain.normalize_message_id(args["message_id"])
    if key is not None:
        before = await broker.db.stored_send(CLI_AUTHOR.id if session is None else session.id, key, text, to)
        if isinstance(before, InputError):
            raise before
        if before is not None:
            return before
    if broker.federation is not None and "@" in to:
        remote = await plan_remote(broker, to, text, reply_to, key)
        if remote is not None:
            return remote
        # this machine's own name: the session here
        name, _, machine = to.rpartition("@")
        if machine == broker.federation.machine:
            to = name
    listing = "peers" if session is not None else SESSIONS_COMMAND
    if session is not None:
        project: str | None = session.peer.project
    elif args.get("project") is not None:
        project = domain.normalize_folder(args["project"], what="project")
    else:
        project = None
    to_ids, last_seen = await recipients(broker, session, to, project, listing)
    parent_hop = None
    if reply_to is not None:
        parent_hop = await broker.db.message_hop(reply_to)
        if parent_hop is None:
            raise InputError(f"reply_to: no message with id {reply_to!r}")
    hop = domain.reply_hop(parent_hop)  # the same for each copy: each is active or passive by it
    return Planned(Send(tuple(Outgoing(t, text, hop, reply_to) for t in to_ids), key, to), last_seen)


async def recipients(
    broker: Broker, session: Session | None, to: str, project: str | None, listing: str
) -> tuple[list[str], int | None]:
    """The records `to` addresses (SPEC §3 "Addresses"), and when the one it names was last
    seen if it is not connected: the owner (`owner` or `cli`, sent by a session); a session's
    name, id or host session id, connected or not;
    else an agent kind (`claude`, `codex`, any connected session's agent): the one other
    connected session of that agent in `project`; or `*`: every other connected session of
    `project`, by name."""
    if session is not None and to.lower() in domain.OWNER_ADDRESSES:
        return [CLI_AUTHOR.id], None  # the owner reads it in the dashboard and is alerted (SPEC §4.6)
    if to == domain.BROADCAST:
        here = _connected_here(broker, session, project, to)
        if not here:
            raise InputError(
                f'to: "*" reaches nobody: no other session of {project} is connected (see {listing})'
            )
        return [s.id for s in sorted(here, key=lambda s: s.name)], None
    target = broker.find_connected(to)
    if target is not None and not target.tentative:
        return [target.id], None
    # a session that may still vanish (broker.sessions.identity) gets a message only if nobody else
    # is addressed
    tentative = {s.id for s in broker.sessions.values() if s.tentative}
    found = [p for p in await broker.db.find_peers_by_address(to) if p.id not in tentative]
    if found:
        chosen = one_session("to", to, found, listing)
        return [chosen.id], chosen.last_seen_at
    if target is not None:
        return [target.id], None
    kind = to.lower()
    if kind in hosts.NAMES or any(s.peer.agent == kind for s in broker.sessions.values()):
        of_kind = [s for s in _connected_here(broker, session, project, to) if s.peer.agent == kind]
        if len(of_kind) == 1:
            return [of_kind[0].id], None
        if not of_kind:
            raise InputError(
                f"to: no other {kind} session of {project} is connected; to leave one a message, use its "
                f"name or id (see {listing})"
            )
        names = ", ".join(sorted(s.name for s in of_kind))
        raise InputError(f"to: {len(of_kind)} {kind} sessions of {project} are connected ({names}); "
                         "use the name of the one you mean")
    raise InputError(
        f"to: no session is addressed by {to!r} (use a name, id or host session id from {listing}, "
        'an agent kind such as claude or codex, or "*")'
    )


def _connected_here(broker: Broker, session: Session | None, project: str | None, to: str) -> list[Session]:
    """The connected sessions of `project` but the sender (and those that may still vanish)."""
    if project is None:
        raise InputError(
            f"to: {to!r} addresses sessions of the sender's project, and this request names none"
        )
    return [s for s in broker.sessions.values()
            if s is not session and not s.tentative and s.peer.project == project]


@session_op("sent")
async def op_sent(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """This session's messages with their receipts (SPEC §3 "Receipts for the sender"): those
    `ids` name, else the newest; with `wait_seconds`, answered once one of them changes (its
    state, its wake, a reply) or the time is up. Waits on the store's commits (the broker's
    change feed) and on the moment a requested wake turns unconfirmed, never by looking again
    and again."""
    _no_unknown(args, {"ids", "wait_seconds"}, "sent")
    ids = args.get("ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(
            isinstance(i, str) and i.strip() and len(i) <= ADDRESS_MAX for i in ids
        ):
            raise InputError("ids: expected a non-empty list of message ids")
        if len(ids) > SENT_IDS_MAX:
            raise InputError(f"ids: at most {SENT_IDS_MAX}")
        ids = [i.strip() for i in ids]
    wait = args.get("wait_seconds", 0)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= SENT_WAIT_MAX:
        raise InputError(f"wait_seconds: expected a number from 0 to {SENT_WAIT_MAX}, got {wait!r}")
    feed = broker.changes
    waiting = wait > 0 and feed is not None
    if waiting:
        feed.listeners += 1  # the store pokes the feed only while someone listens
    try:
        seen = feed.version if waiting else 0
        limit = queries.SENT_DEFAULT if ids is None else queries.SENT_ROWS_MAX
        found = await broker.db.sent(session.id, ids, limit)
        if ids is not None:
            unknown = queries.not_sent(found, ids)
            if unknown:
                raise InputError(f"ids: this session sent no message with id {unknown[0]!r}")
        if waiting:
            found = await until_changed(broker, session, found, seen, wait)
    finally:
        if waiting:
            feed.listeners -= 1
    now = now_ms()
    out = [r.to_json(now) for r in found]
    if broker.federation is not None:  # a message to another machine: what its hub and machine said
        marks = await broker.db.remote_marks([r.message.id for r in found])
        for receipt, r in zip(out, found, strict=True):
            mark = marks.get(r.message.id)
            if mark is not None:
                receipt.update(machine=mark.machine, relayedAt=mark.relayed_at, storedAt=mark.stored_at,
                               unconfirmed=mark.unconfirmed_at is not None)
    return out


async def until_changed(
    broker: Broker, session: Session, found: list[SentReceipt], seen: int, wait: float
) -> list[SentReceipt]:
    """`found` read again after each store commit until one of its messages has changed, or
    `wait` seconds passed."""
    ids = [r.message.id for r in found]
    if not ids:
        return found
    before = _progress(found, now_ms())
    with trio.move_on_after(wait):
        while True:
            now = now_ms()
            due = [min(r.wakes) + domain.WAKE_CONFIRM_MS for r in found if r.woken(now) == domain.REQUESTED]
            with trio.move_on_after(max(0.0, (min(due) - now) / 1000) if due else math.inf):
                seen = await broker.changes.wait_beyond(seen)
            found = await broker.db.sent(session.id, ids, len(ids))
            if _progress(found, now_ms()) != before:
                break
    return found


def _progress(found: list[SentReceipt], now: int) -> list[tuple[str, str, str | None, tuple[str, ...]]]:
    return [(r.message.id, r.state, r.woken(now), r.replies) for r in found]


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

"""The broker's handlers of owner decisions (SPEC §4.1): `decide` (a session's, and
`agent-bridge decide`'s as the author `cli`), `decisions`, `retractions`, and `agent-bridge
retract`."""

from __future__ import annotations

from typing import Any

import trio

from agent_bridge.broker.args import ADDRESS_MAX
from agent_bridge.broker.args import no_unknown as _no_unknown
from agent_bridge.broker.sessions.session import Session
from agent_bridge.broker.state import Broker, control_op, session_op
from agent_bridge.common import domain
from agent_bridge.common.domain import CLI_AGENT, InputError, SessionView
from agent_bridge.common.projectkey import project_key
from agent_bridge.common.rows import Decision
from agent_bridge.store.decisions import Recipient, host_key
from agent_bridge.store.ids import now_ms
from agent_bridge.store.peers import CLI_AUTHOR

RETRACTION_TOPICS_MAX = 2_000  # one `decisions` history answer's topics


@session_op("decide")
async def op_decide(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    _no_unknown(args, {"topic", "text", "scope", "source_message_id"}, "decide")
    return await decide_as(broker, session.view(), session.peer.agent, session.peer.project, args)


@control_op("decide")
async def cmd_decide(broker: Broker, args: dict[str, Any]) -> Any:
    """`agent-bridge decide`: the rules of the MCP tool, the author `cli`; an omitted scope
    is the folder the command ran in (`project`)."""
    _no_unknown(args, {"topic", "text", "scope", "project"}, "decide")
    project = domain.normalize_folder(args.get("project"), what="project")
    rest = {k: v for k, v in args.items() if k != "project"}
    return await decide_as(broker, CLI_AUTHOR, CLI_AGENT, project, rest)


async def decide_as(
    broker: Broker, author: SessionView, author_agent: str, project: str, args: dict[str, Any]
) -> Any:
    """One revision by `author`; an omitted scope is `project` (the author's folder)."""
    topic = domain.normalize_topic(args.get("topic"))
    text = domain.normalize_text(args.get("text"))
    raw_scope = args.get("scope")
    scope = {"project": project} if raw_scope is None else domain.parse_scope(raw_scope)
    source = args.get("source_message_id")
    if not isinstance(source, str) or len(source) > ADDRESS_MAX:
        source = None  # provenance that names no bridge message is stored as null (SPEC §4.1)
    notified, held_back, recipients = decision_recipients(broker, scope)
    await broker.pause("decide:resolved")
    decision, delivered = await broker.db.record_decision(
        author=author,
        author_agent=author_agent,
        topic=topic,
        text=text,
        scope=scope,
        source_message_id=source,
        recipients=recipients,
        now=now_ms(),
        fault=broker.fault,
    )
    delivered = await decision_recorded(broker, decision, delivered, notified, held_back)
    result: dict[str, Any] = {"decision": decision.to_json(), "deliveredTo": delivered}
    unmatched = await unmatched_addresses(broker, scope)
    if unmatched:  # beside the seed's object, never in it: the tool shows them in a second block
        result[domain.UNMATCHED_ADDRESSES] = unmatched
    return result


def decision_recipients(
    broker: Broker, scope: domain.Scope
) -> tuple[list[Session], list[Session], list[Recipient]]:
    """The connected non-job sessions in a decision's scope: (those notified now, those held
    back while tentative, the notified ones' receipts' keys). `decide` and `answer` alike."""
    in_scope = [s for s in broker.sessions.values() if not s.is_job and domain.scope_applies(scope, s.view())]
    notified = [s for s in in_scope if not s.tentative]
    held_back = [s for s in in_scope if s.tentative]
    return notified, held_back, [Recipient(s.view(), host_key(s.view())) for s in notified]


async def decision_recorded(
    broker: Broker,
    decision: Decision,
    delivered: list[str],
    notified: list[Session],
    held_back: list[Session],
) -> list[str]:
    """After a decision's commit: wake the notified sessions, queue the held-back ones' notices
    for their first tool call; the sorted names of the sessions in scope (`deliveredTo`)."""
    for s in notified:  # the session objects: one may have been merged into another record meanwhile
        s.poke()
    for s in held_back:  # no notice while tentative: queued if it becomes a real session
        s.missed.append(decision.id)
        await broker.identity.queue_missed(s)
    # A tentative session is a connected session in scope (SPEC §4.1): it is named, and its one
    # notice is queued at its first tool call; a health check that leaves first keeps nothing.
    return sorted({*delivered, *(s.name for s in held_back)})


async def unmatched_addresses(broker: Broker, scope: domain.Scope) -> list[str]:
    """The addresses of a `{"sessions": [...]}` scope that name no known session (SPEC §4.1)."""
    if domain.scope_kind(scope) != "sessions":
        return []
    assert isinstance(scope, dict)
    return [a for a in scope["sessions"]
            if broker.find_connected(a) is None and not await broker.db.find_peers_by_address(a)]


@session_op("decisions")
async def op_decisions(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    _no_unknown(args, {"query", "scope", "history"}, "decisions")
    needle = domain.normalize_query(args.get("query"))
    history = args.get("history", False)
    if not isinstance(history, bool):
        raise InputError(f"history: expected true or false, got {history!r}")
    raw_scope = args.get("scope")
    lookup = {"project": session.peer.project} if raw_scope is None else domain.parse_scope(raw_scope)
    caller = session.view().addresses if domain.scope_kind(lookup) == "project" else frozenset()
    key = None
    if broker.federation is not None and isinstance(lookup, dict) and "project" in lookup:
        # other machines' decisions for this folder's git origin count too (SPEC §10)
        key = await trio.to_thread.run_sync(project_key, lookup["project"])
    found = await broker.db.decisions(
        needle=needle, lookup=lookup, caller_addresses=caller, history=history, project_key=key
    )
    return [d.to_json() for d in found]


@session_op("retractions")
async def op_retractions(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """The retraction records of the topics a `decisions` history listed."""
    _no_unknown(args, {"topics"}, "retractions")
    topics = args.get("topics")
    if not isinstance(topics, list) or len(topics) > RETRACTION_TOPICS_MAX:
        raise InputError(
            f"topics: expected a list of at most {RETRACTION_TOPICS_MAX} topics, got {topics!r:.80}"
        )
    found = await broker.db.retractions(sorted({domain.normalize_topic(t) for t in topics}))
    return [r.to_json() for r in found]


@control_op("retract")
async def cmd_retract(broker: Broker, args: dict[str, Any]) -> Any:
    _no_unknown(args, {"topic", "reason"}, "retract")
    topic = domain.normalize_topic(args.get("topic"))
    reason = args.get("reason")
    if reason is not None:
        if not isinstance(reason, str):
            raise InputError("reason: expected a string")
        reason = reason.strip() or None
        if reason is not None and len(reason) > domain.TEXT_MAX:
            raise InputError(f"reason: at most {domain.TEXT_MAX} characters, got {len(reason)}")
    retraction, notified = await broker.db.retract(
        topic=topic,
        reason=reason,
        author=CLI_AUTHOR,
        author_agent=CLI_AGENT,
        connected=[s.view() for s in broker.sessions.values() if not s.tentative],  # never a health check
        now=now_ms(),
        fault=broker.fault,
        key_of=project_key,  # another machine's project decision applies by the folder's origin
    )
    for peer_id, _ in notified:
        target = broker.sessions.get(peer_id)
        if target is not None:
            target.poke()
    return {"retraction": retraction.to_json(), "notified": [name for _, name in notified]}

"""The broker's handlers of owner questions (SPEC §4.6): `ask_owner` on a session's connection,
`answer` as a control request (`agent-bridge answer`, the dashboard's owner action).

An answer is a pinned decision recorded by the owner (`cli`) with the rules and fan-out of
`decide` (daemon.ops_decisions: the same recipients, the same notices to sessions held back while
they identify), the question marked answered, and one active message to every asker, which
wakes an idle asker where its host's reach allows: all in one transaction (store.questions).
"""

from __future__ import annotations

from typing import Any

from agent_bridge import domain
from agent_bridge.daemon.args import ADDRESS_MAX
from agent_bridge.daemon.args import no_unknown as _no_unknown
from agent_bridge.daemon.broker import Broker, control_op, session_op
from agent_bridge.daemon.ops_decisions import decision_recipients, decision_recorded, unmatched_addresses
from agent_bridge.daemon.sessions import Session
from agent_bridge.domain import InputError
from agent_bridge.store.ids import now_ms
from agent_bridge.store.peers import CLI_AUTHOR

QUESTIONS_COMMAND = "`agent-bridge questions`"


@session_op("ask_owner")
async def ask_owner(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """Record a question for the owner, join the open one it repeats, or answer with the
    current decision on its topic (then nothing is recorded)."""
    _no_unknown(args, {"question", "topic", "options", "scope"}, "ask_owner")
    question = domain.normalize_question(args.get("question"))
    topic = None if args.get("topic") is None else domain.normalize_topic(args.get("topic"))
    options = domain.normalize_options(args.get("options"))
    raw_scope = args.get("scope")
    scope = {"project": session.peer.project} if raw_scope is None else domain.parse_scope(raw_scope)
    view = session.view()
    asked, current = await broker.db.ask_question(
        asker=view,
        asker_agent=session.peer.agent,
        question=question,
        topic=topic,
        options=options,
        scope=scope,
        caller_addresses=view.addresses,
        now=now_ms(),
    )
    return {"question": None if asked is None else asked.to_json(),
            "current": None if current is None else current.to_json()}


@control_op("answer")
async def answer(broker: Broker, args: dict[str, Any]) -> Any:
    """`agent-bridge answer ID TEXT | --option N | --decline REASON`: exactly one of `text`,
    `option` (numbered from 1) or `decline`; `scope` (with an answer) replaces the question's.
    `questionId`: a question's id, or the start of exactly one (`id` names the request itself)."""
    _no_unknown(args, {"questionId", "text", "option", "decline", "scope"}, "answer")
    given = [k for k in ("text", "option", "decline") if args.get(k) is not None]
    if len(given) != 1:
        raise InputError("answer: give exactly one of text, option or decline")
    question_id = await _question_id(broker, args.get("questionId"))
    question = await broker.db.question(question_id)
    if question is None:
        raise InputError(f"no question has id {question_id!r} (see {QUESTIONS_COMMAND})")
    if "decline" in given:
        if args.get("scope") is not None:
            raise InputError("scope: a declined question records no decision, so it takes no scope")
        reason = domain.normalize_reason(args.get("decline"), "decline")
        declined, told = await broker.db.decline_question(
            question_id=question.id, reason=reason, now=now_ms()
        )
        _poke(broker, told)
        return {"question": declined.to_json(), "decision": None, "deliveredTo": [],
                "askersTold": [name for _, name in told]}
    if "option" in given:
        text = domain.option_number(args.get("option"), question.options)
    else:
        text = domain.normalize_text(args.get("text"))
    raw_scope = args.get("scope")
    scope = question.scope if raw_scope is None else domain.parse_scope(raw_scope)
    topic = question.topic or domain.topic_from_question(question.question)
    notified, held_back, recipients = decision_recipients(broker, scope)
    await broker.pause("decide:resolved")
    answered, decision, delivered, told = await broker.db.answer_question(
        question_id=question.id,
        author=CLI_AUTHOR,
        topic=topic,
        text=text,
        scope=scope,
        recipients=recipients,
        now=now_ms(),
        fault=broker.fault,
    )
    delivered = await decision_recorded(broker, decision, delivered, notified, held_back)
    _poke(broker, told)
    result: dict[str, Any] = {"question": answered.to_json(), "decision": decision.to_json(),
                              "deliveredTo": delivered, "askersTold": [name for _, name in told]}
    unmatched = await unmatched_addresses(broker, scope)
    if unmatched:
        result[domain.UNMATCHED_ADDRESSES] = unmatched
    return result


async def _question_id(broker: Broker, raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip() or len(raw) > ADDRESS_MAX:
        raise InputError(f"questionId: expected a question's id (see {QUESTIONS_COMMAND})")
    given = raw.strip()
    if await broker.db.question(given) is not None:
        return given
    found = await broker.db.question_ids_starting(given)
    if len(found) == 1:
        return found[0]
    if found:
        raise InputError(
            f"questionId: {given!r} starts {'more than ' if len(found) >= 10 else ''}{len(found)} question "
            f"ids; "
            f"give more of it (see {QUESTIONS_COMMAND})"
        )
    raise InputError(f"no question has id {given!r} (see {QUESTIONS_COMMAND})")


def _poke(broker: Broker, told: list[tuple[str, str]]) -> None:
    for peer_id, _ in told:
        target = broker.sessions.get(peer_id)
        if target is not None:
            target.poke()

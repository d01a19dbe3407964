"""The broker's handlers of owner questions (SPEC §4.6): `ask_owner` on a session's connection,
`answer` as a control request (`agent-bridge answer`, the dashboard's owner action).

An answer is a pinned decision recorded by the owner (`cli`) with the rules and fan-out of
`decide` (broker.ops.decisions: the same recipients, the same notices to sessions held back while
they identify), the question marked answered, and one active message to every asker, which
wakes an idle asker where its host's reach allows: all in one transaction (store.questions).
"""

from __future__ import annotations

from typing import Any

import trio

from agent_bridge.broker.args import ADDRESS_MAX
from agent_bridge.broker.args import no_unknown as _no_unknown
from agent_bridge.broker.ops.decisions import decision_recipients, decision_recorded, unmatched_addresses
from agent_bridge.broker.sessions.session import Session
from agent_bridge.broker.state import Broker, control_op, session_op
from agent_bridge.common import domain, questions, tools
from agent_bridge.common.domain import InputError
from agent_bridge.common.rows import Question
from agent_bridge.store.ids import now_ms
from agent_bridge.store.peers import CLI_AUTHOR

QUESTIONS_COMMAND = "`agent-bridge questions`"


ASK_WAIT_MAX = tools.ASK_WAIT_MAX


@session_op("ask_owner")
async def ask_owner(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """Record a question for the owner, join the open one it repeats, or answer with the
    current decision on its topic (then nothing is recorded); with `wait_seconds`, wait that long
    for the answer (`answer` in the result when it came). `withdraw: ID` instead of `question`:
    the caller withdraws its question. Neither, or both, is refused in one line."""
    _no_unknown(args, {"question", "topic", "options", "scope", "context", "recommended", "wait_seconds",
                       "withdraw"}, "ask_owner")
    if args.get("withdraw") is not None:
        if args.get("question") is not None:
            raise InputError(
                "ask_owner: give `question` to ask, or `withdraw` (your question's id), not both"
            )
        others = [k for k in args if k != "withdraw" and args[k] is not None]
        if others:
            raise InputError(f"withdraw: give the question's id and nothing else (not {others[0]})")
        question_id = await _question_id(broker, args.get("withdraw"))
        withdrawn = await broker.db.withdraw_question(
            question_id=question_id, asker_id=session.id, now=now_ms()
        )
        return {"question": withdrawn.to_json(), "current": None}
    if args.get("question") is None:
        raise InputError("ask_owner: give `question` to ask, or `withdraw` with your question's id")
    question = questions.normalize_question(args.get("question"))
    topic = None if args.get("topic") is None else domain.normalize_topic(args.get("topic"))
    options = questions.normalize_options(args.get("options"))
    context = questions.normalize_context(args.get("context"))
    recommended = questions.recommended_option(args.get("recommended"), options)
    wait = _wait_seconds(args.get("wait_seconds"))
    raw_scope = args.get("scope")
    scope = {"project": session.peer.project} if raw_scope is None else domain.parse_scope(raw_scope)
    view = session.view()
    feed = broker.changes if wait > 0 else None
    if feed is not None:
        feed.listeners += 1  # from before the question is recorded: no answer is missed
    try:
        seen = feed.version if feed is not None else 0
        asked, current = await broker.db.ask_question(
            asker=view, asker_agent=session.peer.agent, question=question, topic=topic, options=options,
            scope=scope, caller_addresses=view.addresses, now=now_ms(), context=context,
            recommended=recommended,
        )
        result: dict[str, Any] = {"question": None if asked is None else asked.to_json(),
                                  "current": None if current is None else current.to_json()}
        if asked is not None and feed is not None:
            with trio.move_on_after(wait):
                while asked is not None and asked.open:
                    seen = await feed.wait_beyond(seen)
                    asked = await broker.db.question(asked.id)
            if asked is not None and not asked.open:
                result["question"] = asked.to_json()
                result["answer"] = await _answer_of(broker, asked)
    finally:
        if feed is not None:
            feed.listeners -= 1
    return result


def _wait_seconds(value: object) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= ASK_WAIT_MAX:
        raise InputError(f"wait_seconds: expected a number from 0 to {ASK_WAIT_MAX}")
    return float(value)


async def _answer_of(broker: Broker, question: Question) -> dict[str, Any]:
    """What became of a question the caller waited for: the owner's decision, or the reason
    for a decline, or that it was withdrawn (the askers' answer message comes as well)."""
    decision = None
    if question.decision_id is not None:
        found = await broker.db.decision(question.decision_id)
        decision = None if found is None else found.to_json()
    return {"state": question.state, "decision": decision, "reason": question.reason}


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
        reason = questions.normalize_reason(args.get("decline"), "decline")
        declined, told = await broker.db.decline_question(
            question_id=question.id, reason=reason, now=now_ms()
        )
        _poke(broker, told)
        return {"question": declined.to_json(), "decision": None, "deliveredTo": [],
                "askersTold": [name for _, name in told]}
    if "option" in given:
        text = questions.option_number(args.get("option"), question.options)
    else:
        text = domain.normalize_text(args.get("text"))
    raw_scope = args.get("scope")
    scope = question.scope if raw_scope is None else domain.parse_scope(raw_scope)
    topic = question.topic or questions.topic_from_question(question.question)
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

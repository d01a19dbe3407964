"""The store's owner questions (SPEC §4.6): asking, joining, answering and declining.

A concern of the one writer (`store.writer.Store` is built on it, as on store.decisions, which
it builds on): every method is one transaction. A question is carried by a bridge message (kind
question) from its first asker to the owner `cli`; its id is that message's id, so the decision
that answers it names the question as its `sourceMessageId`. Everything is appended: a question
row, a row per asker, one outcome row (answered, with its decision, or declined, with the reason),
and the active message (kind answer) each asker is sent then.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import apsw

from agent_bridge.common import domain
from agent_bridge.common.domain import InputError, Scope, SessionView
from agent_bridge.common.rows import Decision, Question
from agent_bridge.store import queries, question_queries
from agent_bridge.store.decisions import Decisions, Recipient
from agent_bridge.store.ids import new_id

QUESTION_HOP = 1  # a question's message, and the answer each asker gets: new, active messages


class Questions(Decisions):
    """Owner questions, their askers, their answers (decisions) and declines."""

    def question(self, question_id: str) -> Question | None:
        return queries.question_by_id(self.conn, question_id)

    def decision(self, decision_id: str) -> Decision | None:
        return queries.decision_by_id(self.conn, decision_id)

    def question_ids_starting(self, prefix: str) -> list[str]:
        return question_queries.ids_starting(self.conn, prefix)

    def ask_question(
        self, *, asker: SessionView, asker_agent: str, question: str, topic: str | None,
        options: Sequence[str], scope: Scope, caller_addresses: frozenset[str], now: int,
        context: str | None = None, recommended: int | None = None,
    ) -> tuple[Question | None, Decision | None]:
        """Record `asker`'s question (with what it knows, `context`, and the option it
        recommends), or add `asker` to the open question it repeats (same topic and scope: that
        question keeps its own context). When `topic` already has a current decision for
        `scope`, nothing is recorded: (None, that decision)."""
        scope_json = domain.scope_to_json(scope)
        with self.conn:
            if topic is not None:
                lookup_addresses = caller_addresses if domain.scope_kind(scope) == "project" else frozenset()
                current = queries.query_decisions(
                    self.conn, topic=topic, lookup=scope, caller_addresses=lookup_addresses, limit=1
                )
                if current:
                    return None, current[0]
            asker_id = self.resolve_peer(asker.id)
            found = question_queries.find_open(
                self.conn, topic=topic, scope_json=scope_json, question=question
            )
            if found is None:
                self._ensure_cli_peer(now)
                question_id = new_id()
                self.conn.execute(
                    "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
                    "VALUES (?,?,?,?,?,?,?)",
                    (question_id, asker_id, queries.CLI_ID, question, QUESTION_HOP, None, now),
                )
                self.conn.execute(
                    "INSERT INTO questions(id, question, topic, options, scope, created_at) "
                    "VALUES (?,?,?,?,?,?)",
                    (
                        question_id,
                        question,
                        topic,
                        json.dumps(list(options), ensure_ascii=False),
                        scope_json,
                        now,
                    ),
                )
                if context is not None or recommended is not None:
                    self.conn.execute(
                        "INSERT INTO question_details(question_id, context, recommended) VALUES (?,?,?)",
                        (question_id, context, recommended),
                    )
            else:
                question_id = found.id
            self.conn.execute(
                "INSERT OR IGNORE INTO question_askers(question_id, peer_id, name, agent, asked_at) "
                "VALUES (?,?,?,?,?)",
                (question_id, asker_id, asker.name, asker_agent, now),
            )
            asked = queries.question_by_id(self.conn, question_id)
        assert asked is not None
        return asked, None

    def withdraw_question(self, *, question_id: str, asker_id: str, now: int) -> Question:
        """`asker_id` withdraws its open question: it leaves `askedBy`; a question nobody asks
        any more is `withdrawn` (closed, no outcome, nobody told). One transaction. InputError
        when the question is not open or not the asker's."""
        with self.conn:
            question = _open_question(self.conn, question_id)
            peer_id = self.resolve_peer(asker_id)
            mine = [a for a in question.asked_by if a.id is not None and self.resolve_peer(a.id) == peer_id]
            if not mine:
                raise InputError(f"question {question.id} is not one you asked (or you withdrew it already)")
            for asker in mine:
                self.conn.execute(
                    "INSERT OR IGNORE INTO question_withdrawals(question_id, peer_id, withdrawn_at) "
                    "VALUES (?,?,?)",
                    (question.id, asker.id, now),
                )
            if len(mine) == len(question.asked_by):
                self.conn.execute(
                    "INSERT INTO question_ends(question_id, state, created_at) VALUES (?, 'withdrawn', ?)",
                    (question.id, now),
                )
            withdrawn = queries.question_by_id(self.conn, question.id)
        assert withdrawn is not None
        return withdrawn

    def answer_question(
        self, *, question_id: str, author: SessionView, topic: str, text: str, scope: Scope,
        recipients: Sequence[Recipient], now: int, fault: Callable[[str], None] = lambda point: None,
    ) -> tuple[Question, Decision, list[str], list[tuple[str, str]]]:
        """The owner's answer: a pinned decision (by `author`, the owner's record `cli`;
        sourceMessageId the question's id)
        with its notifications (`recipients`, as record_decision's), the question marked
        answered, and one active message to each asker. One transaction.

        Returns (the question as it is now, the decision, the names told of the decision,
        [(asker id, name)] sent the answer). InputError when the question is not open."""
        with self.conn:
            question = _open_question(self.conn, question_id)
            decision, delivered = self.record_decision(
                author=author, author_agent=domain.CLI_AGENT, topic=topic, text=text, scope=scope,
                source_message_id=question.id, recipients=recipients, now=now, fault=fault,
            )
            self.conn.execute(
                "INSERT INTO question_outcomes(question_id, state, decision_id, reason, created_at) "
                "VALUES (?, 'answered', ?, NULL, ?)",
                (question.id, decision.id, now),
            )
            fault("answer:after-outcome")
            told = _tell_askers(self, question, answer_text(question, decision), now)
            fault("answer:before-commit")
            answered = queries.question_by_id(self.conn, question.id)
        assert answered is not None
        return answered, decision, delivered, told

    def decline_question(
        self, *, question_id: str, reason: str, now: int
    ) -> tuple[Question, list[tuple[str, str]]]:
        """The owner declines: the question marked declined with `reason`, and one active
        message to each asker. One transaction. InputError when the question is not open."""
        with self.conn:
            question = _open_question(self.conn, question_id)
            self._ensure_cli_peer(now)
            self.conn.execute(
                "INSERT INTO question_outcomes(question_id, state, decision_id, reason, created_at) "
                "VALUES (?, 'declined', NULL, ?, ?)",
                (question.id, reason, now),
            )
            told = _tell_askers(self, question, decline_text(question, reason), now)
            declined = queries.question_by_id(self.conn, question.id)
        assert declined is not None
        return declined, told


def _open_question(conn: apsw.Connection, question_id: str) -> Question:
    question = queries.question_by_id(conn, question_id)
    if question is None:
        raise InputError(f"no question has id {question_id!r} (see `agent-bridge questions`)")
    if question.state == "answered":
        raise InputError(f"question {question_id} is already answered (decision {question.decision_id})")
    if question.state == "declined":
        raise InputError(f"question {question_id} was already declined")
    if question.state == "withdrawn":
        raise InputError(f"question {question_id} was withdrawn by those who asked it")
    return question


def _tell_askers(store: Questions, question: Question, body: str, now: int) -> list[tuple[str, str]]:
    """One active message from the owner to each asker (the record it leads to now), with its
    receipt and its question notice (inside the caller's transaction)."""
    told: dict[str, str] = {}
    for asker in question.asked_by:
        if asker.id is None:
            continue
        peer_id = store.resolve_peer(asker.id)
        row = store.conn.execute(
            f"SELECT name FROM peers WHERE id = ? AND {queries.LISTED_PEERS}", (peer_id,)
        ).fetchone()
        if row is None or peer_id in told:
            continue  # forgotten since it asked: nobody to tell
        store._close_tap(peer_id)  # its delivery task reads this from the database
        message_id = new_id()
        store.conn.execute(
            "INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
            "VALUES (?,?,?,?,?,?,?)",
            (message_id, queries.CLI_ID, peer_id, body, QUESTION_HOP, question.id, now),
        )
        store.conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES (?, ?)", (message_id, peer_id))
        store.conn.execute(
            "INSERT INTO question_notices(message_id, question_id, peer_id) VALUES (?, ?, ?)",
            (message_id, question.id, peer_id),
        )
        told[peer_id] = str(row[0])
    return sorted(told.items(), key=lambda item: item[1])


def _quoted(question: Question) -> str:
    return domain.topic_line("", question.question, domain.NOTE_TEXT_MAX).removeprefix(": ")


def answer_text(question: Question, decision: Decision) -> str:
    where = "all sessions" if decision.scope == "all" else domain.scope_to_json(decision.scope)
    return (f"The owner answered your question {question.id} (\u201c{_quoted(question)}\u201d). "
            f"Recorded as pinned decision {decision.id} for {where}: {decision.line()}")


def decline_text(question: Question, reason: str) -> str:
    return (f"The owner declined your question {question.id} (\u201c{_quoted(question)}\u201d). "
            f"Reason: {reason}")

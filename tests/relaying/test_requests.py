"""The requests in flight (agent_bridge.relay.requests), with time an argument: what waits,
what is resent after a lost connection, what is answered as maybe done; and, through every
interleaving hypothesis finds, that no request is answered twice or forgotten."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from agent_bridge.relay.requests import CALL_TIMEOUT, Request, Requests, request_of


def call(rid: Any, tool: str, **arguments: Any) -> Request:
    params = {"name": tool, "arguments": arguments}
    message = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
    return request_of(message, json.dumps(message))


@pytest.mark.parametrize(("tool", "arguments", "resend", "waits"), [
    ("inbox", {"wait_seconds": 30}, True, True),
    ("inbox", {"wait_seconds": True}, True, False),  # a bool is no number of seconds
    ("inbox", {}, True, False),
    ("send", {"to": "b", "body": "x"}, False, False),
    ("whoami", {}, True, False),
])
def test_a_request_knows_whether_it_may_be_sent_twice_and_whether_it_waits(tool, arguments, resend, waits):
    request = call(7, tool, **arguments)
    assert (request.key, request.method, request.tool) == ("7", "tools/call", tool)
    assert (request.resend, request.waits) == (resend, waits)


def test_a_lost_connection_resends_what_may_be_done_twice_first_and_returns_the_rest():
    book = Requests()
    book.wait(call(1, "whoami"), now=0.0)
    send, inbox = call(2, "send", to="b", body="x"), call(3, "inbox", wait_seconds=30)
    book.forward(send)
    book.forward(inbox)
    assert book.lost(now=5.0) == [send]
    assert [r.rid for r in book.waiting] == [3, 1]  # what was in flight goes first
    assert inbox.deadline == 5.0 + CALL_TIMEOUT
    assert book.send_waiting() == [inbox, book.forwarded["1"]]
    assert not book.waiting


def test_a_wait_ends_at_its_deadline_or_at_once_for_a_tool_call_with_a_known_reason():
    book = Requests()
    listing = request_of({"jsonrpc": "2.0", "id": 1, "method": "resources/list"}, "{}")
    tool = call(2, "whoami")
    book.wait(listing, now=0.0)
    book.wait(tool, now=1.0)
    assert book.due(now=CALL_TIMEOUT - 0.01, known=False) == []
    assert book.next_deadline() == CALL_TIMEOUT
    assert book.due(now=2.0, known=True) == [tool]  # no use waiting: the broker cannot start
    assert book.due(now=CALL_TIMEOUT, known=False) == [listing]
    assert book.next_deadline() is None


def test_a_cancel_says_whether_the_broker_ever_heard_of_the_request():
    book = Requests()
    book.wait(call(1, "inbox", wait_seconds=5), now=0.0)
    book.forward(call(2, "inbox", wait_seconds=5))
    assert book.waiting_calls() == [2, 1]
    assert book.cancel("1") is True
    assert book.cancel("2") is False
    assert book.settled


def test_an_answer_counts_until_written():
    book = Requests()
    book.forward(call(1, "whoami"))
    assert book.answered("9") is None  # not one of the host's
    assert book.answered("1") is not None
    assert not book.settled
    book.written()
    assert book.settled


class Book(RuleBasedStateMachine):
    """Every request the host made ends answered exactly once (by the broker, or as maybe done,
    or as expired), or is cancelled; until then it is in exactly one place."""

    def __init__(self) -> None:
        super().__init__()
        self.book = Requests()
        self.now = 0.0
        self.next_id = 0
        self.answers: dict[str, int] = {}  # key -> times answered
        self.open: set[str] = set()

    def _answer(self, key: str) -> None:
        self.answers[key] = self.answers.get(key, 0) + 1
        self.open.discard(key)

    @rule(tool=st.sampled_from(["send", "whoami", "inbox"]), connected=st.booleans())
    def ask(self, tool: str, connected: bool) -> None:
        self.next_id += 1
        request = call(self.next_id, tool, to="b", body="x") if tool == "send" else call(self.next_id, tool)
        self.open.add(request.key)
        if connected:
            self.book.forward(request)
        else:
            self.book.wait(request, self.now)

    @rule(data=st.data())
    def broker_answers(self, data: st.DataObject) -> None:
        if self.book.forwarded:
            key = data.draw(st.sampled_from(sorted(self.book.forwarded)))
            assert self.book.answered(key) is not None
            self.book.written()
            self._answer(key)

    @rule()
    def connection_lost(self) -> None:
        for request in self.book.lost(self.now):
            self._answer(request.key)  # answered as maybe done

    @rule()
    def broker_joins(self) -> None:
        self.book.send_waiting()

    @rule(seconds=st.floats(0, 2 * CALL_TIMEOUT), known=st.booleans())
    def time_passes(self, seconds: float, known: bool) -> None:
        self.now += seconds
        for request in self.book.due(self.now, known):
            self._answer(request.key)

    @rule(data=st.data())
    def host_cancels(self, data: st.DataObject) -> None:
        if self.open:
            key = data.draw(st.sampled_from(sorted(self.open)))
            self.book.cancel(key)
            self.open.discard(key)

    @invariant()
    def answered_at_most_once_and_each_open_one_in_one_place(self) -> None:
        assert all(times == 1 for times in self.answers.values()), self.answers
        places = [*self.book.forwarded, *(r.key for r in self.book.waiting)]
        assert sorted(places) == sorted(self.open)


Book.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_no_request_is_answered_twice_or_forgotten = Book.TestCase

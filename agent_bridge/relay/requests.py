"""The host's requests the relay has not seen answered, with no I/O (time is an argument).

A request is in one place: `forwarded` (sent on the broker connection), `waiting` (for a
broker, until its deadline), or being answered (taken off `forwarded`, its answer not written
yet: `answering` counts those, so the end of the session waits for their bytes). When the
connection breaks, what was forwarded is sent again to the next broker if doing it twice
changes nothing (`resend`), and otherwise answered with an error saying it may have been done
(`lost` returns those): nothing is answered twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_bridge.common import tools
from agent_bridge.core import showing

CALL_TIMEOUT = 15.0  # a request waits this long for the broker to be reachable


@dataclass
class Request:
    """A host request this relay has not seen answered."""

    key: str  # its JSON-RPC id, keyed as the SDK correlates ids (showing.key)
    rid: Any  # that id exactly as the host sent it: its answer carries it back
    line: str
    method: str
    tool: str | None  # the tool a `tools/call` names
    deadline: float = 0.0  # while waiting for a broker: when to give up
    resend: bool = True  # in flight when the broker went away: sent again (tools.idempotent)
    waits: bool = False  # a tool call that waits (wait_seconds > 0): cancelled when the host leaves


def request_of(message: dict[str, Any], line: str) -> Request:
    """The request a host's line (`message`, parsed, with a string `method` and an `id`) makes."""
    method = message["method"]
    params = message.get("params")
    tool = params.get("name") if method == "tools/call" and isinstance(params, dict) else None
    tool = tool if isinstance(tool, str) else None
    arguments = params.get("arguments") if isinstance(params, dict) else None
    resend = method != "tools/call" or tools.idempotent(tool, arguments)
    wait = arguments.get("wait_seconds") if isinstance(arguments, dict) else None
    waits = tool is not None and isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0
    return Request(showing.key(message["id"]), message["id"], line, method, tool, resend=resend, waits=waits)


class Requests:
    def __init__(self) -> None:
        self.forwarded: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.answering = 0

    @property
    def settled(self) -> bool:
        """Nothing asked is left unanswered or unwritten."""
        return not (self.forwarded or self.waiting or self.answering)

    def forward(self, request: Request) -> None:
        self.forwarded[request.key] = request

    def wait(self, request: Request, now: float) -> None:
        """`request` waits for a broker, up to CALL_TIMEOUT."""
        request.deadline = now + CALL_TIMEOUT
        self.waiting.append(request)

    def answered(self, key: str) -> Request | None:
        """The broker answered `key`: the request, now being answered (`written` once its
        answer is), or None when it is not one of the host's in flight."""
        request = self.forwarded.pop(key, None)
        if request is not None:
            self.answering += 1
        return request

    def written(self) -> None:
        self.answering -= 1

    def cancel(self, key: str) -> bool:
        """The host cancelled `key`: never sent again nor waited for. True when it had not
        been sent yet (no broker ever heard of it)."""
        self.forwarded.pop(key, None)
        if any(r.key == key for r in self.waiting):
            self.waiting = [r for r in self.waiting if r.key != key]
            return True
        return False

    def waiting_calls(self) -> list[Any]:
        """The ids of the tool calls that wait (`wait_seconds`), sent or not."""
        return [r.rid for r in (*self.forwarded.values(), *self.waiting) if r.waits]

    def lost(self, now: float) -> list[Request]:
        """The connection ended: what may be done twice waits for the next broker, first in
        line; the rest is returned, to be answered as maybe done."""
        unsure = [r for r in self.forwarded.values() if not r.resend]
        again = [r for r in self.forwarded.values() if r.resend]
        for request in again:
            request.deadline = now + CALL_TIMEOUT
        self.waiting[:0] = again
        self.forwarded.clear()
        return unsure

    def send_waiting(self) -> list[Request]:
        """A broker joined: what waited for one, now forwarded to it."""
        sent, self.waiting = self.waiting, []
        for request in sent:
            self.forwarded[request.key] = request
        return sent

    def take_waiting(self) -> list[Request]:
        taken, self.waiting = self.waiting, []
        return taken

    def due(self, now: float, known: bool) -> list[Request]:
        """Taken out: the requests whose wait is over (their deadline passed, or, `known`, the
        broker's absence has a known reason and they are tool calls)."""
        due = [r for r in self.waiting if r.deadline <= now or (known and r.method == "tools/call")]
        if due:
            self.waiting = [r for r in self.waiting if all(r is not d for d in due)]
        return due

    def next_deadline(self) -> float | None:
        return min((r.deadline for r in self.waiting), default=None)


def cancelled_key(message: dict[str, Any]) -> str:
    """The request a host's `notifications/cancelled` names (showing.key: the key of its answer)."""
    params = message.get("params")
    return showing.key(params.get("requestId") if isinstance(params, dict) else None)

"""When the relay's host leaves: it closes stdin (`end`), or ends the process with a signal
(`keep_written_at_exit`). Nothing is acknowledged for a line the host did not read, and what it
read and no broker confirmed recording is kept in the ledger for the next one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from agent_bridge.common import jsonlimit
from agent_bridge.ipc.frames import EOF, RelayFrame
from agent_bridge.relay.host_io import ShowingWrite
from agent_bridge.relay.keeper import Keeper
from agent_bridge.relay.link import Link
from agent_bridge.relay.requests import Request, Requests, cancelled_key
from agent_bridge.relay.shown import Shown

ACK_FLUSH_AT_EXIT = 2.0  # seconds the broker gets to record the last acknowledgements when the host leaves
# Seconds the broker gets to answer what the host asked before it closed stdin (its MCP server
# stops reading at "eof", and an answer it has not written by then is never written).
ANSWERS_AT_EXIT = 5.0
SIGNAL_WAIT = 0.5  # seconds a signal's handler waits for another thread before it writes the ledger


class Leaving(Protocol):
    """What leaving needs of the relay (agent_bridge.relay.main.Relay)."""

    lock: threading.RLock
    cond: threading.Condition
    reporting: threading.Lock
    link: Link | None
    showing_write: ShowingWrite
    session_id: str | None
    keeper: Keeper
    requests: Requests
    shown: Shown

    def on_host_line(self, line: str, more: bool = False) -> None: ...
    def flush(self) -> None: ...
    def send(self, link: Link, frames: Sequence[RelayFrame], queue: bool = False) -> None: ...
    def answer_unreachable(self, requests: list[Request], reason: str) -> None: ...
    def wait_for(self, done: Callable[[], bool], timeout: float) -> bool: ...


def on_signal(relay: Leaving, leave: Callable[[], object]) -> Callable[[], None]:
    """The handler of a leaving signal: `leave`, once. One that interrupts the thread between
    writing a line that shows messages and noting it shown (host_io.ShowingWrite; the pump's
    thread is the main one, where handlers run) would find what it keeps half-changed, and wait
    in vain for `reporting`, which this thread holds: it leaves once the line is noted, or after
    SIGNAL_WAIT from another thread if the write does not end (a host that no longer reads
    its output; the line was not written whole, so nothing of it is kept acknowledged)."""
    once = threading.Lock()

    def leave_once() -> None:
        if once.acquire(blocking=False):
            leave()

    def handler() -> None:
        if not relay.showing_write.here():
            leave_once()
            return
        relay.showing_write.then = leave_once
        waiting = threading.Timer(SIGNAL_WAIT, leave_once)
        waiting.daemon = True
        waiting.start()

    return handler


def keep_written_at_exit(relay: Leaving, unread: bytes) -> None:
    """A signal ends the process now: what was shown and maybe never recorded is kept (as
    when the host closes stdin and the broker does not confirm in time), once the cancels in
    the host's `unread` input (sent before the signal, not read yet) are taken into account.
    The handler runs on the main thread, which may hold `cond` (re-entrant) mid-change: at
    worst an id is missed and shown again, as a repeat; held by another thread, it is
    waited for only briefly, as is `reporting` (a line being written to the host is noted as
    shown once written)."""
    if relay.reporting.acquire(timeout=SIGNAL_WAIT):  # a line the host may have read is noted first
        relay.reporting.release()
    if relay.cond.acquire(timeout=SIGNAL_WAIT):
        try:
            for line in unread.split(b"\n"):
                if b"notifications/cancelled" in line:
                    try:
                        message = jsonlimit.loads(line)
                    except ValueError:  # (UnicodeDecodeError and TooDeep included)
                        continue
                    if isinstance(message, dict) and message.get("method") == "notifications/cancelled":
                        relay.shown.take_back(cancelled_key(message), relay.session_id)
            relay.shown.keep_written(relay.session_id)
        finally:
            relay.cond.release()


def end(relay: Leaving) -> None:
    """The host closed stdin: what it asked before that is answered (up to ANSWERS_AT_EXIT;
    a request still waiting for a broker then gets the reason there is none), then the
    broker records what the host was shown, and closes. A call that waits (`inbox` with
    `wait_seconds`, say) is cancelled as if the host had cancelled it: nobody reads its
    answer now, so it shows and acknowledges nothing, and the relay need not wait for it."""
    with relay.lock:
        waiting_calls = relay.requests.waiting_calls()
    for rid in waiting_calls:
        relay.on_host_line(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                      "params": {"requestId": rid, "reason": "the host left"}}))
    relay.flush()
    relay.wait_for(lambda: relay.requests.settled, ANSWERS_AT_EXIT)
    with relay.lock:
        link = relay.link
        unanswered = relay.requests.take_waiting()
        reason = relay.keeper.unreachable()
    relay.answer_unreachable(unanswered, reason)
    if link is None:
        return
    if relay.reporting.acquire(timeout=ACK_FLUSH_AT_EXIT):  # a line the host read is reported first
        relay.reporting.release()
    relay.send(link, [EOF])
    if not relay.wait_for(lambda: relay.link is not link, ACK_FLUSH_AT_EXIT):
        with relay.lock:  # no answer in time: a broker that reads the ledger records them
            relay.shown.keep_written(relay.session_id)

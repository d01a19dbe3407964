"""`agent-bridge mcp`: the stdio process of one agent session (SPEC §5), standard library only.

The host starts one per session. It relays the host's JSON-RPC lines to the broker, which serves
the MCP protocol itself (broker.mcp.host), and writes the broker's lines to the host's stdout. It
imports neither trio nor the MCP SDK nor pydantic, like the hooks: a session costs a small
Python process, and the host's start does not wait for those imports.

What only this process can know or do stays here: who its host is (the ancestor chain, the
environment, the flags: `Options.hello`), starting the broker when none answers, reconnecting
with backoff, and acknowledging only what it wrote: a line that shows messages is reported
"written" to the broker after its bytes are in the host's pipe, or, with no broker to tell, kept
in the ledger file (agent_bridge.common.ledger) for the next one. With no broker at all, `initialize`,
`tools/list` and `ping` are answered from data generated from the real server
(`mcp_static.json`, written by `python -m agent_bridge.broker.mcp.static`), and tool calls wait
for the broker, then get the reason it is not there. Across a broker restart it replays the
host's `initialize` to the new broker and drops that answer; a request in flight when the
connection broke is sent again if doing it twice changes nothing, and otherwise answered with
an error saying it may or may not have been carried out: nothing is answered twice.

This module is the wiring; each decision is a part of its own (agent_bridge.relay): the
pump (pump: on POSIX the host's side and the broker's on the main thread, under one select),
the host's input and output (host_io), the broker connection (link), finding, starting and
rejoining the broker (keeper: the decisions; connector: their I/O), the `initialize` replay
(replay), the requests in flight (requests), what was shown (shown, over the ledger) and the
answers the relay writes itself (answers).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from agent_bridge import hosts
from agent_bridge.common import domain, jsonlimit, paths, tools
from agent_bridge.common.faults import Fault, fault_injector, no_fault
from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import (
    Acked,
    Held,
    Identity,
    Line,
    RelayFrame,
    Wire,
    Written,
    line_frames,
    read_push,
)
from agent_bridge.relay import answers, connector, leaving, router
from agent_bridge.relay.alone import Alone
from agent_bridge.relay.answers import ANSWER_HEAD, INTERNAL_ERROR, INVALID_REQUEST, STATIC
from agent_bridge.relay.connector import BadHello
from agent_bridge.relay.host_io import (
    LEAVING_SIGNALS,
    SIGNAL_MASKS,
    HostInput,
    HostOutput,
    ShowingWrite,
    signals_held,
)
from agent_bridge.relay.keeper import START_ATTEMPTS, Keeper
from agent_bridge.relay.leaving import ACK_FLUSH_AT_EXIT, ANSWERS_AT_EXIT
from agent_bridge.relay.link import Link
from agent_bridge.relay.options import Options, options_from
from agent_bridge.relay.pump import Pump, batched, read_here
from agent_bridge.relay.replay import Replay
from agent_bridge.relay.requests import Request, Requests, cancelled_key, request_of
from agent_bridge.relay.shown import Shown

__all__ = ["ANSWERS_AT_EXIT", "ANSWER_HEAD", "INVALID_REQUEST", "START_ATTEMPTS", "STATIC", "BadHello",
           "Handed", "Options", "Relay", "main"]

log = logging.getLogger("agent_bridge.mcp")

JOIN_BEFORE_SERVING = 10.0  # seconds the relay waits for the broker before serving the host anyway


class Relay:
    """The pump and its wiring: host lines to the broker, the broker's lines to the host, each
    decision handed to its part. One lock (`cond`) for the parts' state; a second condition on it
    (`deadlines`) wakes only the thread that answers requests no broker took in time, when a
    request starts waiting or the broker turns out unreachable, not at every answer."""

    answer_key = staticmethod(answers.answer_key)

    def __init__(self, options: Options, out_fd: int) -> None:
        self.options = options
        # `with self.lock` on the hot path, not `with self.cond`: the same lock, without the
        # Condition's Python-level __enter__ and __exit__ (two calls each, per line).
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.deadlines = threading.Condition(self.lock)
        self.out = HostOutput(out_fd, lambda: exit_now(0))  # the host's stdout
        # Held from writing a line that shows messages to reporting it written: the host may read
        # the line and close stdin at once, and the "eof" must not reach the broker first (it
        # stops reading there, and the report would be lost with this process); nor may a cancel
        # that crossed the line (the broker would acknowledge a result the host ignored).
        self.reporting = threading.Lock()
        self.showing_write = ShowingWrite()  # from writing such a line to noting it (Alone's too)
        self.fault: Fault = no_fault  # test-only (common.faults): set by main
        self.link: Link | None = None
        self.joined = False  # a broker answered this relay's hello at least once
        self.session_id: str | None = None
        self.secret: str | None = None  # this session's resume secret: never logged, never shown
        self.keeper = Keeper()
        self.replay = Replay()
        self.requests = Requests()
        self.shown = Shown(options.home)  # what this relay holds and wrote, and the ledger
        self.alone = Alone(self, options.agent)
        self.wanted = threading.Event()  # the host asked what only a broker answers (connector.START_GRACE)
        self.pump: Pump | None = None  # the one-thread pump, if main runs one (POSIX)

    # --- the host's side ----------------------------------------------------------------

    def write_out(self, line: str) -> None:
        """One line to the host's stdout (after the lines buffered before it); returns once the
        pipe has all of it."""
        self.out.write(line)

    def flush_out(self) -> None:
        """The broker's lines buffered (`to_host`) to the host."""
        answered = self.out.flush()
        if answered:
            with self.lock:
                self.requests.answering -= answered
                if self.pump is None:  # with a pump nothing waits on `cond` for answers (wait_for)
                    self.cond.notify_all()

    def on_host_line(self, line: str, more: bool = False) -> None:
        """One line from the host; `more`: others read with it follow at once (what goes to the
        broker is sent with the last of them)."""
        self.take_host_line(line, more)
        if not more:
            self.flush()

    def take_host_line(self, line: str, more: bool) -> None:
        try:
            message = jsonlimit.loads(line)
        except jsonlimit.TooDeep as exc:  # answered here: parsing it anywhere would recurse
            self.invalid_request(jsonlimit.members(line) or {}, str(exc))
            return
        except ValueError:
            message = None
        if isinstance(message, dict) and "method" in message and not isinstance(message["method"], str):
            self.invalid_request(message, "method must be a string")
            return
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            self.forward(line, more)  # the broker's MCP server answers what is malformed
            return
        method = message["method"]
        if "id" not in message:
            self.on_notification(line, method, message, more)
            return
        request = request_of(message, line)
        with self.lock:
            self.replay.host_request(method, message)
            link = self.link
            if link is not None:
                self.requests.forward(request)
        if link is not None:
            self.send_line(link, line, more)
            return
        self.alone.serve(request, message)

    def on_notification(self, line: str, method: str, message: dict[str, Any], more: bool = False) -> None:
        if method == "notifications/cancelled" and self.reporting.acquire(timeout=ACK_FLUSH_AT_EXIT):
            # A result the host read (the one a cancel can cross) is reported written, and
            # noted as shown, before the cancel goes on: the broker sees them in that order.
            self.reporting.release()
        with self.lock:
            self.replay.host_notification(method)
            if method == "notifications/cancelled":
                key = cancelled_key(message)
                self.shown.take_back(key, self.session_id)
                # Never sent to a next broker, nor waited for: the host expects no answer, and
                # one would show messages to a host that ignores it (their acknowledgement would
                # lose them). One never sent is never answered.
                if self.requests.cancel(key):
                    return
        self.forward(line, more)

    def invalid_request(self, message: dict[str, Any], problem: str) -> None:
        line = answers.invalid_request(message, problem)
        if line is None:
            log.warning("ignored a notification from the host: %s", problem)
        else:
            self.write_out(line)

    def forward(self, line: str, more: bool = False) -> None:
        with self.lock:
            link = self.link
        if link is not None:
            self.send_line(link, line, more)

    def send_line(self, link: Link, line: str, more: bool) -> None:
        """A host's line to the broker (`more`: with the next frames)."""
        try:
            link.queue_line(line)
            if not more:
                link.flush()
        except (OSError, protocol.ProtocolError) as exc:
            self.broken(link, exc)

    def answer_unreachable(self, requests: list[Request], reason: str) -> None:
        """Requests no broker will carry out: each answered with `reason` (a tool error for a
        tool call, else a JSON-RPC error)."""
        for request in requests:
            if request.method == "tools/call":
                self.write_out(self.alone.static.tool_error(request.rid, request.tool or "", reason))
            else:
                self.write_out(answers.answer(request.rid, error={"code": INTERNAL_ERROR, "message": reason}))

    def keeper_changed(self) -> None:
        """Called under `cond`: the keeper's news (refused, a start failed) for those waiting."""
        self.cond.notify_all()
        self.deadlines.notify_all()

    def send(self, link: Link, frames: Sequence[RelayFrame], queue: bool = False) -> None:
        """Frames to the broker (`queue`: with the next ones); a broken connection is the
        reading thread's to handle."""
        try:
            if queue:
                link.queue(frames)
            else:
                link.send(frames)
        except (OSError, protocol.ProtocolError) as exc:
            self.broken(link, exc)

    def flush(self) -> None:
        """What was queued for the broker, sent."""
        with self.lock:
            link = self.link
        if link is not None:
            try:
                link.flush()
            except (OSError, protocol.ProtocolError) as exc:
                self.broken(link, exc)

    @staticmethod
    def broken(link: Link, exc: Exception) -> None:
        log.info("broker connection lost while sending: %s", exc)
        try:
            link.sock.shutdown(2)  # SHUT_RDWR: the reader sees the end and reconnects
        except (OSError, AttributeError):  # closed already; a named pipe has no shutdown
            pass

    # --- the broker's side --------------------------------------------------------------

    def run(self) -> None:
        connector.keep_connected(self, self.options.home)

    def join(self, socket_path: str) -> Link:
        """Connect and say hello (`mcp`): the broker serves this session from now on."""
        resume = {"id": self.session_id, "secret": self.secret} if self.session_id and self.secret else None
        with self.lock:
            acked, offered = self.shown.for_hello()
        link, hello = connector.hello(socket_path, protocol.request(
            1, "mcp", **self.options.hello(resume), acked=acked, offered=offered))
        session = hello.get("session") or {}
        with self.lock:
            if isinstance(session.get("id"), str):
                self.session_id = session["id"]
            if isinstance(hello.get("secret"), str):
                self.secret = hello["secret"]
            self.keeper.joined()
            frames: list[RelayFrame] = []
            if hello.get("wire") == protocol.LINES_WIRE:  # lines as bytes from now on, both ways
                frames.append(Wire(protocol.LINES_WIRE))
                link.raw_lines = True
            frames += self.replay_frames(acked, offered)
            self.send(link, frames)  # before any host line: the new broker's MCP session first
            self.link, self.joined = link, True
            self.cond.notify_all()
        return link

    def replay_frames(self, acked: list[str], offered: list[str]) -> list[RelayFrame]:
        """What a new broker needs before the host's next line (its hello carried `acked` and
        `offered`, which it recorded before it answered): the rest of the acknowledgements and
        offers kept while none answered, the replay of the host's `initialize` and what followed
        it (their answers dropped); then the requests that wait for it. Called under `cond`."""
        frames = self.shown.joined(acked, offered, time.monotonic(), self.session_id)
        for line in self.replay.lines():
            frames += line_frames(line)
        for request in self.requests.send_waiting():
            frames += line_frames(request.line)
        return frames

    def serve_link(self, link: Link) -> None:
        """The broker's frames to their handlers until the connection ends, then what was in
        flight on it settled: by the pump (POSIX; this waits meanwhile), or on this thread."""
        if self.pump is not None and hasattr(link.sock, "setsockopt"):  # a socket, not a named pipe
            self.pump.serve(link)
        else:
            read_here(self, link)

    def on_frames(self, link: Link, frames: list[dict[str, Any]], flush: bool = True) -> None:
        """Each push (ipc.frames.read_push) to its handler (PUSH_HANDLERS); one this relay has
        no use for is skipped. `flush`: the lines they made, written to the host."""
        for frame in frames:
            push = read_push(frame)
            handler = PUSH_HANDLERS.get(type(push))
            if handler is not None:
                handler(self, link, push)
        if flush:
            self.flush_out()

    def end_link(self, link: Link) -> None:
        self.flush_out()
        link.close()
        self.lost(link)

    def lost(self, link: Link) -> None:
        """The connection ended: what was in flight on it is sent again to the next broker if
        doing it twice changes nothing, else answered with an error saying it may have been
        done."""
        with self.lock:
            if self.link is link:
                self.link = None
            link.ended.set()
            unsure = self.requests.lost(time.monotonic())
            self.replay.lost()
            self.shown.keep_written(self.session_id)
            self.keeper_changed()
        for request in unsure:
            tool = request.tool or "decide"
            self.write_out(self.alone.static.tool_error(request.rid, tool, (
                f"the broker connection was lost during {tool}; it may or may not have been recorded: "
                f"{tools.unsure_advice(tool)}"
            )))

    # --- the whole process --------------------------------------------------------------

    def wait_for(self, done: Callable[[], bool], timeout: float) -> bool:
        """Until `done()` (called under the lock) or `timeout`: whether it is done. The pump, if
        any, serves the broker meanwhile: this is the main thread."""
        if self.pump is not None:
            return self.pump.wait_for(done, timeout)
        with self.lock:
            return self.cond.wait_for(done, timeout)

    def wait_joined(self, timeout: float) -> None:
        """Until a broker answered, or its start failed or it refused us, or `timeout`."""
        with self.lock:
            self.cond.wait_for(lambda: self.joined or self.keeper.known, timeout)

def on_identity(relay: Relay, link: Link, push: Identity) -> None:
    sid = push.session.get("id")
    if isinstance(sid, str):
        relay.session_id = sid


def on_held(relay: Relay, link: Link, push: Held) -> None:
    with relay.lock:
        if "id" not in push.message:
            return
        if push.again:  # its result was cancelled: not shown, first in line
            relay.shown.showing.again(push.message)
        else:
            relay.shown.showing.arrive(push.message, reack=False)


def on_acked(relay: Relay, link: Link, push: Acked) -> None:
    with relay.lock:  # recorded by the broker (here or by a Stop hook)
        relay.shown.showing.elsewhere(push.ids)
        relay.shown.save_if_kept(relay.session_id)


def on_line(relay: Relay, link: Link, push: Line) -> None:
    line = link.parts.add(push)
    if line is not None:
        to_host(relay, link, line, push)


def to_host(relay: Relay, link: Link, line: str, incoming: Line) -> None:
    """One of the broker's lines to the host: an answer is written with the lines read with it
    (Relay.flush_out); one that shows messages (`seq`) at once, then noted shown and reported
    written."""
    key = relay.answer_key(line)
    answered: Request | None = None
    if key is not None:
        with relay.lock:
            if relay.replay.swallowed(key):
                return
            answered = relay.requests.answered(key)  # `end` waits for it to be written
            if answered is not None:
                relay.replay.answered(answered.method)
    if incoming.seq is None:  # written with the lines read with it (flush_out)
        relay.out.buffer(line, answered is not None)
        return
    try:
        with relay.showing_write.around(), relay.reporting:
            relay.write_out(line)
            relay.fault("relay:after-write")
            with relay.lock:  # reported below; until the broker confirms it recorded them
                relay.shown.showing.shown_directly(key, list(incoming.ids), reported=True)
            try:
                link.send([Written(incoming.seq)])
            except (OSError, protocol.ProtocolError):  # the next broker gets them (lost)
                pass
    finally:
        if answered is not None:
            with relay.lock:
                relay.requests.written()
                if relay.pump is None:
                    relay.cond.notify_all()


# What the relay does with each push it uses (Relay.on_frames).
PUSH_HANDLERS: dict[type, Callable[[Relay, Link, Any], None]] = {
    Identity: on_identity,
    Held: on_held,
    Acked: on_acked,
    Line: on_line,
}


class Handed(Protocol):
    """What relay_quick answered and read before the relay ran in its process."""

    init: dict[str, object] | None  # the host's initialize, answered with a result
    initialized: bool  # the host sent notifications/initialized
    lines: list[bytes]  # complete lines read and not handled
    rest: bytes  # the start of a line not complete yet


def take_handed(relay: Relay, host_input: HostInput, handed: Handed) -> None:
    """The relay goes on from where relay_quick stopped: the `initialize` it answered is the
    host's, replayed to each broker that joins (as one the relay answered alone), and the lines
    it read and did not handle are the next host input."""
    with relay.lock:
        if handed.init is not None:
            relay.replay.host_request("initialize", dict(handed.init))
            relay.replay.answered("initialize")
        if handed.initialized:
            relay.replay.host_notification("notifications/initialized")
    host_input.pending.extend(handed.lines)
    host_input.rest = handed.rest


def command(ns: argparse.Namespace, handed: Handed | None = None) -> int:
    """`agent-bridge mcp`, from the command line or relay.quick: the home folder checked before
    anything else (the host should hear about a bad folder at once), then the relay."""
    # Hosts end their MCP servers with SIGINT, then SIGTERM; one that arrives while the relay
    # still starts ends it as quietly as one that arrives later (exit 0, no traceback).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: os._exit(0))
    try:
        paths.check_home(paths.home())
    except paths.HomeError as exc:
        print(f"agent-bridge mcp: {exc}", file=sys.stderr)
        return 1
    try:
        paths.writable_home(paths.home())
    except OSError as exc:
        print(f"agent-bridge mcp: {exc.strerror or exc}", file=sys.stderr)
        return 1
    # A session's relay started by relay.router: the host's handshake, answered by the router.
    # Taken out of the environment: a broker or job this process starts is no such relay.
    child = os.environ.pop(router.CHILD_ENV, None)
    if child is not None:
        return main(ns, handed or router.Handshake.read(child), shared=True)
    host = hosts.by_name(ns.agent or "")
    if host is not None and host.sessions_per_server and not ns.job and not ns.host_session_id:
        return router.main({"agent": ns.agent, "name": ns.name, "project": ns.project})
    return main(ns, handed)


def main(ns: argparse.Namespace, handed: Handed | None = None, *, shared: bool = False) -> int:
    # Hosts end their MCP servers with SIGINT, then SIGTERM: end now. Whatever was not written
    # to the host stays unacknowledged in the broker; what was, and the broker has not confirmed
    # recording, goes to the ledger first (Relay.keep_written_at_exit), once there is a relay.
    signal.signal(signal.SIGINT, lambda *_: exit_now(0))
    signal.signal(signal.SIGTERM, lambda *_: exit_now(0))
    try:
        options = options_from(ns)
        fault = fault_injector()
    except (domain.InputError, ValueError) as exc:  # ValueError: AGENT_BRIDGE_FAULT (tests only)
        print(f"agent-bridge mcp: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the state folder: someone else's, or one we cannot create or write
        print(f"agent-bridge mcp: {exc.strerror or exc}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="agent-bridge mcp: %(message)s")
    # fd 1 is the host's: moved to a private descriptor, with fd 1 pointed at stderr, so stray
    # output of this process or its children never reaches the host.
    out_fd = os.dup(1)
    os.set_inheritable(out_fd, False)
    os.dup2(2, 1)
    relay = Relay(options, out_fd)
    relay.fault = fault
    if shared:  # the host's stdout is relay.router's and its other sessions' too
        relay.out.share()
    host_input = HostInput(0)
    if SIGNAL_MASKS:  # POSIX: select watches the host's pipe as well as the socket
        relay.pump = Pump(relay, host_input, connector.KEEPALIVE_INTERVAL)
    if handed is not None:
        take_handed(relay, host_input, handed)

    def leave() -> None:
        leaving.keep_written_at_exit(relay, host_input.unread())
        exit_now(0)

    for signum in LEAVING_SIGNALS:
        signal.signal(signum, host_input.deferring(leaving.on_signal(relay, leave)))

    def run() -> None:
        try:
            relay.run()
        except BadHello as exc:  # the broker refused this session's hello as bad input (say, --name)
            print(f"agent-bridge mcp: {exc}", file=sys.stderr)
            exit_now(2)

    with signals_held():  # inherited by these threads: the signals reach the main thread only
        threading.Thread(target=run, name="broker", daemon=True).start()
        threading.Thread(target=relay.alone.expire_waiting, name="waiting", daemon=True).start()
    # Join the bridge before answering the host, so a session whose MCP server is ready is also
    # connected (a decide recorded right after sees it); a broker that cannot be reached in time
    # does not hold the host back: tools say so until it is.
    if connector.broker_socket(options.home) is not None:  # none running: see connector.START_GRACE
        relay.wait_joined(JOIN_BEFORE_SERVING)
    if relay.pump is not None:
        batched()  # this thread only, now that the others run: see there
        relay.pump.run()
    else:
        for line in host_input.lines():
            if line is None:  # the lines read together are handled: what they make goes to the broker
                relay.flush()
            else:
                relay.on_host_line(line, more=True)
    leaving.end(relay)
    exit_now(0)


def exit_now(code: int) -> NoReturn:
    """Exit now, from any thread: what this process wrote is flushed first; what it did not
    write was never reported written."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

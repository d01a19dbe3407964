"""`agent-bridge mcp`: the stdio process of one agent session (SPEC §5), standard library only.

The host starts one per session. It relays the host's JSON-RPC lines to the broker, which serves
the MCP protocol itself (daemon.mcp_host), and writes the broker's lines to the host's stdout. It
imports neither trio nor the MCP SDK nor pydantic, like the hooks: a session costs a small
Python process, and the host's start does not wait for those imports.

What only this process can know or do stays here: who its host is (the ancestor chain, the
environment, the flags: `Options.hello`), starting the broker when none answers, reconnecting
with backoff, and acknowledging only what it wrote: a line that shows messages is reported
"written" to the broker after its bytes are in the host's pipe, or, with no broker to tell, kept
in the ledger file (agent_bridge.ledger) for the next one. With no broker at all, `initialize`,
`tools/list` and `ping` are answered from data generated from the real server
(`mcp_static.json`, written by `python -m agent_bridge.daemon.mcp_host`), and tool calls wait
for the broker, then get the reason it is not there. Across a broker restart it replays the
host's `initialize` to the new broker and drops that answer; a request in flight when the
connection broke is sent again if doing it twice changes nothing, and otherwise answered with
an error saying it may or may not have been carried out: nothing is answered twice.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from agent_bridge import domain, hosts, jsonlimit, ledger, paths, procinfo, tools
from agent_bridge.core import showing
from agent_bridge.core.showing import Showing
from agent_bridge.ipc import blocking, peercred, protocol
from agent_bridge.ipc.frames import (
    EOF,
    PING,
    Acked,
    Held,
    Identity,
    Line,
    LineParts,
    Offered,
    RelayFrame,
    Written,
    line_frames,
    read_push,
    relay_frame,
)
from agent_bridge.ipc.protocol import Refused

log = logging.getLogger("agent_bridge.mcp")

CALL_TIMEOUT = 15.0  # a request waits this long for the broker to be reachable
BACKOFF_START, BACKOFF_MAX = 0.05, 2.0
RESTART_AFTER = 2.0  # broker unreachable this long: start one ourselves
# A broker that cannot start (a newer or corrupt database, a read-only folder) fails the same way
# each time: wait longer between tries, and stop after a few, so relays never respawn it forever.
# A refusal `up` marks permanent (paths.PERMANENT) is tried once, and again only once the files
# it depends on (paths.START_FILES) have changed.
START_BACKOFF_FIRST, START_ATTEMPTS = 0.5, 5
START_TIMEOUT = 30.0  # seconds `agent-bridge up --detach` may take
REFUSED_BACKOFF_START, REFUSED_BACKOFF_MAX = 0.5, 30.0  # another connection holds our host session id
JOIN_BEFORE_SERVING = 10.0  # seconds the relay waits for the broker before serving the host anyway
HELLO_TIMEOUT = 10.0  # seconds the broker may take to answer the relay's hello
KEEPALIVE_INTERVAL = 15.0  # the broker drops a connection silent for 45 s
ACK_FLUSH_AT_EXIT = 2.0  # seconds the broker gets to record the last acknowledgements when the host leaves
# Seconds the broker gets to answer what the host asked before it closed stdin (its MCP server
# stops reading at "eof", and an answer it has not written by then is never written).
ANSWERS_AT_EXIT = 5.0
READ_CHUNK = 1 << 16
SIGNAL_WAIT = 0.5  # seconds a signal's handler waits for another thread before it writes the ledger
UNREAD_MAX = 1 << 20  # bytes of unread host input looked through for cancels at a signal
# The head of a JSON-RPC answer as the SDK and mcp_fast serialize one: its id (a number or a
# string) and then its result or error (relay.answer_key).
ANSWER_HEAD = re.compile(
    r'\{"jsonrpc":"2\.0","id":(-?(?:0|[1-9]\d*)|"[^"\\]*(?:\\.[^"\\]*)*"),"(?:result|error)":'
)
REPLAY_ID = "agent-bridge-replay-{}"  # the id of a replayed request, whose answer is not the host's
STATIC = Path(__file__).with_name("mcp_static.json")

NOT_REACHABLE = "the agent-bridge broker is not reachable right now; it is being restarted, try again shortly"
INTERNAL_ERROR = -32603  # JSON-RPC 2.0
INVALID_REQUEST = -32600


@dataclass
class Options:
    agent: str
    project: str
    kind: str
    name: str | None
    host_session_id: str | None
    claude_session_id: str | None
    host: procinfo.Proc | None
    chain: list[procinfo.Proc]
    home: Path

    def hello(self, resume: dict[str, str] | None = None) -> dict[str, Any]:
        """The hello frame; `resume`: the session id and secret this process was given, so a
        reconnect gets exactly that session back (SPEC §3, identity without a host session id)."""
        return {
            "agent": self.agent,
            "project": self.project,
            "kind": self.kind,
            "name": self.name,
            "hostSessionId": self.host_session_id,
            "claudeSessionId": self.claude_session_id,
            "host": procinfo.host_json(self.host),
            "chain": [p.to_json() for p in self.chain],
            "pid": os.getpid(),
            "resume": resume,
        }


def options_from(ns: argparse.Namespace, env: dict[str, str] | os._Environ[str] | None = None) -> Options:
    env = os.environ if env is None else env
    host, chain = procinfo.current_host(env)
    agent = ns.agent
    if not agent:
        agent = (hosts.for_process(host.exe if host else "") or hosts.DEFAULT).name
    agent = domain.normalize_agent(agent)
    if ns.name is not None:
        domain.check_session_name(ns.name, what="--name")
    project = domain.normalize_folder(os.path.abspath(ns.project or os.getcwd()), what="--project")
    explicit = ns.host_session_id or env.get("AGENT_BRIDGE_HOST_SESSION_ID") or None
    chosen = hosts.by_name(agent)
    session_env = chosen.session_env if chosen else None  # where the host passes its own session id
    claude_env = (env.get(session_env) or None) if session_env else None
    return Options(
        agent=agent,
        project=project,
        kind="job" if ns.job else "interactive",
        name=ns.name,
        host_session_id=explicit,
        claude_session_id=claude_env,
        host=host,
        chain=chain,
        home=paths.writable_home(paths.home(env)),
    )


class BadHello(Exception):
    """The broker refused this session's hello as bad input (say, --name): fix it, do not retry."""


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


class Link:
    """One connection to the broker: frames out under one lock, frames in from one thread."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.alive = True
        self._send_lock = threading.Lock()
        self._decoder = protocol.FrameDecoder()
        self._ready: list[dict[str, Any]] = []
        self.parts = LineParts()  # a broker's line that comes in parts

    def send(self, frames: Sequence[RelayFrame]) -> None:
        self.send_json([relay_frame(f) for f in frames])

    def send_json(self, objs: list[dict[str, Any]]) -> None:
        data = b"".join([protocol.encode(obj) for obj in objs])
        with self._send_lock:
            self.sock.sendall(data)

    def receive(self) -> dict[str, Any] | None:
        """The next frame; None at end of stream. Raises TimeoutError after the socket's timeout."""
        while not self._ready:
            data = self.sock.recv(READ_CHUNK)
            if not data:
                return None
            self._ready.extend(self._decoder.feed(data))
        return self._ready.pop(0)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def cancelled_key(message: dict[str, Any]) -> str:
    """The request a host's `notifications/cancelled` names (showing.key: the key of its answer)."""
    params = message.get("params")
    return showing.key(params.get("requestId") if isinstance(params, dict) else None)


@dataclass
class Relay:
    options: Options
    out_fd: int
    # One lock for this state; two conditions on it: `cond` for most waits (a broker joined,
    # answers written at the end), `deadlines` for the thread that answers requests no broker
    # took in time, woken only when a request starts waiting or a broker turns out unreachable,
    # not by every answer (a thread switch per answer cost about a tenth of a send + inbox pair).
    lock: threading.RLock = field(default_factory=threading.RLock)
    cond: threading.Condition = field(init=False)
    deadlines: threading.Condition = field(init=False)
    out_lock: threading.Lock = field(default_factory=threading.Lock)
    # Held from writing a line that shows messages to reporting it written: the host may read
    # the line and close stdin at once, and the "eof" must not reach the broker first (it
    # stops reading there, and the report would be lost with this process); nor may a cancel
    # that crossed the line (the broker would acknowledge a result the host ignored).
    reporting: threading.Lock = field(default_factory=threading.Lock)
    link: Link | None = None
    joined: bool = False  # a broker answered this relay's hello at least once
    session_id: str | None = None
    secret: str | None = None  # this session's resume secret: never logged, never shown
    refused: str | None = None  # why the broker will not take this session now
    start_failure: str | None = None  # why the last broker we started could not start
    start_attempts: int = 0  # consecutive failed starts
    # After a permanent refusal: the identity of the files it depends on then; no start is tried
    # while they are the same.
    start_blocked: tuple[Any, ...] | None = None
    next_start: float = 0.0  # monotonic time before which no new start is tried
    init: dict[str, Any] | None = None  # the host's initialize request, replayed to a new broker
    init_answered: bool = False
    initialized: bool = False  # the host sent notifications/initialized
    level: dict[str, Any] | None = None  # the host's last logging/setLevel params
    forwarded: dict[str, Request] = field(default_factory=dict)  # sent on `link`, not answered yet
    answering: int = 0  # answers taken off `forwarded` and not yet written to the host
    waiting: list[Request] = field(default_factory=list)  # to send once a broker answers
    swallow: set[str] = field(default_factory=set)  # answers to replayed requests: not the host's
    replays: int = 0
    # What this relay holds (the session's inbox, for when no broker answers), wrote to the host
    # and the broker has not confirmed recording: its half of the showing machine, under `cond`.
    # The ledger file is that machine's unconfirmed part (save_ledger).
    showing: Showing = field(default_factory=Showing)
    ledger_peer: str | None = None  # the session whose ledger file this relay keeps now
    static: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.cond = threading.Condition(self.lock)
        self.deadlines = threading.Condition(self.lock)

    # --- the host's side ----------------------------------------------------------------

    def write_out(self, line: str) -> None:
        """One line to the host's stdout; returns once the pipe has all of it."""
        view = memoryview((line + "\n").encode("utf-8", "surrogatepass"))
        with self.out_lock:
            try:
                while view:
                    view = view[os.write(self.out_fd, view):]
            except OSError:  # the host closed its end: the session is over
                exit_now(0)

    def answer(self, rid: Any, *, result: Any = None, error: dict[str, Any] | None = None) -> None:
        body = {"error": error} if error is not None else {"result": result}
        self.write_out(json.dumps({"jsonrpc": "2.0", "id": rid, **body}, ensure_ascii=False))

    def tool_error(self, rid: Any, tool: str, text: str) -> None:
        template = self.static_answers()["toolError"]
        marks, result = template["marks"], template["result"]
        filled = [dict(c, text=c["text"].replace(marks["tool"], tool).replace(marks["reason"], text))
                  for c in result["content"]]
        self.answer(rid, result=dict(result, content=filled))

    def static_answers(self) -> dict[str, Any]:
        if self.static is None:
            self.static = json.loads(STATIC.read_text(encoding="utf-8"))
        return self.static

    def on_host_line(self, line: str) -> None:
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
            self.forward_raw(line)  # the broker's MCP server answers what is malformed
            return
        method = message["method"]
        if "id" not in message:
            self.on_notification(line, method, message)
            return
        params = message.get("params")
        tool = params.get("name") if method == "tools/call" and isinstance(params, dict) else None
        tool = tool if isinstance(tool, str) else None
        arguments = params.get("arguments") if isinstance(params, dict) else None
        resend = method != "tools/call" or tools.idempotent(tool, arguments)
        wait = arguments.get("wait_seconds") if isinstance(arguments, dict) else None
        waits = tool is not None and isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0
        request = Request(showing.key(message["id"]), message["id"], line, method, tool, resend=resend,
                          waits=waits)
        if method == "initialize":
            self.init = message
        elif method == "logging/setLevel":
            self.level = params if isinstance(params, dict) else None
        with self.cond:
            link = self.link
            if link is not None:
                self.forwarded[request.key] = request
        if link is not None:
            self.send(link, line_frames(line))
            return
        self.serve_alone(request, message)

    def on_notification(self, line: str, method: str, message: dict[str, Any]) -> None:
        if method == "notifications/cancelled" and self.reporting.acquire(timeout=ACK_FLUSH_AT_EXIT):
            # A result the host read (the one a cancel can cross) is reported written, and
            # noted as shown, before the cancel goes on: the broker sees them in that order.
            self.reporting.release()
        with self.cond:
            if method == "notifications/initialized":
                self.initialized = True
            elif method == "notifications/cancelled":
                key = cancelled_key(message)
                self.take_back(key)
                # Never sent to a next broker, nor waited for: the host expects no answer, and
                # one would show messages to a host that ignores it (their acknowledgement would
                # lose them).
                self.forwarded.pop(key, None)
                if any(r.key == key for r in self.waiting):  # never sent: never answered
                    self.waiting = [r for r in self.waiting if r.key != key]
                    return
            link = self.link
        if link is not None:
            self.send(link, line_frames(line))

    def invalid_request(self, message: dict[str, Any], problem: str) -> None:
        """JSON-RPC "Invalid Request" for a line this relay will not pass on (`message`: its
        top-level members, as far as they could be read): answered with the request's id when
        it has a usable one, else with null (JSON-RPC 2.0); a notification gets no answer."""
        rid = message.get("id")
        if "id" not in message and isinstance(message.get("method"), str):
            log.warning("ignored a notification from the host: %s", problem)
            return
        if isinstance(rid, bool) or not isinstance(rid, (int, str)) or protocol.unstorable_text(rid):
            rid = None  # not an id JSON-RPC allows, or one we could not write back as UTF-8
        self.answer(rid, error={"code": INVALID_REQUEST, "message": f"Invalid Request: {problem}"})

    def forward_raw(self, line: str) -> None:
        with self.cond:
            link = self.link
        if link is not None:
            self.send(link, line_frames(line))

    def serve_alone(self, request: Request, message: dict[str, Any]) -> None:
        """A request while no broker answers: what needs no broker is answered from the
        generated data; the rest waits for one, up to CALL_TIMEOUT."""
        rid = message["id"]
        static = self.static_answers()
        if request.method == "initialize":
            params = message.get("params")
            wanted = params.get("protocolVersion") if isinstance(params, dict) else None
            answers = static["initialize"]["claude" if self.options.agent == "claude" else "other"]
            answer = answers.get(wanted) if isinstance(wanted, str) else None
            answer = answer or answers["unknown"]
            with self.cond:  # a broker joining from now on is handed this initialize (replay_frames)
                alone = self.link is None
                if alone:
                    self.init_answered = "result" in answer
            if alone:
                self.answer(rid, result=answer.get("result"), error=answer.get("error"))
                return
            # one joined since on_host_line looked, without this initialize: forwarded below
        if request.method == "tools/list":
            self.answer(rid, result=static["tools/list"])
            return
        if request.method in ("ping", "logging/setLevel"):  # a level is replayed to the broker later
            self.answer(rid, result={})
            return
        if request.tool == "inbox" and self.inbox_alone(rid, message.get("params")):
            return
        reason = ""
        with self.cond:
            link = self.link
            if link is not None:  # a broker answered meanwhile
                self.forwarded[request.key] = request
            elif request.method == "tools/call" and (
                self.refused is not None or self.start_failure is not None
            ):
                reason = self.unreachable()  # no use waiting
            else:
                request.deadline = time.monotonic() + CALL_TIMEOUT
                self.waiting.append(request)
                self.cond.notify_all()
                self.deadlines.notify_all()
                return
        if link is not None:
            self.send(link, line_frames(request.line))
        else:
            self.tool_error(rid, request.tool or "", reason)

    def inbox_alone(self, rid: Any, params: Any) -> bool:
        """`inbox` with no broker, from the messages the broker's inbox held for this session
        when it went away: offered (in the ledger) before the write, acknowledged (in the
        ledger) after it, as the broker would. False (the call waits for a broker instead) when
        nothing is held or the arguments are not plainly valid: the broker judges those."""
        arguments = params.get("arguments") if isinstance(params, dict) else None
        arguments = {} if arguments is None else arguments
        if not isinstance(arguments, dict) or set(arguments) - {"wait_seconds", "peek"}:
            return False
        peek = arguments.get("peek", False)
        wait = arguments.get("wait_seconds", 0)
        if not isinstance(peek, bool) or isinstance(wait, bool) or not isinstance(wait, (int, float)):
            return False
        static = self.static_answers()
        by = showing.key(rid)
        with self.cond:
            if self.link is not None or not self.showing.has_queued():
                return False
            messages = self.showing.queued(static["inboxIdsMax"])
            ids = [str(m["id"]) for m in messages]
            if not peek:
                messages = self.showing.offer(by, ids)
                self.save_ledger()  # offered before the write: shown again, they are repeats
        template = static["inboxResult"]
        mark = template["marks"]["messages"]
        text = json.dumps(messages, ensure_ascii=False)
        content = [dict(c, text=text) if c["text"] == mark else c for c in template["result"]["content"]]
        self.answer(rid, result=dict(template["result"], content=content))
        if not peek:
            with self.cond:
                self.showing.on_its_way(by)
                self.showing.written(by, ids, time.monotonic())
                self.save_ledger()
                if self.link is not None:  # a broker answered meanwhile, after its hello
                    self.send(self.link, self.hand_over_acks())
        return True

    def hand_over_acks(self) -> list[RelayFrame]:
        """Called under `cond` with a link up: the acknowledgements kept while no broker
        answered, as "acked" frames; they wait for its confirmation like written ones."""
        due = self.showing.take_acks(time.monotonic())
        return [Acked(due[i:i + ledger.IDS_MAX]) for i in range(0, len(due), ledger.IDS_MAX)]

    def unreachable(self) -> str:
        """Why a tool call gets no broker (today's reason, as the tool error the agent reads)."""
        if self.refused is not None:
            return f"agent-bridge: this session is not connected: {self.refused}"
        if self.start_failure is not None:
            if self.start_blocked is not None:
                return (
                    f"the agent-bridge broker cannot start: {self.start_failure}; gave up until that "
                    f"changes: "
                    "fix it, then run `agent-bridge up` (this session connects once it runs)"
                )
            if self.start_attempts >= START_ATTEMPTS:
                return (f"the agent-bridge broker cannot start: {self.start_failure}; gave up after "
                        f"{self.start_attempts} attempts: fix that, then run `agent-bridge up` (this session "
                        "connects once it runs)")
            return f"the agent-bridge broker cannot start: {self.start_failure}; trying again"
        return NOT_REACHABLE

    def expire_waiting(self) -> None:
        """Requests that waited CALL_TIMEOUT for a broker, or whose wait has a known end now
        (the broker cannot start, or will not take this session): answered with the reason."""
        while True:
            with self.cond:
                now = time.monotonic()
                known = self.refused is not None or self.start_failure is not None
                due = [r for r in self.waiting if r.deadline <= now or (known and r.method == "tools/call")]
                self.waiting = [r for r in self.waiting if all(r is not d for d in due)]
                reason = self.unreachable()
                if not due:
                    wake = min((r.deadline for r in self.waiting), default=now + 3600)
                    self.deadlines.wait(max(0.0, wake - now))
                    continue
            self.answer_unreachable(due, reason)

    def answer_unreachable(self, requests: list[Request], reason: str) -> None:
        """Requests no broker will carry out: each answered with `reason` (a tool error for a
        tool call, else a JSON-RPC error)."""
        for request in requests:
            if request.method == "tools/call":
                self.tool_error(request.rid, request.tool or "", reason)
            else:
                self.answer(request.rid, error={"code": INTERNAL_ERROR, "message": reason})

    def send(self, link: Link, frames: Sequence[RelayFrame]) -> None:
        """Frames to the broker; a broken connection is the reading thread's to handle."""
        try:
            link.send(frames)
        except (OSError, protocol.ProtocolError) as exc:
            log.info("broker connection lost while sending: %s", exc)
            try:
                link.sock.shutdown(2)  # SHUT_RDWR: the reader sees the end and reconnects
            except (OSError, AttributeError):  # closed already; a named pipe has no shutdown
                pass

    # --- the broker's side --------------------------------------------------------------

    def run(self) -> None:
        backoff = BACKOFF_START
        refused_wait = REFUSED_BACKOFF_START
        down_since: float | None = None
        while True:
            socket_path = self.broker_socket()
            now = time.monotonic()
            if socket_path is None or (down_since is not None and now - down_since > RESTART_AFTER):
                if self.start_attempts < START_ATTEMPTS and now >= self.next_start and not self.start_held():
                    self.start_broker()
                socket_path = self.broker_socket()
            if socket_path is not None:
                try:
                    link = self.join(socket_path)
                except (Refused, peercred.NotOurBroker) as exc:  # wait: neither changes by retrying at once
                    with self.cond:
                        if self.refused is None:
                            log.warning("this session cannot connect to the broker yet: %s", exc)
                        self.refused = str(exc)
                        self.cond.notify_all()
                        self.deadlines.notify_all()
                    time.sleep(refused_wait)
                    refused_wait = min(refused_wait * 2, REFUSED_BACKOFF_MAX)
                    down_since = None  # the broker is up: nothing to restart
                    continue
                except (OSError, protocol.ProtocolError) as exc:
                    log.info("broker not reachable: %s", exc)
                else:
                    down_since, backoff, refused_wait = None, BACKOFF_START, REFUSED_BACKOFF_START
                    self.serve_link(link)
            if down_since is None:
                down_since = time.monotonic()
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def broker_socket(self) -> str | None:
        record = paths.running_broker(self.options.home)
        sock = record.get("socket") if record else None
        return sock if isinstance(sock, str) else None

    def start_broker(self) -> None:
        """Start a detached broker; racing relays are safe: the broker lock admits one.

        A start that fails while no other broker holds the lock is a failure of this home (its
        database, its folder): remembered with the reason `up` gave, for tool errors, and tried
        again only after a growing delay, at most START_ATTEMPTS times in a row."""
        import subprocess

        log.info("no broker answering; starting one")
        files_before = paths.start_files_identity(self.options.home)  # what a permanent refusal was about
        try:
            done = subprocess.run(
                [sys.executable, "-m", "agent_bridge", "up", "--detach"],
                check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=START_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            return  # slow: the run loop connects once it runs
        said = done.stderr.decode("utf-8", "replace")
        won_elsewhere = paths.PERMANENT not in said and paths.lock_holder(self.options.home) is not None
        if done.returncode == 0 or paths.ALREADY_RUNNING in said or won_elsewhere:
            # started, or another relay's broker won the lock (it may still be starting, so the
            # lock can look free for an instant): the run loop connects. A permanent refusal is
            # ours whoever holds the lock now (another relay's `up`, refused the same way).
            return
        reason = said.strip().splitlines()
        text = reason[-1] if reason else f"`agent-bridge up` exited with status {done.returncode}"
        with self.cond:
            self.start_failure = text.removeprefix("agent-bridge up: ")
            self.start_attempts += 1
            self.next_start = time.monotonic() + START_BACKOFF_FIRST * 2 ** (self.start_attempts - 1)
            if paths.PERMANENT in text:
                self.start_blocked = files_before
            self.cond.notify_all()
            self.deadlines.notify_all()
        if self.start_blocked is not None:
            log.error("the broker cannot start (%s); not trying again until %s changes", self.start_failure,
                      " or ".join(paths.START_FILES))
        elif self.start_attempts == START_ATTEMPTS:
            log.error(
                "the broker cannot start (%s); giving up after %d attempts",
                self.start_failure,
                START_ATTEMPTS,
            )
        else:
            log.warning("the broker cannot start: %s", self.start_failure)

    def start_held(self) -> bool:
        """Whether a permanent refusal still holds: the files it was about have not changed.
        Once they have, starting is tried again as if for the first time."""
        if self.start_blocked is None:
            return False
        if paths.start_files_identity(self.options.home) == self.start_blocked:
            return True
        with self.cond:
            self.start_blocked = None
            self.start_attempts, self.next_start = 0, 0.0
        return False

    def join(self, socket_path: str) -> Link:
        """Connect and say hello (`mcp`): the broker serves this session from now on."""
        resume = {"id": self.session_id, "secret": self.secret} if self.session_id and self.secret else None
        with self.cond:
            # What this relay showed and no broker recorded: the hello carries up to IDS_MAX ids,
            # recorded before the session's delivery starts; the rest follows it (replay_frames).
            acked = self.showing.due()[: ledger.IDS_MAX]
            offered = self.showing.unconfirmed()[0][: ledger.IDS_MAX - len(acked)]
        sock = blocking.connect(socket_path, HELLO_TIMEOUT)
        link = Link(sock)
        try:
            link.send_json(
                [protocol.request(1, "mcp", **self.options.hello(resume), acked=acked, offered=offered)]
            )
            while True:
                answer = link.receive()
                if answer is None:
                    raise ConnectionResetError("the broker closed the connection during hello")
                if answer.get("id") == 1:
                    break
        except BaseException:
            link.close()
            raise
        if not answer.get("ok"):
            link.close()
            err = answer.get("error") or {}
            if err.get("code") == "refused":
                raise Refused(str(err.get("message")))
            if err.get("code") == "bad_request":
                raise BadHello(str(err.get("message")))
            raise ConnectionRefusedError(str(err.get("message")))
        hello = answer.get("result") or {}
        session = hello.get("session") or {}
        sock.settimeout(KEEPALIVE_INTERVAL)
        with self.cond:
            if isinstance(session.get("id"), str):
                self.session_id = session["id"]
            if isinstance(hello.get("secret"), str):
                self.secret = hello["secret"]
            self.refused = self.start_failure = self.start_blocked = None
            self.start_attempts, self.next_start = 0, 0.0
            frames = self.replay_frames(acked, offered)
            self.send(link, frames)  # before any host line: the new broker's MCP session first
            self.link, self.joined = link, True
            self.cond.notify_all()
        return link

    def replay_frames(self, acked: list[str], offered: list[str]) -> list[RelayFrame]:
        """What a new broker needs before the host's next line (its hello carried `acked` and
        `offered`, which it recorded before it answered): the rest of the acknowledgements and
        offers kept while none answered, the host's `initialize`, `notifications/initialized`
        and log level (their answers dropped); then the requests that wait for it. Called under
        `cond`."""
        self.showing.reported(acked)
        self.showing.recorded(acked)
        carried = set(offered)
        rest = [mid for mid in self.showing.unconfirmed()[0] if mid not in carried]
        frames: list[RelayFrame] = [
            Offered(rest[i : i + ledger.IDS_MAX]) for i in range(0, len(rest), ledger.IDS_MAX)
        ]
        frames += self.hand_over_acks()
        self.save_ledger()  # what is left unconfirmed, if a ledger file is kept
        self.showing.forget_queued()  # the new broker pushes what is still unacknowledged
        if self.init is not None and self.init_answered:
            frames += self.replayed("initialize", self.init.get("params"))
            if self.initialized:
                frames += line_frames(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            if self.level is not None:
                frames += self.replayed("logging/setLevel", self.level)
        for request in self.waiting:
            self.forwarded[request.key] = request
            frames += line_frames(request.line)
        self.waiting = []
        return frames

    def replayed(self, method: str, params: Any) -> list[Line]:
        self.replays += 1
        rid = REPLAY_ID.format(self.replays)
        self.swallow.add(showing.key(rid))
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        return line_frames(json.dumps(message, ensure_ascii=False))

    def serve_link(self, link: Link) -> None:
        """Write the broker's lines to the host until the connection ends; then settle what
        was in flight on it. Each push (ipc.frames.read_push) goes to its handler
        (PUSH_HANDLERS); one this relay has no use for is skipped."""
        try:
            while True:
                try:
                    incoming = link.receive()
                except TimeoutError:
                    self.send(link, [PING])
                    continue
                if incoming is None:
                    break
                push = read_push(incoming)
                handler = PUSH_HANDLERS.get(type(push))
                if handler is not None:
                    handler(self, link, push)
        except (OSError, protocol.ProtocolError) as exc:
            log.info("broker connection lost: %s", exc)
        finally:
            link.close()
            self.lost(link)

    def on_identity(self, link: Link, push: Identity) -> None:
        sid = push.session.get("id")
        if isinstance(sid, str):
            self.session_id = sid

    def on_held(self, link: Link, push: Held) -> None:
        with self.cond:
            if "id" not in push.message:
                return
            if push.again:  # its result was cancelled: not shown, first in line
                self.showing.again(push.message)
            else:
                self.showing.arrive(push.message, reack=False)

    def on_acked(self, link: Link, push: Acked) -> None:
        with self.cond:  # recorded by the broker (here or by a Stop hook)
            self.showing.elsewhere(push.ids)
            if self.ledger_peer is not None:
                self.save_ledger()

    def on_line(self, link: Link, push: Line) -> None:
        line = link.parts.add(push)
        if line is not None:
            self.to_host(link, line, push)

    def to_host(self, link: Link, line: str, incoming: Line) -> None:
        key = self.answer_key(line)
        with self.cond:
            if key is not None and key in self.swallow:
                self.swallow.discard(key)
                return
            answered = self.forwarded.pop(key, None) if key is not None else None
            if answered is not None:
                self.answering += 1  # `end` waits for it to be written
                if answered.method == "initialize":
                    self.init_answered = True
        try:
            self.write_host_line(link, line, incoming, key)
        finally:
            if answered is not None:
                with self.cond:
                    self.answering -= 1
                    self.cond.notify_all()

    def write_host_line(self, link: Link, line: str, incoming: Line, key: str | None) -> None:
        seq = incoming.seq
        if seq is None:
            self.write_out(line)
            return
        with self.reporting:
            self.write_out(line)
            with self.cond:  # reported below; until the broker confirms it recorded them
                self.showing.shown_directly(key, list(incoming.ids), reported=True)
            try:
                link.send([Written(seq)])
            except (OSError, protocol.ProtocolError):  # the next broker gets them (lost)
                pass

    @staticmethod
    def answer_key(line: str) -> str | None:
        """The id a line from the broker answers, as JSON; None for a notification."""
        if '"method"' in line[:200] and '"id"' not in line[:200]:
            return None
        # An answer as the SDK and mcp_fast write it: the id read from its head, not the whole
        # line parsed (a `decisions` result is tens of KB). Any other shape is parsed below.
        head = ANSWER_HEAD.match(line)
        try:
            if head is not None:
                return showing.key(json.loads(head.group(1)))
            message = json.loads(line)
        except (ValueError, RecursionError):  # the broker's lines: not checked for depth (hot path)
            return None
        if not isinstance(message, dict) or "id" not in message or "method" in message:
            return None
        return showing.key(message["id"])

    def lost(self, link: Link) -> None:
        """The connection ended: what was in flight on it is sent again to the next broker if
        doing it twice changes nothing, else answered with an error saying it may have been
        done."""
        unsure = []
        with self.cond:
            if self.link is link:
                self.link = None
            link.alive = False
            again = []
            for request in self.forwarded.values():
                if not request.resend:
                    unsure.append(request)
                else:
                    request.deadline = time.monotonic() + CALL_TIMEOUT
                    again.append(request)
            self.waiting[:0] = again
            self.forwarded.clear()
            self.swallow.clear()
            self.keep_written()
            self.cond.notify_all()
            self.deadlines.notify_all()
        for request in unsure:
            tool = request.tool or "decide"
            self.tool_error(request.rid, tool, (
                f"the broker connection was lost during {tool}; it may or may not have been recorded: "
                f"{tools.unsure_advice(tool)}"
            ))

    def take_back(self, key: str) -> None:
        """Called under `cond`: the host cancelled request `key`. If its result was already
        written, the cancel crossed it and the host ignored it: its messages are not
        acknowledged from here (not kept for a next broker, not in the ledger). The broker,
        told of the cancel too, shows them again as repeats; if it never hears of it, they are
        still offered and unacknowledged there, so the next session shows them as repeats."""
        _, again = self.showing.cancel(key)
        if again and self.ledger_peer is not None:
            self.save_ledger()

    def keep_written(self) -> None:
        """Called under `cond`: what was shown and maybe never recorded, for the next broker,
        and in the ledger meanwhile."""
        self.showing.lost()
        if any(self.showing.unconfirmed()):
            self.save_ledger()

    def keep_written_at_exit(self, unread: bytes) -> None:
        """A signal ends the process now: `keep_written`, as when the host closes stdin and the
        broker does not confirm in time, once the cancels in the host's `unread` input (sent
        before the signal, not read yet) are taken into account. The handler runs on the main
        thread, which may hold `cond` (re-entrant) mid-change: at worst an id is missed and
        shown again, as a repeat; held by another thread, it is waited for only briefly, as is
        `reporting` (a line being written to the host is noted as shown once written)."""
        if self.reporting.acquire(timeout=SIGNAL_WAIT):  # a line the host may have read is noted first
            self.reporting.release()
        if self.cond.acquire(timeout=SIGNAL_WAIT):
            try:
                for line in unread.split(b"\n"):
                    if b"notifications/cancelled" in line:
                        try:
                            message = jsonlimit.loads(line)
                        except ValueError:  # (UnicodeDecodeError and TooDeep included)
                            continue
                        if isinstance(message, dict) and message.get("method") == "notifications/cancelled":
                            self.take_back(cancelled_key(message))
                self.keep_written()
            finally:
                self.cond.release()

    def save_ledger(self) -> None:
        """Called under `cond`: the machine's unconfirmed part (offered, or written and not
        confirmed recorded) in the ledger file, every id of it; none left: no file."""
        peer = self.session_id
        if peer is None:
            return
        if self.ledger_peer is not None and self.ledger_peer != peer:
            ledger.remove(self.options.home, self.ledger_peer)
        offered, acked = self.showing.unconfirmed()
        try:
            ledger.save(self.options.home, peer, offered, acked)
        except OSError as exc:
            log.warning("could not keep acknowledgements in %s: %s", self.options.home / ledger.FOLDER, exc)
        self.ledger_peer = peer if offered or acked else None

    # --- the whole process --------------------------------------------------------------

    def wait_joined(self, timeout: float) -> None:
        """Until a broker answered, or its start failed or it refused us, or `timeout`."""
        with self.cond:
            self.cond.wait_for(
                lambda: self.joined or self.start_failure is not None or self.refused is not None, timeout
            )

    def end(self) -> None:
        """The host closed stdin: what it asked before that is answered (up to ANSWERS_AT_EXIT;
        a request still waiting for a broker then gets the reason there is none), then the
        broker records what the host was shown, and closes. A call that waits (`inbox` with
        `wait_seconds`, say) is cancelled as if the host had cancelled it: nobody reads its
        answer now, so it shows and acknowledges nothing, and the relay need not wait for it."""
        with self.cond:
            waiting_calls = [r.rid for r in (*self.forwarded.values(), *self.waiting) if r.waits]
        for rid in waiting_calls:
            self.on_host_line(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                          "params": {"requestId": rid, "reason": "the host left"}}))
        with self.cond:
            self.cond.wait_for(
                lambda: not (self.forwarded or self.waiting or self.answering), ANSWERS_AT_EXIT
            )
            link = self.link
            unanswered, self.waiting = self.waiting, []
            reason = self.unreachable()
        self.answer_unreachable(unanswered, reason)
        if link is None:
            return
        if self.reporting.acquire(timeout=ACK_FLUSH_AT_EXIT):  # a line the host read is reported first
            self.reporting.release()
        self.send(link, [EOF])
        with self.cond:
            if not self.cond.wait_for(lambda: self.link is not link, ACK_FLUSH_AT_EXIT):
                self.keep_written()  # no answer in time: a broker that reads the ledger records them


# What the relay does with each push it uses (Relay.serve_link).
PUSH_HANDLERS: dict[type, Callable[[Relay, Link, Any], None]] = {
    Identity: Relay.on_identity,
    Held: Relay.on_held,
    Acked: Relay.on_acked,
    Line: Relay.on_line,
}


LEAVING_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # hosts end their MCP servers with these
SIGNAL_MASKS = hasattr(signal, "pthread_sigmask")  # POSIX


@contextmanager
def signals_held() -> Iterator[None]:
    """LEAVING_SIGNALS wait while the host's input changes hands (POSIX; Windows has no signal
    masks): their handler reads that input (HostInput.unread) and must find every line. Held
    by the main thread, which alone takes them: the relay's other threads start with them
    held (main), since Python runs a handler on the main thread whichever thread received it."""
    if not SIGNAL_MASKS:
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, LEAVING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class HostInput:
    """The host's lines on `fd`, decoded as the SDK decodes them (UTF-8, bad bytes replaced)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.current = b""  # the line being handled
        self.pending: deque[bytes] = deque()  # lines read and not handed over yet
        self.rest = b""  # the start of a line not complete yet

    def lines(self) -> Any:
        while True:
            with signals_held():  # a line is always in exactly one of current, pending, rest
                more = bool(self.pending)
                self.current = self.pending.popleft() if more else b""
            if more:
                if self.current.strip():
                    yield self.current.decode("utf-8", "replace")
                continue
            if SIGNAL_MASKS:  # wait with the signals open; the read itself does not wait then
                select.select([self.fd], [], [])
            with signals_held():  # the bytes read are in `pending` or `rest` before a handler runs
                chunk = os.read(self.fd, READ_CHUNK)
                if not chunk:
                    self.current, self.rest = self.rest, b""
                else:
                    *complete, self.rest = (self.rest + chunk).split(b"\n")
                    self.pending.extend(complete)
            if not chunk:
                if self.current.strip():
                    yield self.current.decode("utf-8", "replace")
                return

    def unread(self) -> bytes:
        """What the host wrote and was not handled to its end: the line being handled (a signal
        may have interrupted that), the lines read after it, and what has not been read yet (up
        to UNREAD_MAX, without waiting)."""
        data = bytearray(b"\n".join([self.current, *self.pending, self.rest]))
        try:  # polled, not made non-blocking: stdin may be a terminal this process shares
            while SIGNAL_MASKS and len(data) < UNREAD_MAX and select.select([self.fd], [], [], 0)[0]:
                chunk = os.read(self.fd, READ_CHUNK)
                if not chunk:
                    break
                data += chunk
        except OSError:  # closed
            pass
        return bytes(data)


def main(ns: argparse.Namespace) -> int:
    # Hosts end their MCP servers with SIGINT, then SIGTERM: end now. Whatever was not written
    # to the host stays unacknowledged in the broker; what was, and the broker has not confirmed
    # recording, goes to the ledger first (Relay.keep_written_at_exit), once there is a relay.
    signal.signal(signal.SIGINT, lambda *_: exit_now(0))
    signal.signal(signal.SIGTERM, lambda *_: exit_now(0))
    try:
        options = options_from(ns)
    except domain.InputError as exc:
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
    host_input = HostInput(0)

    def leave(*_: Any) -> None:
        relay.keep_written_at_exit(host_input.unread())
        exit_now(0)

    for signum in LEAVING_SIGNALS:
        signal.signal(signum, leave)

    def run() -> None:
        try:
            relay.run()
        except BadHello as exc:  # the broker refused this session's hello as bad input (say, --name)
            print(f"agent-bridge mcp: {exc}", file=sys.stderr)
            exit_now(2)

    with signals_held():  # inherited by these threads: the signals reach the main thread only
        threading.Thread(target=run, name="broker", daemon=True).start()
        threading.Thread(target=relay.expire_waiting, name="waiting", daemon=True).start()
    # Join the bridge before answering the host, so a session whose MCP server is ready is also
    # connected (a decide recorded right after sees it); a broker that cannot be reached in time
    # does not hold the host back: tools say so until it is.
    relay.wait_joined(JOIN_BEFORE_SERVING)
    for line in host_input.lines():
        relay.on_host_line(line)
    relay.end()
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

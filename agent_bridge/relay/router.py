"""`agent-bridge mcp` for a host whose one MCP server serves all its sessions (opencode: one
`opencode serve` process runs several sessions over one MCP server, which gets no session id):
a router in front of one relay per session.

The host's plugin adds the calling session's id to each agent-bridge tool call's arguments
(`common.tools.HOST_SESSION_ARGUMENT`, hosts.opencode_plugin). The router takes it out and hands
the call to that session's own relay, a child `agent-bridge mcp --host-session-id ID` started
at the session's first call: each session is its own connection to the broker, with its own
identity, messages and acknowledgements, exactly as one relay per session elsewhere. A call
without it (no plugin) goes to one relay without a host session id, which finds its session
as any MCP server does (by its host instance).

The router itself never joins the broker: it answers the handshake (`initialize`, `tools/list`,
`ping`) from the generated data (relay.answers.Static, as a relay with no broker does), and
hands each child the host's `initialize` as already answered (the child replays it to the
broker and drops the answer, relay.main.take_handed). The children write their lines straight
to the host's stdout, which they share with the router: every write holds the pipe's lock
(HostOutput.share), and a child reports a line written only once it is in the host's pipe
(SPEC §3: nothing acknowledged before the host has it). A cancel goes to the child that has
the request; the host closing stdin closes every child's, and they end as a relay ends.

Standard library only, like the relay.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import OrderedDict
from typing import Any, NoReturn

from agent_bridge.common import jsonlimit, tools
from agent_bridge.relay.answers import Static, answer
from agent_bridge.relay.host_io import HostInput, HostOutput, write_all

log = logging.getLogger("agent_bridge.mcp")

CHILD_ENV = "AGENT_BRIDGE_RELAY_CHILD"  # a session's relay: the host's handshake, as JSON (relay.main)
ROUTED_MAX = 1000  # request ids remembered for a cancel (a host has a few in flight)
DISCOVER = "server/discover"  # relay.alone.DISCOVER
LISTS = ("prompts/list", "resources/list", "resources/templates/list")  # always empty (mcp_static.json)
STATIC_METHODS = ("initialize", "tools/list", "ping", "logging/setLevel", DISCOVER, *LISTS)


class Handshake:
    """What the router answered before a session's relay started (relay.main.Handed): the host's
    `initialize`, whether it said `notifications/initialized`; handed over in CHILD_ENV."""

    def __init__(self, init: dict[str, Any] | None, initialized: bool) -> None:
        self.init = init
        self.initialized = initialized
        self.lines: list[bytes] = []
        self.rest = b""

    def text(self) -> str:
        return json.dumps({"init": self.init, "initialized": self.initialized}, ensure_ascii=False)

    @classmethod
    def read(cls, text: str) -> Handshake:
        try:
            data = jsonlimit.loads(text)
        except ValueError:
            data = None
        data = data if isinstance(data, dict) else {}
        init = data.get("init")
        return cls(init if isinstance(init, dict) else None, data.get("initialized") is True)


class Child:
    """One session's relay: its stdin a pipe from the router, its stdout the host's."""

    def __init__(self, argv: list[str], env: dict[str, str], out_fd: int) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out_fd, env=env, close_fds=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def write(self, line: str) -> bool:
        assert self.proc.stdin is not None
        try:
            write_all(self.proc.stdin.fileno(), (line + "\n").encode("utf-8", "surrogatepass"))
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


class Router:
    def __init__(self, options: dict[str, Any], out_fd: int) -> None:
        self.options = options  # relay.quick.parse_mcp's: agent, name, project
        self.out_fd = out_fd
        self.out = HostOutput(out_fd, lambda: os._exit(0))
        self.out.share()
        self.static = Static(str(options.get("agent") or ""))
        self.init: dict[str, Any] | None = None  # the host's initialize
        self.initialized = False
        self.children: dict[str, Child] = {}  # host session id ("" for calls without one) -> its relay
        self.routed: OrderedDict[str, Child] = OrderedDict()  # request id (JSON) -> the child that has it

    def child_argv(self, session: str) -> list[str]:
        argv = [sys.executable, "-m", "agent_bridge", "mcp"]
        for flag, key in (("--agent", "agent"), ("--name", "name"), ("--project", "project")):
            if self.options.get(key):
                argv += [flag, str(self.options[key])]
        return argv + (["--host-session-id", session] if session else [])

    def child(self, session: str) -> Child:
        found = self.children.get(session)
        if found is not None and found.alive():
            return found
        env = {**os.environ, CHILD_ENV: Handshake(self.init, self.initialized).text()}
        made = self.children[session] = Child(self.child_argv(session), env, self.out_fd)
        return made

    def on_line(self, line: str) -> None:
        try:
            message = jsonlimit.loads(line)
        except ValueError:  # TooDeep too: the session's relay answers what is malformed
            message = None
        if isinstance(message, dict) and "id" in message and "method" not in message:
            self.to_all(line)  # an answer to a request of a session's server: its relay knows it
            return
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            self.to(self.child(""), line)  # a relay's MCP server answers what is malformed
            return
        method, rid = message["method"], message.get("id")
        if "id" not in message:
            self.on_notification(line, method, message)
            return
        if method in STATIC_METHODS:
            self.answer_static(method, rid, message)
            return
        session = ""
        if method == "tools/call":
            params = message.get("params")
            arguments = params.get("arguments") if isinstance(params, dict) else None
            if isinstance(arguments, dict) and tools.HOST_SESSION_ARGUMENT in arguments:
                given = arguments.pop(tools.HOST_SESSION_ARGUMENT)
                session = given if isinstance(given, str) and 0 < len(given) <= 200 else ""
                line = json.dumps(message, ensure_ascii=False)
        child = self.child(session)
        self.routed[json.dumps(rid)] = child
        while len(self.routed) > ROUTED_MAX:
            self.routed.popitem(last=False)
        self.to(child, line)

    def on_notification(self, line: str, method: str, message: dict[str, Any]) -> None:
        if method == "notifications/initialized":
            self.initialized = True
        if method == "notifications/cancelled":
            params = message.get("params")
            rid = params.get("requestId") if isinstance(params, dict) else None
            child = self.routed.get(json.dumps(rid))
            if child is not None:
                self.to(child, line)
            return
        self.to_all(line)

    def answer_static(self, method: str, rid: Any, message: dict[str, Any]) -> None:
        if method == "initialize":
            self.init = message
            found = self.static.initialize(message.get("params"))
            self.out.write(answer(rid, result=found.get("result"), error=found.get("error")))
        elif method == "tools/list":
            self.out.write(answer(rid, result=self.static.tools_list()))
        elif method in LISTS:
            self.out.write(answer(rid, result=self.static.data["lists"][method]))
        elif method == DISCOVER:  # as relay.alone answers it: the host then sends `initialize`
            error = {"code": -32601, "message": "Method not found", "data": DISCOVER}
            self.out.write(answer(rid, error=error))
        else:  # ping; logging/setLevel (each session's relay logs at its own level)
            self.out.write(answer(rid, result={}))

    def to(self, child: Child, line: str) -> None:
        if not child.write(line):
            log.warning("a session's relay is gone; the host's line was not handed to it")

    def to_all(self, line: str) -> None:
        for child in list(self.children.values()):
            if child.alive():
                child.write(line)

    def end(self) -> None:
        """The host closed stdin: every child's is closed, and they end as a relay ends, on their
        own (a signal ends them as it ends a relay). Not waited for: the router leaves at once,
        as a relay does. opencode 1.18.33, closing its MCP server, first sends each of the
        server's descendants SIGTERM (found with `pgrep -P`), then closes the server's stdin."""
        for child in self.children.values():
            child.close()


def main(options: dict[str, Any]) -> NoReturn:
    """The router, until the host closes stdin. fd 1 is the host's: moved to a descriptor of its
    own (the children get it as their stdout), with fd 1 pointed at stderr."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="agent-bridge mcp: %(message)s")
    out_fd = os.dup(1)
    os.dup2(2, 1)
    router = Router(options, out_fd)
    for line in HostInput(0).lines():
        if line is not None:
            router.on_line(line)
    router.end()
    os._exit(0)  # at once, as a relay leaves (relay.main.exit_now): the host may be waiting for it

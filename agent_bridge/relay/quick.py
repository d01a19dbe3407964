"""A job's MCP server, run as a script: `python -I -S .../agent_bridge/relay/quick.py mcp --job
--agent HOST ...` (what a job's host is given where the broker names this machine's
interpreter: hosts.edits.mcp_command).

A job's host waits for its MCP servers before its first model request (Codex: `required`;
Claude Code: MCP_CONNECTION_NONBLOCKING=0), and `delegate` is measured to that request (SPEC §9
"Delegation"). The relay answers only after its imports and its join to the broker, about
100 ms after its spawn; a Python process that answers at once is ready in a fifth of that. So
this script answers the handshake first, the way a relay with no broker does (relay.alone:
`server/discover` "Method not found", `initialize` and `tools/list` from the generated data in
mcp_static.json), with Python started without `site` and nothing imported but json and
select. Then it runs the whole relay in this process (relay.main), handing it what it answered,
so that a broker joining later is given the host's `initialize` again (relay.replay), and
what it read and did not handle. The relay starts at the host's next line (its first tool call
waits for the relay's start and join, about 100 ms, as a tool call to a relay still joining
does), or after LINGER of quiet: the job's session joins the broker up to that much later than
with `agent-bridge mcp`, while its host waits on its model.

It answers only a handshake it reads plainly (a JSON object per line, an integer or string id),
and the lists a host asks for with `tools/list` (prompts and resources, always empty); at the
first line it does not handle, or once the host has been quiet for LINGER after `tools/list`, it
stops and the relay handles the rest. Any other `mcp` command line (no `--agent`) goes to the
relay as read; one `parse_mcp` does not read (help, a typo) goes to the command line's parser.
"""

import sys

try:  # the built-in module under `os`: without `site`, `import os` costs more than this whole look
    import posix as _os
except ImportError:  # not a POSIX system: the module that is there
    import os as _os  # type: ignore[no-redef]

LINE_MAX = 1 << 16  # a handshake line longer than this goes to the relay (jsonlimit checks depth there)
DISCOVER = "server/discover"  # relay.alone.DISCOVER
# What a host lists after `initialize` (Codex 0.171.0: tools; Claude Code 2.1.332: tools, prompts
# and resources, together), answered from the generated data.
LISTS = ("tools/list", "prompts/list", "resources/list", "resources/templates/list")
# Seconds of silence after `tools/list` that end the handshake (the host asks its lists together,
# seen within a millisecond; then it waits on its model). Any line from the host ends it at once.
# Until then the relay's imports and join, about 100 ms of CPU, do not compete with the rest of
# the host's start (Codex's first request 1.30x a bare start with 0.05 s here, 1.17x with 0.5 s).
LINGER = 1.0


class Front:
    """What this script answered and read (relay.Handed once the relay is imported)."""

    def __init__(self) -> None:
        self.init: dict[str, object] | None = None  # the host's initialize, answered with a result
        self.initialized = False  # the host sent notifications/initialized
        self.lines: list[bytes] = []  # complete lines read and not handled
        self.rest = b""  # the start of a line not complete yet


def package_root() -> str:
    """The folder holding this package (POSIX paths: mcp_command runs this script on POSIX only)."""
    here = __file__ if __file__.startswith("/") else _os.getcwd() + "/" + __file__
    return here.rsplit("/", 3)[0]


MCP_OPTIONS = {"--agent": "agent", "--name": "name", "--project": "project",
               "--host-session-id": "host_session_id"}


def parse_mcp(args: list[str]) -> dict[str, object] | None:
    """`mcp [--agent A] [--name N] [--project P] [--job] [--host-session-id H]`, as hosts and jobs
    start it, parsed without argparse (its setup is about a tenth of the relay's start, which a
    job's host waits for): the relay's options, or None for anything else (help, `--name=x`, a
    typo), which the command line's parser answers with its usual messages. Each option at most
    once, each value a separate word that does not start with "-"."""
    if not args or args[0] != "mcp":
        return None
    options: dict[str, object] = dict.fromkeys(MCP_OPTIONS.values())
    options.update(command="mcp", job=False)
    seen: set[str] = set()
    rest = list(args[1:])
    while rest:
        flag = rest.pop(0)
        if flag in seen:
            return None
        seen.add(flag)
        if flag == "--job":
            options["job"] = True
        elif flag in MCP_OPTIONS and rest and not rest[0].startswith("-"):
            options[MCP_OPTIONS[flag]] = rest.pop(0)
        else:
            return None
    return options


def answer(rid: object, body: dict[str, object]) -> bytes:
    """relay.answers.answer, as bytes for the host's pipe."""
    import json

    return (json.dumps({"jsonrpc": "2.0", "id": rid, **body}, ensure_ascii=False) + "\n").encode(
        "utf-8", "surrogatepass")


def static_answers(agent: str) -> dict[str, object]:
    """relay.answers.Static's data, read the same way."""
    import json

    with open(package_root() + "/agent_bridge/relay/mcp_static.json", encoding="utf-8") as f:
        data: dict[str, object] = json.load(f)
    initialize = data["initialize"]
    assert isinstance(initialize, dict)
    lists = data["lists"]
    assert isinstance(lists, dict)
    return {"initialize": initialize["claude" if agent == "claude" else "other"],
            "tools/list": data["tools/list"], **lists}


def handshake(agent: str, fd_in: int = 0, fd_out: int = 1) -> Front:
    """Answer the host's handshake on `fd_in`/`fd_out`: until it sent a line not answered here,
    or closed its end, or, once `tools/list` is answered, asked nothing more for LINGER."""
    import json
    import select

    front = Front()
    static = static_answers(agent)
    listed = False
    while not listed or select.select([fd_in], [], [], LINGER)[0]:
        chunk = _os.read(fd_in, 1 << 16)
        if not chunk:
            break
        *complete, front.rest = (front.rest + chunk).split(b"\n")
        for at, raw in enumerate(complete):
            if not raw.strip():
                continue
            try:
                message = json.loads(raw) if len(raw) <= LINE_MAX else None
            except (ValueError, RecursionError):
                message = None
            reply = reply_to(message, front, static)
            if reply is None:
                front.lines = complete[at:]  # this line and the rest: the relay's
                return front
            if reply:
                _os.write(fd_out, reply)
            listed = listed or (isinstance(message, dict) and message.get("method") == "tools/list")
    return front


def reply_to(message: object, front: Front, static: dict[str, object]) -> bytes | None:
    """The answer to one handshake line (b"" for a notification taken), or None: not answered here."""
    if not isinstance(message, dict):
        return None
    method, rid = message.get("method"), message.get("id")
    if method == "notifications/initialized" and "id" not in message:
        front.initialized = True
        return b""
    if not isinstance(rid, (int, str)) or isinstance(rid, bool):
        return None
    if method == DISCOVER and front.init is None:
        return answer(rid, {"error": {"code": -32601, "message": "Method not found", "data": DISCOVER}})
    if method == "initialize" and front.init is None:
        params = message.get("params")
        wanted = params.get("protocolVersion") if isinstance(params, dict) else None
        versions = static["initialize"]
        assert isinstance(versions, dict)
        found = (versions.get(wanted) if isinstance(wanted, str) else None) or versions["unknown"]
        if "result" not in found:  # an error: the relay answers that, as it would
            return None
        front.init = message
        return answer(rid, {"result": found["result"]})
    if method in LISTS and front.init is not None:
        return answer(rid, {"result": static[method]})
    return None


def main(argv: list[str]) -> int:
    import _signal

    options = parse_mcp(argv)
    if options is None:  # not a command line answered here: the command line's parser has it, as read
        _os.execv(sys.executable, [sys.executable, "-I", "-c", HAND_OVER, package_root(), *argv])
    # Hosts end their MCP servers with SIGINT, then SIGTERM: until the relay runs, nothing this
    # process did needs keeping (relay.main.command does the same).
    for signum in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(signum, lambda *_: _os._exit(0))
    agent = options["agent"]
    front = handshake(agent) if isinstance(agent, str) else None
    sys.path.insert(0, package_root())
    from argparse import Namespace  # loaded by the relay already

    from agent_bridge.relay import main as relay

    return relay.command(Namespace(**options), handed=front)


# The command line, for a command line not answered here: the package's folder, then its words.
HAND_OVER = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from agent_bridge.cli.main import main; "
             "sys.exit(main(sys.argv[1:]))")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

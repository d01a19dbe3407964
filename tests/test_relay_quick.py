"""A job's MCP server as the broker gives it to the job's host (hosts.edits.mcp_command):
`python -I -S .../agent_bridge/relay/quick.py mcp --job ...`, which answers the handshake before
it imports anything of the relay, then is the relay in the same process. Real processes, a real
broker, stdio spoken by hand."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import agent_bridge
from agent_bridge.broker.mcp import static
from agent_bridge.cli import main as cli
from agent_bridge.hosts.edits import mcp_command
from agent_bridge.relay import quick as relay_quick
from agent_bridge.relay.answers import Static
from tests.conftest import run_cli, wait_until

QUICK = Path(agent_bridge.__file__).parent / "relay" / "quick.py"
VERSIONS = ("2024-11-05", "2025-06-18", "2025-11-25", "1999-01-01")
READ_TIMEOUT = 30.0


def job_argv(agent: str, project: Path) -> list[str]:
    job_id = str(uuid.uuid4())
    bridge = [str(Path(sys.executable).parent / "agent-bridge"), "mcp", "--job", "--agent", agent,
              "--name", f"{agent}-job-{job_id[:8]}", "--project", str(project), "--host-session-id", job_id]
    return mcp_command(bridge)


class Host:
    """The job's host, by hand: lines to the server's stdin, its answers read by id."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.buffer = b""
        self.lines: list[dict[str, Any]] = []

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, *messages: dict[str, Any]) -> None:
        self.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))

    def answer(self, rid: Any) -> dict[str, Any]:
        while True:
            for line in self.lines:
                if line.get("id") == rid:
                    return line
            assert self.proc.stdout is not None
            ready, _, _ = select.select([self.proc.stdout], [], [], READ_TIMEOUT)
            assert ready, f"no answer to {rid!r} within {READ_TIMEOUT} s"
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            assert chunk, f"the server closed its output before answering {rid!r}"
            *complete, self.buffer = (self.buffer + chunk).split(b"\n")
            self.lines += [json.loads(c) for c in complete if c.strip()]

    def end(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=READ_TIMEOUT)


@pytest.fixture
def start_host() -> Iterator[Callable[[list[str], dict[str, str]], Host]]:
    """Host starter; whatever a test left running is killed at its end (a relay left behind
    would start a broker of its own once the test's broker is gone)."""
    started: list[Host] = []

    def start(argv: list[str], env: dict[str, str]) -> Host:
        started.append(Host(argv, env))
        return started[-1]

    yield start
    for host in started:
        if host.proc.poll() is None:
            host.proc.kill()
        host.proc.wait(timeout=READ_TIMEOUT)


def initialize(rid: Any, version: str = "2025-11-25") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(rid: Any, tool: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": tool, "arguments": {}}}


def result_json(answer: dict[str, Any]) -> Any:
    assert not answer["result"].get("isError"), answer
    return json.loads(answer["result"]["content"][0]["text"])


def test_a_job_runs_the_script_without_site_where_the_broker_names_its_agent_bridge(tmp_path):
    argv = job_argv("codex", tmp_path)
    assert argv[:4] == [sys.executable, "-I", "-S", str(QUICK)] and argv[4:6] == ["mcp", "--job"]
    on_path = ["agent-bridge", "mcp", "--agent", "codex"]  # not this machine's by absolute path: as given
    assert mcp_command(on_path) == on_path


def test_the_handshake_is_answered_before_anything_of_the_relay_is_imported():
    """The script's handshake in a Python without `site` (as the job's host starts it): the three
    answers are written while no module of the package, nor the relay's threads, sockets or
    logging, is loaded."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(QUICK.parent)!r})\n"
        "import quick as relay_quick\n"
        "front = relay_quick.handshake('claude')\n"
        "heavy = sorted(m for m in sys.modules if m.startswith('agent_bridge') or m in "
        "('threading', 'socket', 'logging', 'pathlib', 'subprocess', 'os'))\n"
        "sys.stderr.write(repr((heavy, front.init is not None, front.initialized, front.lines,\n"
        "                       front.rest)))\n"
    )
    lines = [{"jsonrpc": "2.0", "id": 0, "method": "server/discover"}, initialize(1), INITIALIZED,
             {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
             {"jsonrpc": "2.0", "id": "p", "method": "prompts/list"},
             {"jsonrpc": "2.0", "id": "r", "method": "resources/list"}, call(3, "whoami")]
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, timeout=60,
                          input=b"".join(json.dumps(m).encode() + b"\n" for m in lines) + b'{"jsonrpc"')
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers] == [0, 1, 2, "p", "r"]
    assert answers[0]["error"]["code"] == -32601 and "tools" in answers[2]["result"]
    assert answers[3]["result"] == {"prompts": []} and answers[4]["result"] == {"resources": []}
    heavy, answered, initialized, rest_lines, rest = eval(done.stderr.decode())  # noqa: S307 - our own repr
    assert heavy == [] and answered and initialized
    assert rest_lines == [json.dumps(call(3, "whoami")).encode()] and rest == b'{"jsonrpc"'


def test_the_lists_it_answers_are_the_servers():
    """Claude Code lists prompts and resources with its tools: answered from the generated data,
    which is what the broker's server answers (the shipped file is checked in tests/test_relay.py)."""
    host_in, script_in = os.pipe()
    script_out, host_out = os.pipe()
    methods = ("tools/list", *(m for m in relay_quick.LISTS if m != "tools/list"))
    os.write(script_in, "".join(json.dumps(m) + "\n" for m in [
        initialize(1), *({"jsonrpc": "2.0", "id": method, "method": method} for method in methods)]).encode())
    os.close(script_in)
    relay_quick.handshake("claude", host_in, host_out)
    os.close(host_out)
    with os.fdopen(script_out, "rb") as f:
        answers = {a["id"]: a["result"] for a in map(json.loads, f.read().splitlines())}
    os.close(host_in)
    assert answers.pop(1)["serverInfo"]["name"] == "agent-bridge"
    assert answers == {**{m: static.static_answers()["lists"][m] for m in methods[1:]},
                       "tools/list": Static("claude").tools_list()}
    assert answers["prompts/list"] == {"prompts": []} and answers["resources/list"] == {"resources": []}


@pytest.mark.parametrize("agent", ["claude", "codex"])
@pytest.mark.parametrize("version", VERSIONS)
def test_its_answers_are_the_relays_answers_with_no_broker(agent, version):
    """What the script answers is what a relay alone answers (relay.answers.Static, generated
    from the real server)."""
    host_in, script_in = os.pipe()
    script_out, host_out = os.pipe()
    os.write(script_in, (json.dumps(initialize(7, version)) + "\n"
                         + json.dumps({"jsonrpc": "2.0", "id": "t", "method": "tools/list"}) + "\n").encode())
    os.close(script_in)
    front = relay_quick.handshake(agent, host_in, host_out)
    os.close(host_out)
    with os.fdopen(script_out, "rb") as f:
        answers = [json.loads(line) for line in f.read().splitlines()]
    os.close(host_in)
    static = Static(agent)
    initialized = static.initialize({"protocolVersion": version})["result"]
    assert answers == [{"jsonrpc": "2.0", "id": 7, "result": initialized},
                       {"jsonrpc": "2.0", "id": "t", "result": static.tools_list()}]
    assert front.init == initialize(7, version) and front.lines == [] and front.rest == b""


def test_the_job_session_is_served_by_the_broker_after_the_handshake(broker, env, tmp_path, start_host):
    """The host's lines all in one write, a line cut in two: the handshake from the script, the
    rest from the relay through the broker, which was handed the host's `initialize`: every
    request answered once, the tool call as the job's session."""
    host = start_host(job_argv("claude", tmp_path), env)
    call_line = json.dumps(call(3, "whoami")).encode()
    host.send({"jsonrpc": "2.0", "id": 0, "method": "server/discover"}, initialize(1), INITIALIZED,
              {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    host.write(call_line[:20])
    assert "tools" in host.answer(2)["result"]
    resources = json.dumps({"jsonrpc": "2.0", "id": 4, "method": "resources/list"}).encode()
    host.write(call_line[20:] + b"\n" + resources + b"\n")
    me = result_json(host.answer(3))
    assert me["kind"] == "job" and me["name"].startswith("claude-job-")
    assert host.answer(4)["result"] == {"resources": []}
    host.send(call(5, "peers"))  # the broker knows it connected
    assert [(p["name"], p["connected"]) for p in result_json(host.answer(5))] == [(me["name"], True)]
    assert host.end() == 0
    ids = [line["id"] for line in host.lines]
    assert sorted(ids) == [0, 1, 2, 3, 4, 5], ids


def test_a_quiet_host_s_job_session_joins_the_broker_all_the_same(broker, env, tmp_path, start_host):
    """After its lists the host waits on its model and sends nothing: the relay starts once the
    handshake has been quiet for LINGER, and the job's session is connected without a host line."""
    argv = job_argv("codex", tmp_path)
    name = argv[argv.index("--name") + 1]
    host = start_host(argv, env)
    host.send(initialize(1), INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    host.answer(2)

    def connected() -> bool:
        done = run_cli(env, "sessions", "--json")
        return any(s["name"] == name and s["connected"] for s in json.loads(done.stdout or "[]"))

    wait_until(connected, what=f"{name} connected")
    host.send(call(3, "whoami"))
    assert result_json(host.answer(3))["name"] == name
    assert host.end() == 0


def test_a_line_the_script_does_not_answer_goes_to_the_relay_with_the_rest(broker, env, tmp_path, start_host):
    host = start_host(job_argv("codex", tmp_path), env)
    host.send({"jsonrpc": "2.0", "id": 1, "method": "ping"}, initialize(2), INITIALIZED,
              {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, call(4, "whoami"))
    assert host.answer(1)["result"] == {}
    assert host.answer(2)["result"]["serverInfo"]["name"] == "agent-bridge"
    assert result_json(host.answer(4))["kind"] == "job"
    assert host.end() == 0
    assert sorted(line["id"] for line in host.lines) == [1, 2, 3, 4]


@pytest.mark.parametrize("args", [
    ["mcp"],
    ["mcp", "--agent", "codex"],
    ["mcp", "--job", "--agent", "claude", "--name", "claude-job-1", "--project", "/w",
     "--host-session-id", "h"],
    ["mcp", "--project", "/w", "--job", "--name", "n"],
])
def test_mcp_is_parsed_without_the_parser_as_argparse_parses_it(args, monkeypatch):
    expected = vars(cli.build_parser().parse_args(args))
    monkeypatch.setattr(cli, "build_parser", lambda: pytest.fail("the parser was built"))
    fast = cli._mcp_fast_path(args)
    assert fast is not None
    assert {k: v for k, v in vars(fast).items() if k in expected} == expected


@pytest.mark.parametrize("args", [
    ["mcp", "--help"], ["mcp", "--name=x"], ["mcp", "--name", "a", "--name", "b"], ["mcp", "--name", "-x"],
    ["mcp", "--agent"], ["mcp", "extra"], ["hook", "stop"],
])
def test_anything_else_goes_to_argparse(args):
    assert cli._mcp_fast_path(args) is None

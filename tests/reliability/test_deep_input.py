"""SPEC §8, "Input depth and size" (issue 23, points 2 and 3): JSON nested past the fixed limit
gets a clear error on every surface that parses JSON, with the request's id when it has one,
and the process goes on serving. Real relay and broker processes, real sockets, real files."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from agent_bridge.common import jsonlimit
from agent_bridge.ipc import blocking, protocol
from tests.conftest import run_cli
from tests.test_delivery import RawHost

pytestmark = pytest.mark.slow

DEEP = "[" * 1500 + "]" * 1500  # valid JSON, 3 KB: RecursionError for json.loads
JUST_TOO_DEEP = "[" * (jsonlimit.MAX_DEPTH + 1) + "]" * (jsonlimit.MAX_DEPTH + 1)


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "RecursionError" not in text, text


# --- the relay: host lines -------------------------------------------------------------------


async def test_deep_host_lines_are_answered_with_their_id_and_the_relay_serves_on(broker, env):
    """A `tools/call decide` whose scope is 1,500 nested arrays, and a `notifications/cancelled`
    as deep, used to kill the relay with RecursionError. Now: the call gets a JSON-RPC error with
    its id, the notification is dropped, and the session answers the next request."""
    with trio.fail_after(60):
        host = await RawHost.start(env, "--project", "/w/deep", keep_stderr=True)
        deep_call = (
            '{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"decide","arguments":'
            '{"topic":"t","text":"x","scope":' + DEEP + "}}}\n"
        )
        deep_cancel = (
            '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":' + DEEP + "}}\n"
        )
        assert host.proc.stdin is not None
        await host.proc.stdin.send_all((deep_call + deep_cancel).encode())
        error = (await host.answer(41))["error"]
        assert (
            error["code"] == -32600 and f"nested deeper than {jsonlimit.MAX_DEPTH} levels" in error["message"]
        )
        me = await host.tool("whoami")  # still serving, still the same session
        assert me["project"] == "/w/deep"
        assert (await host.response(await host.request("ping", {}))) == {}
        assert await host.end() == 0
        assert host.proc.stderr is not None
        stderr = b""
        while chunk := await host.proc.stderr.receive_some(65536):
            stderr += chunk
    no_traceback(stderr.decode())
    assert [m for m in host.lines if m.get("id") == 41] == [host.answers(41)[0]]  # answered once
    assert run_cli(env, "decisions", "--json").stdout.strip() == "[]"  # nothing stored


async def test_a_method_that_is_not_a_string_gets_invalid_request(broker, env):
    with trio.fail_after(60):
        host = await RawHost.start(env, "--project", "/w/method")
        await host.send({"jsonrpc": "2.0", "id": 12, "method": 5})
        error = (await host.answer(12))["error"]
        assert error["code"] == -32600 and "method" in error["message"]
        assert (await host.tool("whoami"))["project"] == "/w/method"
        assert await host.end() == 0


@pytest.mark.parametrize("last", ["tools/call", "ping"])
async def test_the_last_request_before_eof_is_answered_newline_or_not(broker, env, last):
    """The host writes its last request and closes stdin, with or without a final newline: the
    relay waits for the broker's answer (the broker stops reading at "eof") and writes it."""
    for newline in (b"", b"\n"):
        with trio.fail_after(60):
            host = await RawHost.start(env, "--project", "/w/eof")
            assert host.proc.stdin is not None
            params = {"name": "whoami", "arguments": {}} if last == "tools/call" else {}
            line = json.dumps({"jsonrpc": "2.0", "id": 77, "method": last, "params": params}).encode()
            await host.proc.stdin.send_all(line + newline)
            assert await host.end() == 0
            assert len(host.answers(77)) == 1, (newline, host.lines)
            assert "result" in host.answers(77)[0]


# --- the broker: IPC frames --------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def test_a_deep_ipc_frame_is_a_protocol_error_and_the_broker_serves_on(broker, home):
    sock_path = broker.status()["socket"]
    payload = ('{"v":1,"id":1,"op":"ping","x":' + DEEP + "}").encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(sock_path)
        s.sendall(frame(payload))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    answer = json.loads(data[4:4 + struct.unpack(">I", data[:4])[0]])
    assert answer["ok"] is False and answer["error"]["code"] == "protocol", answer
    assert "nested deeper than" in answer["error"]["message"]
    assert blocking.call(home, "ping") == "pong"
    log = (home / "broker.log").read_text()
    no_traceback(log)


# --- the CLI and the MCP tools: --scope and scope strings -----------------------------------


def test_cli_scope_too_deep_is_one_line_and_exit_2(env, home):
    for argv in (["decisions", "--scope", DEEP], ["decisions", "--scope", JUST_TOO_DEEP]):
        done = run_cli(env, *argv)
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1 and "nested deeper than" in done.stderr, done.stderr
        no_traceback(done.stderr)
    assert not home.exists()  # a read-only command: nothing created


def test_cli_decide_with_a_deep_scope_says_why_and_stores_nothing(broker, env):
    done = run_cli(env, "decide", "t", "x", "--scope", DEEP)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "nested deeper than" in done.stderr, done.stderr
    assert "did not answer" not in done.stderr
    assert json.loads(run_cli(env, "decisions", "--json").stdout) == []
    assert broker.status()["pid"] == broker.pid
    # the broker too refuses such a scope in one line, from any client
    with pytest.raises(protocol.RemoteError, match="nested deeper than"):
        blocking.call(broker.home, "decide", topic="t", text="x", scope=DEEP, project="/w")
    assert broker.status()["pid"] == broker.pid


def test_cli_decide_with_a_deep_scope_starts_no_broker(env, home):
    done = run_cli(env, "decide", "t", "x", "--scope", JUST_TOO_DEEP)
    assert done.returncode == 2 and "nested deeper than" in done.stderr, done.stderr
    assert not (home / "broker.json").exists() and not (home / "bridge.db").exists()


async def test_mcp_decide_with_a_deep_scope_string_is_a_clear_tool_error(broker, env):
    with trio.fail_after(60):
        host = await RawHost.start(env, "--project", "/w/deep-tool")
        result = await host.response(await host.call_request("decide", topic="t", text="x", scope=DEEP))
        assert result["isError"], result
        text = result["content"][0]["text"]
        assert "nested deeper than" in text and "\n" not in text, text
        assert await host.end() == 0


# --- hooks' stdin ------------------------------------------------------------------------------


@pytest.mark.parametrize("event", ["session-start", "stop"])
def test_deep_hook_stdin_is_refused_quietly(env, home, event):
    done = run_cli(env, "hook", event, input='{"session_id":"s","cwd":"/w","x":' + DEEP + "}")
    assert done.returncode == 0 and done.stdout == "", done
    no_traceback(done.stderr)
    assert "nested deeper than" in (home / "broker.log").read_text()


# --- config --------------------------------------------------------------------------------------


def test_a_deeply_nested_config_is_one_line(env, home):
    home.mkdir(mode=0o700, parents=True)
    (home / "config.toml").write_text("x = " + "[" * 1500 + "]" * 1500 + "\n", encoding="utf-8")
    done = run_cli(env, "up", "--detach")
    assert done.returncode != 0
    no_traceback(done.stderr)
    assert "config.toml" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_nothing_here_imports_trio_in_the_helper():
    """The one depth helper is standard library only (the relay and the hooks import it)."""
    code = (
        "import sys, agent_bridge.common.jsonlimit; "
        "print(sorted(m for m in ('trio', 'mcp', 'quart') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.stdout.strip() == "[]"



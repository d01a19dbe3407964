"""SPEC §5, strict tool arguments, through a real `agent-bridge mcp` over its real stdio with
hand-written JSON-RPC lines: a value of the wrong JSON type or an argument the tool does not
take is a tool error naming it (nothing done); an unknown tool is a JSON-RPC error -32602;
`logging/setLevel` is served because arrivals are logged."""

from __future__ import annotations

import json
import select
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.reliability.test_surrogates import RawMcp

pytestmark = pytest.mark.slow

INITIALIZE = ('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
              '"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}')



@contextmanager
def initialized(env: dict[str, str]) -> Iterator[tuple[RawMcp, dict[str, Any]]]:
    """A raw server past its handshake, and its `initialize` answer."""
    mcp = RawMcp(env)
    try:
        mcp.send(INITIALIZE)
        init = mcp.answer(1)
        mcp.send('{"jsonrpc":"2.0","method":"notifications/initialized"}')
        yield mcp, init
    finally:
        mcp.close()


# (tool, arguments as the host would write them, what the error must name)
REFUSED = [
    ("inbox", '{"peek":"yes"}', 'peek: expected true or false, got "yes"'),
    ("inbox", '{"peek":1}', "peek: expected true or false, got 1"),
    ("inbox", '{"wait_seconds":"0"}', 'wait_seconds: expected a JSON number, got "0"'),
    ("inbox", '{"wait_seconds":true}', "wait_seconds: expected a JSON number, got true"),
    ("decisions", '{"history":"false"}', 'history: expected true or false, got "false"'),
    ("whoami", '{"verbose":true}', "whoami: unknown argument 'verbose'"),
    ("send", '{"to":"x","text":"hi","priority":"high"}', "send: unknown argument 'priority'"),
    ("send", '{"to":7,"text":"hi"}', "to: expected a JSON string, got 7"),
    ("peers", '{"project":["/w"]}', 'project: expected a JSON string, got ["/w"]'),
    # missing required arguments: one line in the project's words, not the validation library's dump
    ("send", '{}', "send: missing required arguments to, text (it takes: message_id, reply_to, text, to)"),
    ("decide", '{"topic":"t"}', "decide: missing required argument text (it takes: "),
    ("send", '{"to":"x"}', "send: missing required argument text"),
]


def test_wrong_types_and_unknown_arguments_are_tool_errors_naming_them(broker, env):
    with initialized(env) as (mcp, init):
        assert "result" in init
        for i, (tool, arguments, named) in enumerate(REFUSED, start=10):
            mcp.send(f'{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}')
            answer = mcp.answer(i)
            assert answer["result"]["isError"] is True, (tool, arguments, answer)
            text = answer["result"]["content"][0]["text"]
            assert named in text, (tool, arguments, answer)
            # one form for every tool error, one line, nothing of pydantic's
            assert text.startswith(f"Error executing tool {tool}: ") and "\n" not in text, text
            assert "validation error" not in text and "pydantic" not in text, text
        # the same tools with values of the right types still work
        mcp.send('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"inbox","arguments":'
                 '{"peek":true,"wait_seconds":0}}}')
        fine = mcp.answer(2)
        assert not fine["result"].get("isError") and json.loads(fine["result"]["content"][0]["text"]) == [], (
            fine
        )
        mcp.send('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"decisions","arguments":{"history":false}}}')
        assert not mcp.answer(3)["result"].get("isError")


def test_an_unknown_tool_is_a_json_rpc_invalid_params_error(broker, env):
    with initialized(env) as (mcp, _):
        mcp.send('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"launch_rockets","arguments":{}}}')
        answer = mcp.answer(2)
        assert "result" not in answer, answer
        assert answer["error"]["code"] == -32602, answer
        assert "launch_rockets" in answer["error"]["message"], answer


def test_the_logging_capability_is_declared_and_set_level_is_answered(broker, env):
    with initialized(env) as (mcp, init):
        assert "logging" in init["result"]["capabilities"], init
        mcp.send('{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"warning"}}')
        answer = mcp.answer(2)
        assert answer.get("result") == {}, answer


def test_a_host_that_asks_for_warnings_only_gets_no_arrival_logs(broker, env):
    """Arrivals are logged at info: after `logging/setLevel` "warning" none is sent, after
    "info" again one is. The quiet arrival is taken from the inbox (so handled, and its log
    decided) before the level goes back to info."""
    logged: list[str] = []

    def answer(mcp: RawMcp, request_id: int) -> dict[str, Any]:
        """Like RawMcp.answer, keeping the log notifications that come before the answer."""
        deadline = time.monotonic() + 30
        while True:
            while b"\n" in mcp.buffer:
                line, mcp.buffer = mcp.buffer.split(b"\n", 1)
                message = json.loads(line)
                if message.get("method") == "notifications/message":
                    logged.append(str(message["params"]["data"]))
                elif message.get("id") == request_id:
                    return message
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no answer to request {request_id}"
            if select.select([mcp.proc.stdout], [], [], remaining)[0]:
                chunk = mcp.proc.stdout.read1(65536)
                assert chunk, "the server closed stdout"
                mcp.buffer += chunk

    def call(mcp: RawMcp, request_id: int, method: str, params: str) -> dict[str, Any]:
        mcp.send(f'{{"jsonrpc":"2.0","id":{request_id},"method":"{method}","params":{params}}}')
        return answer(mcp, request_id)

    with initialized(env) as (mcp, _):
        me = call(mcp, 2, "tools/call", '{"name":"whoami","arguments":{}}')
        name = json.loads(me["result"]["content"][0]["text"])["name"]
        assert call(mcp, 3, "logging/setLevel", '{"level":"warning"}')["result"] == {}
        assert run_cli(env, "send", name, "quiet arrival").returncode == 0
        seen = call(mcp, 4, "tools/call", '{"name":"inbox","arguments":{"wait_seconds":30}}')
        assert "quiet arrival" in seen["result"]["content"][0]["text"], seen
        assert call(mcp, 5, "logging/setLevel", '{"level":"info"}')["result"] == {}
        assert run_cli(env, "send", name, "loud arrival").returncode == 0
        seen = call(mcp, 6, "tools/call", '{"name":"inbox","arguments":{"wait_seconds":30}}')
        assert "loud arrival" in seen["result"]["content"][0]["text"], seen
        call(mcp, 7, "ping", "{}")  # the loud arrival's log went out before the inbox call saw it
    assert any("loud arrival" in text for text in logged), logged
    assert not any("quiet arrival" in text for text in logged), logged

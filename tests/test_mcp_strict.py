"""SPEC §5, strict tool arguments, through a real `agent-bridge mcp` over its real stdio with
hand-written JSON-RPC lines: a value of the wrong JSON type or an argument the tool does not
take is a tool error naming it (nothing done); an unknown tool is a JSON-RPC error -32602;
`logging/setLevel` is served because arrivals are logged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

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
]


def test_wrong_types_and_unknown_arguments_are_tool_errors_naming_them(broker, env):
    with initialized(env) as (mcp, init):
        assert "result" in init
        for i, (tool, arguments, named) in enumerate(REFUSED, start=10):
            mcp.send(f'{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}')
            answer = mcp.answer(i)
            assert answer["result"]["isError"] is True, (tool, arguments, answer)
            assert named in answer["result"]["content"][0]["text"], (tool, arguments, answer)
        # the same tools with values of the right types still work
        mcp.send('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"inbox","arguments":'
                 '{"peek":true,"wait_seconds":0}}}')
        fine = mcp.answer(2)
        assert not fine["result"].get("isError") and json.loads(fine["result"]["content"][0]["text"]) == [], fine
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

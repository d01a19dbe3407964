"""SPEC §8: text that cannot be stored (a lone surrogate, valid in JSON, invalid in UTF-8) is a
clear error for that request only: over IPC the connection and the requests pipelined behind it
go on; through `agent-bridge mcp` the tool call is answered with a tool error.

The frames and lines below are written by hand from the JSON and JSON-RPC texts (`\\ud800` is
how a JSON text spells a lone surrogate), not produced by our encoder."""

from __future__ import annotations

import json
import select
import socket
import struct
import subprocess
import time
from typing import Any

import pytest

from tests.conftest import CLI
from tests.test_pipelining import read_frames

pytestmark = pytest.mark.slow

LONE = "\\ud800"  # the six characters of the JSON escape


def raw_frame(payload: str) -> bytes:
    data = payload.encode("ascii")
    return struct.pack(">I", len(data)) + data


def test_ipc_a_lone_surrogate_fails_that_request_only(broker):
    sock_path = broker.status()["socket"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as rx:
        rx.settimeout(30)
        rx.connect(sock_path)
        rx.sendall(raw_frame('{"v":1,"id":1,"op":"hello","agent":"codex","project":"/w/s","name":"sur-rx"}'))
        assert read_frames(rx, 1)[0]["ok"]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as tx:
            tx.settimeout(30)
            tx.connect(sock_path)
            tx.sendall(b"".join([
                raw_frame('{"v":1,"id":1,"op":"hello","agent":"codex","project":"/w/s","name":"sur-tx"}'),
                raw_frame(f'{{"v":1,"id":2,"op":"send","to":"sur-rx","text":"a{LONE}b"}}'),
                raw_frame(f'{{"v":1,"id":3,"op":"send","to":"sur-rx{LONE}","text":"hi"}}'),
                raw_frame(f'{{"v":1,"id":4,"op":"decide","topic":"t{LONE}","text":"x","scope":"all"}}'),
                raw_frame('{"v":1,"id":5,"op":"whoami"}'),
                raw_frame('{"v":1,"id":6,"op":"send","to":"sur-rx","text":"fine \\ud83d\\ude00"}'),
            ]))
            answers = read_frames(tx, 6)
    assert [a["id"] for a in answers] == [1, 2, 3, 4, 5, 6]
    for bad in answers[1:4]:
        assert bad["ok"] is False and bad["error"]["code"] == "bad_request", bad
        assert "lone surrogate" in bad["error"]["message"], bad
    assert answers[4]["ok"] and answers[4]["result"]["name"] == "sur-tx"
    assert answers[5]["ok"], answers[5]


def test_ipc_control_connection_survives_a_lone_surrogate(broker):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(broker.status()["socket"])
        s.sendall(
            raw_frame(f'{{"v":1,"id":1,"op":"ping","note":"{LONE}"}}')
            + raw_frame('{"v":1,"id":2,"op":"ping"}')
        )
        first, second = read_frames(s, 2)
    assert first["ok"] is False and "lone surrogate" in first["error"]["message"]
    assert second == {"v": 1, "id": 2, "ok": True, "result": "pong"}


class RawMcp:
    """`agent-bridge mcp` driven line by line over its real stdio."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([*CLI, "mcp", "--project", "/w/sur"], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.buffer = b""
        self.answered: dict[Any, dict[str, Any]] = {}  # read while looking for another id

    def send(self, line: str) -> None:
        self.proc.stdin.write(line.encode("ascii") + b"\n")
        self.proc.stdin.flush()

    def answer(self, request_id: int, timeout: float = 30) -> dict[str, Any]:
        """The answer to `request_id`, in whatever order the answers come (JSON-RPC sets none)."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if "id" in message and "method" not in message:
                    self.answered[message["id"]] = message
            if request_id in self.answered:
                return self.answered.pop(request_id)
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no answer to request {request_id}"
            ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if ready:
                chunk = self.proc.stdout.read1(65536)
                assert chunk, "the server closed stdout"
                self.buffer += chunk

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def test_mcp_a_lone_surrogate_in_a_tool_call_is_a_tool_error(broker, env):
    mcp = RawMcp(env)
    try:
        mcp.send('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
                 '"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}')
        assert "result" in mcp.answer(1)
        mcp.send('{"jsonrpc":"2.0","method":"notifications/initialized"}')
        mcp.send('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"send","arguments":'
                 f'{{"to":"nobody","text":"a{LONE}b"}}}}}}')
        mcp.send('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}')
        refused = mcp.answer(2)
        assert refused["result"]["isError"] is True, refused
        assert "lone surrogate" in refused["result"]["content"][0]["text"], refused
        fine = mcp.answer(3)
        assert not fine["result"].get("isError"), fine
        assert json.loads(fine["result"]["content"][0]["text"])["project"] == "/w/sur"
    finally:
        mcp.close()


def test_cli_arguments_that_are_not_utf8_are_a_clear_error(env, home):
    """Python hands undecodable argv bytes over as lone surrogates (surrogateescape)."""
    try:
        done = subprocess.run(
            [*CLI, "decide", "topic", b"bad \xff text"], env=env, capture_output=True, timeout=60
        )
    finally:
        # if it started one after all
        subprocess.run([*CLI, "down"], env=env, capture_output=True, timeout=60)
    assert done.returncode == 2  # a bad argument (SPEC §2: exit 2 everywhere)
    assert b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    assert b"text: not valid text" in done.stderr
    assert not home.exists() or not (home / "broker.json").exists()  # nothing was started or stored

"""Relay wire 2 (ipc.protocol): line frames as bytes, negotiated at `mcp`; and the broker's frames
to a relay gathered per turn (broker.mcp.outbox). The bytes here are written out by hand from
the protocol's text (docs/ipc.md), not made by the encoder under test; the broker is the real
one, in this process, over its real Unix socket."""

from __future__ import annotations

import json
import struct
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from agent_bridge.ipc import protocol
from tests.test_absorb_offers import broker_in_process

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def json_frame(obj: dict[str, Any]) -> bytes:
    return frame(json.dumps(obj).encode())


class RawRelay:
    """A relay played by hand over the broker's socket: bytes out, frames' payloads in."""

    def __init__(self, sock: trio.SocketStream) -> None:
        self.sock = sock
        self.buffer = b""

    async def payload(self) -> bytes:
        while True:
            if len(self.buffer) >= 4:
                (size,) = struct.unpack(">I", self.buffer[:4])
                if len(self.buffer) >= 4 + size:
                    payload, self.buffer = self.buffer[4:4 + size], self.buffer[4 + size:]
                    return payload
            data = await self.sock.receive_some(1 << 16)
            assert data, "the broker closed the relay's connection"
            self.buffer += data

    async def line_answering(self, rid: int) -> tuple[bytes, str]:
        """(the payload's first byte, the line) of the push carrying the answer to `rid`."""
        while True:
            payload = await self.payload()
            if payload[:1] == b"{":
                obj = json.loads(payload)
                if obj.get("push") == "line" and json.loads(obj["line"]).get("id") == rid:
                    return b"{", obj["line"]
            elif payload[:1] == b"L":
                line = payload[1:].decode()
                if json.loads(line).get("id") == rid:
                    return b"L", line
            else:
                assert payload[:1] == b"S", payload[:40]
                line = payload[payload.index(b"\n") + 1:].decode()
                if json.loads(line).get("id") == rid:
                    return b"S", line


async def hello(sock: str, project: str) -> tuple[RawRelay, dict[str, Any]]:
    relay = RawRelay(await trio.open_unix_socket(sock))
    # The `mcp` request as docs/ipc.md gives it: a relay of wire 1 sends nothing more.
    mcp = {"v": 1, "id": 1, "op": "mcp", "agent": "codex", "project": project}
    await relay.sock.send_all(json_frame(mcp))
    answer = json.loads(await relay.payload())
    assert answer["ok"], answer
    return relay, answer["result"]


async def test_a_relay_of_wire_1_is_served_json_line_frames(home):
    """An older relay (no "wire" frame) speaks and is answered exactly as before wire 2."""
    with trio.fail_after(30):
        async with broker_in_process(home) as (_broker, sock):
            relay, result = await hello(sock, "/w/wire-one")
            assert result["wire"] == 2  # offered; not taken by this relay
            await relay.sock.send_all(json_frame({"v": 1, "relay": "line", "line": json.dumps(INITIALIZE)}))
            kind, line = await relay.line_answering(1)
            assert kind == b"{" and json.loads(line)["result"]["serverInfo"]["name"] == "agent-bridge"
            ping = b'{"jsonrpc":"2.0","id":2,"method":"ping"}'
            await relay.sock.send_all(json_frame({"v": 1, "relay": "line", "line": ping.decode()}))
            assert await relay.line_answering(2) == (b"{", '{"jsonrpc":"2.0","id":2,"result":{}}')
            await relay.sock.aclose()


async def test_a_relay_of_wire_2_sends_and_gets_lines_as_bytes(home):
    with trio.fail_after(30):
        async with broker_in_process(home) as (_broker, sock):
            relay, _ = await hello(sock, "/w/wire-two")
            await relay.sock.send_all(frame(b'{"v":1,"relay":"wire","wire":2}'))
            # docs/ipc.md's example: the relay's `ping` line, 41 bytes after the length
            init = json.dumps(INITIALIZE).encode()
            await relay.sock.send_all(frame(b"L" + init))
            kind, line = await relay.line_answering(1)
            assert kind == b"L" and json.loads(line)["id"] == 1
            await relay.sock.send_all(b'\x00\x00\x00\x29L{"jsonrpc":"2.0","id":1,"method":"ping"}')
            assert await relay.line_answering(1) == (b"L", '{"jsonrpc":"2.0","id":1,"result":{}}')
            # a line in two parts ("l", then "L"), cut right after a character beyond ASCII
            line = '{"jsonrpc":"2.0","id":"é-3","method":"ping"}'.encode()
            cut = line.index("é".encode()) + 2
            await relay.sock.send_all(frame(b"l" + line[:cut]) + frame(b"L" + line[cut:]))
            answer = '{"jsonrpc":"2.0","id":"é-3","result":{}}'
            assert await relay.line_answering("é-3") == (b"L", answer)  # type: ignore[arg-type]
            await relay.sock.aclose()


async def test_a_wire_the_broker_does_not_speak_is_one_clear_error(home):
    with trio.fail_after(30):
        async with broker_in_process(home) as (_broker, sock):
            relay, _ = await hello(sock, "/w/wire-three")
            await relay.sock.send_all(frame(b'{"v":1,"relay":"wire","wire":3}'))
            while (answer := json.loads(await relay.payload())).get("ok") is not False:
                pass
            problem = "relay frame: wire 3 is not spoken here (only 2)"
            assert answer["error"] == {"code": "protocol", "message": problem}
            await relay.sock.aclose()


def test_line_frames_as_bytes_decode_as_the_json_frames_that_mean_the_same():
    decoder = protocol.FrameDecoder(lines="push")
    data = (
        b'\x00\x00\x00\x29L{"jsonrpc":"2.0","id":1,"method":"ping"}'
        + frame(b"lhalf") + frame('L and é'.encode())
        + frame(b'S{"seq":7,"ids":["m1","m2"]}\n{"jsonrpc":"2.0","id":4,"result":{}}')
        + frame(b'{"v":1,"push":"line","line":"as before"}')
    )
    assert decoder.feed(data) == [
        {"v": 1, "push": "line", "line": '{"jsonrpc":"2.0","id":1,"method":"ping"}'},
        {"v": 1, "push": "line", "line": "half", "more": True},
        {"v": 1, "push": "line", "line": " and é"},
        {"v": 1, "push": "line", "seq": 7, "ids": ["m1", "m2"],
         "line": '{"jsonrpc":"2.0","id":4,"result":{}}'},
        {"v": 1, "push": "line", "line": "as before"},
    ]


@pytest.mark.parametrize("payload, problem", [
    (b"L\xff\xfe", "line frame is not valid UTF-8"),
    ("lé".encode()[:2], "line frame is not valid UTF-8"),  # a part that ends inside a character
    (b'S{"seq":1}', "line frame: no end to its head"),
    (b'S{"ids":[]}\nx', "line frame: its head needs an integer seq"),
    (b"S[\n", "line frame: its head is not valid JSON"),
])
def test_a_bad_line_frame_is_a_protocol_error(payload, problem):
    with pytest.raises(protocol.ProtocolError, match=problem.replace("[", r"\[")):
        protocol.FrameDecoder(lines="relay").feed(frame(payload))


def test_without_wire_2_a_line_frame_as_bytes_is_not_json_as_before():
    with pytest.raises(protocol.ProtocolError, match="frame is not valid JSON"):
        protocol.FrameDecoder().feed(frame(b'L{"jsonrpc":"2.0","id":1,"method":"ping"}'))


class CountedStream:
    """A FramedStream over one end of a real socket pair, its writes counted (and held back until
    `go` is set)."""

    def __init__(self) -> None:
        from agent_bridge.ipc.stream import FramedStream

        ours, theirs = trio.socket.socketpair()
        self.stream = FramedStream(trio.SocketStream(ours))
        self.peer = FramedStream(trio.SocketStream(theirs))
        self.writes = 0
        self.written: list[bytes] = []  # each write's bytes, in order
        self.go = trio.Event()
        send = self.stream.send_encoded

        async def counted(data: bytes, **kwargs: Any) -> None:
            self.writes += 1
            self.written.append(bytes(data))
            await self.go.wait()
            await send(data, **kwargs)

        self.stream.send_encoded = counted  # type: ignore[method-assign]


async def test_the_frames_of_one_turn_go_to_the_relay_in_one_write():
    from agent_bridge.broker.mcp.outbox import Outbox

    counted = CountedStream()
    counted.go.set()
    outbox = Outbox(counted.stream)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in range(8):  # eight answers made in one turn, as the tasks of parallel calls make them
                nursery.start_soon(outbox.send, {"v": 1, "push": "line", "line": f"answer {i}"})
        got = [await counted.peer.receive() for _ in range(8)]
    assert counted.writes == 1
    assert sorted(f["line"] for f in got if f) == [f"answer {i}" for i in range(8)]


async def test_a_send_batch_is_answered_before_the_work_its_commit_started():
    """A batch of sends' answers (made together by broker.mcp.sends) is written at once, not
    held for the frames the scheduler's next turns make: after the commit, those are the
    delivery the commit woke, and the sender's next calls wait on these answers."""
    from agent_bridge.broker.mcp.outbox import Outbox
    from agent_bridge.broker.mcp.sdk import RelayPipe
    from agent_bridge.ipc import protocol

    counted = CountedStream()
    counted.go.set()
    outbox = Outbox(counted.stream)
    pipe = RelayPipe(outbox)
    answers = [(i, f'{{"jsonrpc":"2.0","id":{i},"result":{{}}}}') for i in (1, 2)]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            # the delivery the commit woke: it runs in the scheduler's next turn
            nursery.start_soon(outbox.send, {"v": 1, "push": "held", "message": {"id": "m1"}})
            await pipe.send_responses(answers)
            first = counted.written[:]
        got = [await counted.peer.receive() for _ in range(3)]
    assert [f["line"] for f in protocol.FrameDecoder().feed(first[0])] == [line for _, line in answers]
    assert [f.get("push") for f in got] == ["line", "line", "held"]  # the held push came after


async def test_a_result_waiting_for_its_write_is_on_its_way_for_a_cancel():
    """A cancel read while a watched result waits in the outbox finds it on its way (maybe
    shown: offered again as a repeat), not unsent."""
    from agent_bridge.broker.mcp.outbox import Outbox
    from agent_bridge.broker.mcp.sdk import RelayPipe

    counted = CountedStream()
    pipe = RelayPipe(Outbox(counted.stream))
    shown: list[str] = []
    pipe.watch(7, ["m1"], lambda: shown.append("m1"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            answer = '{"jsonrpc":"2.0","id":7,"result":{}}'
            nursery.start_soon(partial(pipe.send_response, 7, answer, shows=True))
            await trio.testing.wait_all_tasks_blocked()  # the write started, held back
            assert counted.writes == 1
            assert pipe.forget(7) is True
            counted.go.set()
    assert shown == []  # never reported written: nothing counts as shown


@pytest.mark.parametrize("wire", [None, 2])
def test_the_relay_sends_lines_as_bytes_only_to_a_broker_that_said_wire_2(tmp_path, wire):
    """A broker before wire 2 (its `mcp` answer as docs/ipc.md gave it, no "wire") gets the
    host's lines as JSON frames; one that says wire 2 gets the "wire" frame, then bytes."""
    import os
    import socket
    import threading

    from agent_bridge.relay import main as relay

    path = str(tmp_path / "b.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    payloads: list[bytes] = []

    def broker() -> None:  # played by hand: the answer written out, the frames after it read raw
        conn, _ = listener.accept()
        with conn:
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
                data += conn.recv(1 << 16)
            result: dict[str, Any] = {"session": {"id": "s1", "name": "n1"}, "hopLimit": 10,
                                      "secret": "x"}
            if wire is not None:
                result["wire"] = wire
            conn.sendall(json_frame({"v": 1, "id": 1, "ok": True, "result": result}))
            rest = b""
            while len(payloads) < (2 if wire else 1):
                rest += conn.recv(1 << 16)
                while len(rest) >= 4 and len(rest) >= 4 + struct.unpack(">I", rest[:4])[0]:
                    size = struct.unpack(">I", rest[:4])[0]
                    payloads.append(rest[4:4 + size])
                    rest = rest[4 + size:]

    thread = threading.Thread(target=broker, daemon=True)
    thread.start()
    _, out = os.pipe()
    options = relay.Options(agent="codex", project="/w/wire", kind="interactive", name=None,
                            host_session_id=None, claude_session_id=None, host=None, chain=[], home=tmp_path)
    host = relay.Relay(options, out)
    host.replay.host_request("initialize", dict(INITIALIZE))  # answered: replayed at each join
    host.replay.answered("initialize")
    link = host.join(path)
    thread.join(10)
    link.close()
    listener.close()
    if wire is None:
        assert len(payloads) == 1 and json.loads(payloads[0])["relay"] == "line"
        assert json.loads(json.loads(payloads[0])["line"])["method"] == "initialize"
    else:
        assert json.loads(payloads[0]) == {"v": 1, "relay": "wire", "wire": 2}
        assert payloads[1][:1] == b"L" and json.loads(payloads[1][1:])["method"] == "initialize"

"""The wire protocol, fed bytes written by hand from its description (not by its encoder)."""

from __future__ import annotations

import json
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_bridge.ipc import protocol
from agent_bridge.ipc.protocol import FrameDecoder, ProtocolError


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def test_decodes_a_hand_written_request():
    raw = frame(b'{"v":1,"id":7,"op":"whoami"}')
    [obj] = FrameDecoder().feed(raw)
    assert protocol.parse_request(obj) == (7, "whoami", {})


def test_frames_split_anywhere_and_glued_together():
    data = frame(b'{"v":1,"id":1,"op":"ping"}') + frame(
        '{"v":1,"id":2,"op":"decisions","query":"caf\u00e9"}'.encode()
    )
    decoder = FrameDecoder()
    got = []
    for i in range(len(data)):
        got.extend(decoder.feed(data[i : i + 1]))
    assert [protocol.parse_request(o)[:2] for o in got] == [(1, "ping"), (2, "decisions")]
    assert got[1]["query"] == "café"
    assert decoder.pending == 0


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (struct.pack(">I", 0), "outside"),
        (struct.pack(">I", protocol.MAX_FRAME + 1), "outside"),
        (struct.pack(">I", 0xFFFFFFFF), "outside"),
        (frame(b"\xff\xfe"), "UTF-8"),
        (frame(b"{nope"), "JSON"),
        (frame(b"[1,2]"), "object"),
        (frame(b'{"id":1,"op":"ping"}'), "version"),
        (frame(b'{"v":2,"id":1,"op":"ping"}'), "version"),
        (frame(b'{"v":true,"id":1,"op":"ping"}'), "version"),
    ],
)
def test_bad_frames_are_protocol_errors(raw, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        FrameDecoder().feed(raw)


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        ({"v": 1, "op": "ping"}, "id"),
        ({"v": 1, "id": -1, "op": "ping"}, "id"),
        ({"v": 1, "id": True, "op": "ping"}, "id"),
        ({"v": 1, "id": "1", "op": "ping"}, "id"),
        ({"v": 1, "id": 1, "op": "drop_tables"}, "unknown op"),
        ({"v": 1, "id": 1}, "unknown op"),
    ],
)
def test_bad_requests(obj, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        protocol.parse_request(obj)


def test_encoder_agrees_with_the_description():
    assert protocol.encode({"v": 1, "id": 3, "op": "ping"}) == frame(b'{"v":1,"id":3,"op":"ping"}')
    with pytest.raises(ProtocolError):
        protocol.encode({"v": 1, "blob": "x" * protocol.MAX_FRAME})


# --- against a live broker --------------------------------------------------------------


def _raw_exchange(sock_path: str, data: bytes, timeout: float = 10.0) -> list[dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        decoder = FrameDecoder()
        frames = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return frames
            frames.extend(decoder.feed(chunk))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("data", "code", "fragment"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "protocol", "outside"),
        (frame(b"not json"), "protocol", "JSON"),
        (frame(b'{"v":9,"id":1,"op":"ping"}'), "protocol", "version"),
        (frame(b'{"v":1,"id":1,"op":"nope"}'), "protocol", "unknown op"),
        (frame(b'{"v":1,"id":1,"op":"whoami"}'), "bad_request", "hello first"),
        (
            frame(b'{"v":1,"id":1,"op":"hello","agent":"claude","project":"relative"}'),
            "bad_request",
            "relative",
        ),
        (
            frame(b'{"v":1,"id":1,"op":"hello","agent":"claude","project":"/x","kind":"robot"}'),
            "bad_request",
            "kind",
        ),
        (frame(b'{"v":1,"id":1,"op":"identify","hostSessionId":""}'), "bad_request", "hostSessionId"),
        (
            frame(b'{"v":1,"id":1,"op":"identify","hostSessionId":"h","host":{"pid":"x"}}'),
            "bad_request",
            "host",
        ),
        (frame(b'{"v":1,"id":1,"op":"ping"}')[:7], "protocol", "middle of a frame"),
    ],
)
def test_broker_answers_bad_frames_and_survives(broker, data, code, fragment):
    sock_path = broker.status()["socket"]
    frames = _raw_exchange(sock_path, data)
    assert frames, "the broker closed without saying why"
    err = frames[-1]["error"]
    assert err["code"] == code and fragment in err["message"]
    assert broker.status()["pid"] == broker.pid  # still up and answering


@pytest.mark.slow
def test_hello_then_requests_over_raw_bytes(broker):
    sock_path = broker.status()["socket"]
    data = frame(b'{"v":1,"id":1,"op":"hello","agent":"codex","project":"/tmp/raw-proj","kind":"job"}')
    data += frame(b'{"v":1,"id":2,"op":"whoami"}')
    data += frame(b'{"v":1,"id":3,"op":"decide","topic":" Raw ","text":"bytes","scope":"all"}')
    data += frame(b'{"v":1,"id":4,"op":"decide","topic":"x","text":"y","scope":{"folder":"/x"}}')
    data += frame(b'{"v":1,"id":5,"op":"whoami","extra":1}')
    frames = [f for f in _raw_exchange(sock_path, data) if "push" not in f]
    by_id = {f["id"]: f for f in frames}
    assert by_id[1]["ok"] and by_id[1]["result"]["session"]["name"] == "codex-raw-proj"
    assert by_id[2]["result"]["kind"] == "job"
    assert by_id[3]["result"]["decision"]["topic"] == "raw"
    assert by_id[3]["result"]["deliveredTo"] == []  # a job runner is never notified
    assert not by_id[4]["ok"] and 'unknown key "folder"' in by_id[4]["error"]["message"]
    assert not by_id[5]["ok"] and "unknown argument 'extra'" in by_id[5]["error"]["message"]


# --- FramedStream over a real socket pair ------------------------------------------------


def _stream_pair(sndbuf: int | None = None):
    import trio

    from agent_bridge.ipc.stream import FramedStream

    left, right = trio.socket.socketpair()
    if sndbuf:
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    return FramedStream(trio.SocketStream(left)), FramedStream(trio.SocketStream(right))


async def test_frames_larger_than_the_socket_buffer_arrive_whole_and_in_order():
    """The socket takes part of a frame at once; the rest waits for the reader."""
    import trio

    writer, reader = _stream_pair(sndbuf=4096)
    big = {"v": 1, "push": "message", "text": "x" * 600_000}
    small = [{"v": 1, "id": i, "ok": True, "result": i} for i in range(50)]
    got = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def write() -> None:
                await writer.send(small[0])
                await writer.send(big)
                await writer.send_many(small[1:])
                await writer.send(big)

            nursery.start_soon(write)
            while len(got) < 52:
                frame_ = await reader.receive()
                assert frame_ is not None
                got.append(frame_)
    assert got == [small[0], big, *small[1:], big]
    await writer.aclose()
    await reader.aclose()


async def test_sending_to_a_closed_peer_is_a_broken_stream():
    import trio

    writer, reader = _stream_pair()
    await reader.aclose()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(3):  # the first write may still be taken by the kernel
            await writer.send({"v": 1, "id": 1, "ok": True, "result": None})
    await writer.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await writer.send({"v": 1, "id": 2, "ok": True, "result": None})


def test_every_op_of_the_protocol_table_has_its_broker_handlers_and_no_more():
    """The protocol's op table is the one list: the broker's handlers and the MCP server's
    resend rule derive from it (a handler for an op it lacks, or the reverse, fails loading)."""
    from agent_bridge.broker import state as broker
    from agent_bridge.broker.ops import handlers
    from agent_bridge.common import tools

    assert handlers.MODULES  # the handlers register as their modules load (this test alone, too)
    assert set(broker.SESSION_HANDLERS) == {n for n, op in protocol.OPS.items() if op.session}
    assert set(broker.CONTROL_HANDLERS) == {n for n, op in protocol.OPS.items() if op.control}
    # The relay resends a tool call after a lost connection exactly when its op is idempotent.
    resent = {name for name in tools.TOOLS if tools.idempotent(name)}
    assert resent == {
        name for name, t in tools.TOOLS.items() if t.op is None or t.op in protocol.IDEMPOTENT_OPS
    }
    assert {"send", "decide"}.isdisjoint(resent)
    assert {"send", "decide"} <= protocol.SESSION_OPS & protocol.CONTROL_OPS  # the command line's too
    assert not protocol.OPS["send"].idempotent and not protocol.OPS["decide"].idempotent
    broker.SESSION_HANDLERS["nonsense"] = broker.SESSION_HANDLERS["ping"]
    try:
        with pytest.raises(RuntimeError, match="handlers of no session op: \\['nonsense'\\]"):
            broker.check_handlers()
    finally:
        del broker.SESSION_HANDLERS["nonsense"]


# Text that may hold lone surrogates (category Cs), as JSON's \ud800 escapes can.
ANY_TEXT = st.text(st.characters() | st.integers(0xD800, 0xDFFF).map(chr), max_size=6)


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=20,
))
def test_unstorable_text_finds_a_lone_surrogate_exactly_when_utf8_cannot_hold_the_value(value):
    """Whatever its quick path skips, the answer is UTF-8's: None when the value's JSON encodes,
    else a place, and the string found there is one UTF-8 cannot hold."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert protocol.unstorable_text(value) is not None
    else:
        assert protocol.unstorable_text(value) is None

"""The broker connection (agent_bridge.relay.link) over a real socket pair: queued frames go
in one write, before anything sent after them."""

from __future__ import annotations

import _socket
import socket
from contextlib import closing

import pytest

from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import PING, Written, line_frames, read_relay, relay_frame
from agent_bridge.relay.link import Link


def frames_on(sock: socket.socket, count: int) -> list[dict]:
    decoder, got = protocol.FrameDecoder(), []
    while len(got) < count:
        got += decoder.feed(sock.recv(1 << 16))
    return got


def test_queued_lines_go_together_and_before_what_is_sent_after_them():
    ours, broker = socket.socketpair()
    with ours, broker:
        link = Link(ours)
        link.queue(line_frames('{"id":1}'))
        link.queue(line_frames('{"id":2}'))
        broker.settimeout(0)
        try:
            broker.recv(1)
            raise AssertionError("a queued frame was sent before its batch ended")
        except BlockingIOError:
            pass
        broker.settimeout(10)
        link.send([Written(5)])
        got = [read_relay(obj) for obj in frames_on(broker, 3)]
        assert [type(f).__name__ for f in got] == ["Line", "Line", "Written"]
        assert [got[0].line, got[1].line] == ['{"id":1}', '{"id":2}']
        link.queue([PING])
        link.flush()
        link.flush()  # nothing left: nothing sent
        assert [read_relay(obj) for obj in frames_on(broker, 1)] == [PING]


def test_frames_read_together_are_handed_out_one_by_one_and_say_more_is_ready():
    ours, broker = socket.socketpair()
    with ours, broker:
        link = Link(ours)
        broker.sendall(b"".join(protocol.encode({"v": 1, "push": "line", "line": f"l{i}"}) for i in range(3)))
        ours.settimeout(10)
        first = link.receive()
        assert first is not None and first["line"] == "l0" and link.more_ready
        assert link.receive()["line"] == "l1"  # type: ignore[index]
        assert link.receive()["line"] == "l2" and not link.more_ready  # type: ignore[index]
        broker.close()
        assert link.receive() is None


@pytest.mark.parametrize("c_level", [False, True])
def test_a_silent_broker_times_the_receive_out_and_the_link_still_works(c_level):
    """On a socket (the relay's is the C-level `_socket.socket`, as ipc.blocking makes it) the
    kernel times the silence: no Python timeout, which polls before every send and receive."""
    ours, broker = socket.socketpair()
    if c_level:
        ours = _socket.socket(fileno=ours.detach())
    with closing(ours), broker:
        link = Link(ours)
        link.keep_alive(0.05)  # the kernel's timer, not a poll before each call
        assert ours.gettimeout() is None
        try:
            link.receive()
            raise AssertionError("a silent broker gave a frame")
        except TimeoutError:
            pass
        broker.sendall(protocol.encode({"v": 1, "push": "line", "line": "after"}))
        assert link.receive()["line"] == "after"  # type: ignore[index]


@pytest.mark.parametrize("line", [
    '{"jsonrpc":"2.0","id":1,"method":"ping"}',
    '{"text":"caf\u00e9 \\"quoted\\" \\\\ \u2028 \U0001f600"}',
    "control \x00\x1f\x7f and a tab\t",
    "x" * 450_001,  # longer than a frame takes: in parts
])
def test_a_host_line_queued_directly_is_the_frames_the_encoder_makes(line):
    """`queue_line` builds a `Line` frame's bytes itself (the hot path); they must be exactly what
    `protocol.encode` makes of the frame, parts and all."""
    ours, broker = socket.socketpair()
    with ours, broker:
        link = Link(ours)
        link.queue_line(line)
        direct = b"".join(link._queued)
        expected = b"".join(protocol.encode(relay_frame(f)) for f in line_frames(line))
        assert direct == expected

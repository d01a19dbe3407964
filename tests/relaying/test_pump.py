"""The relay's one-thread pump (agent_bridge.relay.pump) over a real pipe (the host's input)
and a real socket pair (the broker connection), driven one `step` at a time: what it hands the
relay, the wake-up when another thread hands it a connection, the ping and the stall, and
sends that never wait."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import PING, Line, RelayFrame, read_relay
from agent_bridge.relay.host_io import HostInput, write_all
from agent_bridge.relay.link import Link
from agent_bridge.relay.pump import Pump

KEEPALIVE = 15.0


class Relay:
    """The relay as the pump sees it (relay.pump.Pumped), recording what it is handed."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.link: Link | None = None
        self.lines: list[str] = []
        self.flushed_after: list[int] = []  # how many lines had come at each flush
        self.frames: list[dict[str, Any]] = []
        self.ended: list[Link] = []
        self.broke: list[Exception] = []

    def on_host_line(self, line: str, more: bool = False) -> None:
        self.lines.append(line)

    def flush(self) -> None:
        self.flushed_after.append(len(self.lines))

    def on_frames(self, link: Link, frames: list[dict[str, Any]], flush: bool = True) -> None:
        self.frames += frames

    def end_link(self, link: Link) -> None:
        link.close()
        link.ended.set()
        self.link = None
        self.ended.append(link)

    def send(self, link: Link, frames: Sequence[RelayFrame], queue: bool = False) -> None:
        link.send(frames)

    def broken(self, link: Link, exc: Exception) -> None:
        self.broke.append(exc)
        try:
            link.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # shut already
            pass


@contextmanager
def pumped() -> Iterator[tuple[Pump, Relay, Link, socket.socket, int]]:
    """A pump over a host pipe and a connection already handed to it: (pump, relay, link, the
    broker's end, the host's write end)."""
    read_end, write_end = os.pipe()
    ours, broker = socket.socketpair()
    relay = Relay()
    link = Link(ours)
    link.keep_alive(KEEPALIVE)  # as the relay's hello leaves it: a send that waits would fail, not hang
    link.pump()
    relay.link = link
    pump = Pump(relay, HostInput(read_end), KEEPALIVE)
    try:
        yield pump, relay, link, broker, write_end
    finally:
        for fd in (read_end, write_end, pump.wake_r, pump.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        ours.close()
        broker.close()


def frames_on(sock: socket.socket, count: int) -> list[dict[str, Any]]:
    decoder, got = protocol.FrameDecoder(), []
    sock.settimeout(10)
    while len(got) < count:
        got += decoder.feed(sock.recv(1 << 16))
    return got


def push(line: str) -> bytes:
    return protocol.encode({"v": 1, "push": "line", "line": line})


def steps_until(pump: Pump, done: Any, host: bool = True, limit: int = 50) -> None:
    """Steps (each waits only until something is ready) until `done()`."""
    for _ in range(limit):
        if done():
            return
        pump.step(10, host=host)
    raise AssertionError("not done after the steps")


def test_host_lines_and_broker_frames_reach_the_relay_and_the_end_of_input_ends_the_run():
    with pumped() as (pump, relay, _link, broker, host_w):
        write_all(host_w, b'{"a":1}\n\n{"b":2}\n{"c"')
        broker.sendall(push("one") + push("two"))
        steps_until(pump, lambda: len(relay.lines) == 2 and len(relay.frames) == 2)
        assert relay.lines == ['{"a":1}', '{"b":2}']  # blank skipped, the partial line kept
        assert relay.flushed_after == [2]  # what one read brought is sent together
        assert [f["line"] for f in relay.frames] == ["one", "two"]
        write_all(host_w, b":3}\n")
        os.close(host_w)
        assert pump.step(10, host=True)  # the rest of the line
        assert relay.lines[-1] == '{"c":3}'
        assert pump.step(10, host=True) is False  # the end of the host's input


def test_lines_read_before_the_pump_ran_are_handled_first():
    with pumped() as (pump, relay, _link, _broker, host_w):
        pump.host.pending.extend([b'{"early":1}'])
        os.close(host_w)
        pump.run()
        assert relay.lines == ['{"early":1}']


def test_frames_read_with_the_hello_are_handed_over_without_new_bytes():
    ours, broker = socket.socketpair()
    read_end, write_end = os.pipe()
    with ours, broker:
        link = Link(ours)
        broker.sendall(push("hello's answer") + push("identity"))
        ours.settimeout(10)
        assert link.receive()["line"] == "hello's answer"  # type: ignore[index]
        assert link.more_ready
        link.pump()
        relay = Relay()
        relay.link = link
        pump = Pump(relay, HostInput(read_end), KEEPALIVE)
        pump.step(0, host=False)
        assert [f["line"] for f in relay.frames] == ["identity"]
        for fd in (read_end, write_end, pump.wake_r, pump.wake_w):
            os.close(fd)


def test_a_connection_handed_over_by_another_thread_wakes_the_waiting_pump():
    read_end, write_end = os.pipe()
    ours, broker = socket.socketpair()
    relay = Relay()
    pump = Pump(relay, HostInput(read_end), KEEPALIVE)
    link = Link(ours)
    with ours, broker:
        def join() -> None:  # as the broker thread does: join, then hand the connection over
            relay.link = link
            pump.serve(link)  # returns once the connection has ended

        joiner = threading.Thread(target=join, daemon=True)
        joiner.start()
        assert pump.step(None, host=True)  # no host line, no timeout: woken by the hand-over
        broker.sendall(push("answer"))
        steps_until(pump, lambda: relay.frames)
        assert relay.frames[0]["line"] == "answer"
        broker.close()
        steps_until(pump, lambda: relay.ended)  # the end of the stream: the relay settles it
        joiner.join(10)
        assert not joiner.is_alive() and relay.ended == [link]
    for fd in (read_end, write_end, pump.wake_r, pump.wake_w):
        os.close(fd)


def test_a_silent_broker_gets_a_ping():
    with pumped() as (pump, _relay, link, broker, _host_w):
        pump.step(0, host=False)
        broker.setblocking(False)
        try:
            broker.recv(1)
            raise AssertionError("a ping before the broker was silent")
        except BlockingIOError:
            pass
        link.heard = time.monotonic() - KEEPALIVE  # silent for as long
        pump.step(0, host=False)
        assert [read_relay(f) for f in frames_on(broker, 1)] == [PING]


def fill(link: Link) -> int:
    """Frames sent until the socket takes no more (the broker reads nothing): how many."""
    sent = 0
    while not link.backlog:
        link.send([Line(f"{sent:06d}" + "x" * 60_000)])
        sent += 1
    return sent


def test_sends_never_wait_and_the_broker_is_still_read_meanwhile():
    with pumped() as (pump, relay, link, broker, _host_w):
        sent = fill(link)  # would fail after KEEPALIVE seconds if a send waited
        broker.sendall(push("while stalled"))
        steps_until(pump, lambda: relay.frames, host=False)  # read though the sending is stuck
        assert relay.frames[0]["line"] == "while stalled"
        link.send([PING])  # after the backlog, in order
        got: list[dict[str, Any]] = []
        decoder = protocol.FrameDecoder()
        broker.setblocking(False)
        while len(got) < sent + 1:
            try:
                got += decoder.feed(broker.recv(1 << 20))
            except BlockingIOError:
                pass
            if link.backlog:
                pump.step(10, host=False)  # drains what the broker made room for
        frames = [read_relay(f) for f in got]
        assert [f.line[:6] for f in frames[:-1]] == [f"{i:06d}" for i in range(sent)]  # type: ignore[union-attr]
        assert frames[-1] == PING and not link.backlog and not relay.broke


def test_a_broker_that_takes_nothing_for_the_keepalive_is_broken():
    with pumped() as (pump, relay, link, _broker, _host_w):
        fill(link)
        pump.step(0, host=False)
        assert not relay.broke
        link.stalled = time.monotonic() - KEEPALIVE
        pump.step(0, host=False)
        assert len(relay.broke) == 1 and isinstance(relay.broke[0], TimeoutError)
        steps_until(pump, lambda: relay.ended, host=False)  # broken: its end is read and settled

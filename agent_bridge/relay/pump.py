"""The relay's pump on one thread (POSIX): the host's input, the broker connection and a wake-up
pipe watched by one `select` on the main thread, each ready one handed to the relay.

With a thread per side, a broker's push that arrives while the host's next line is being handled
makes the two threads take turns at the interpreter lock: futex calls and task switches per
message that do no work. Here each side's bytes wait in the kernel until the one thread gets to
them. The broker thread (relay.connector) still finds, starts and joins the broker, and hands
each connection it joins to the pump (`serve`), then waits for it to end.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agent_bridge.ipc import protocol
from agent_bridge.ipc.frames import PING, RelayFrame
from agent_bridge.relay.host_io import HostInput
from agent_bridge.relay.link import Link

log = logging.getLogger("agent_bridge.mcp")


class Pumped(Protocol):
    """What the pump needs of the relay (agent_bridge.relay.main.Relay)."""

    lock: threading.RLock
    cond: threading.Condition
    link: Link | None

    def on_host_line(self, line: str, more: bool = False) -> None: ...
    def flush(self) -> None: ...
    def on_frames(self, link: Link, frames: list[dict[str, Any]], flush: bool = True) -> None: ...
    def end_link(self, link: Link) -> None: ...
    def send(self, link: Link, frames: Sequence[RelayFrame], queue: bool = False) -> None: ...
    def broken(self, link: Link, exc: Exception) -> None: ...


class Pump:
    """`run` until the host closes its input; `wait_for` serves the broker alone (the host gone).
    A connection silent for `keepalive` seconds gets a ping; one that takes none of the bytes
    waiting for it for as long is broken (as a socket's SO_RCVTIMEO and SO_SNDTIMEO do for a
    thread that waits on it)."""

    def __init__(self, relay: Pumped, host: HostInput, keepalive: float) -> None:
        self.relay = relay
        self.host = host
        self.keepalive = keepalive
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        self.served: Link | None = None  # the connection whose frames read with the hello are handled

    # --- the broker thread --------------------------------------------------------------

    def serve(self, link: Link) -> None:
        """`link` (joined: the relay's `link`) is read by the pump from now on; returns once it
        has ended."""
        link.pump()
        self.wake()
        link.ended.wait()  # not `cond`: that is notified at every answer

    def wake(self) -> None:
        try:
            os.write(self.wake_w, b"\0")
        except BlockingIOError:  # woken already
            pass

    # --- the main thread ----------------------------------------------------------------

    def run(self) -> None:
        """Until the host closes its input (its last lines handled)."""
        if self.host.pending:  # read before the pump ran (agent_bridge.relay.quick)
            self.take_host_lines()
        while self.step(None, host=True):
            pass

    def take_host_lines(self) -> None:
        relay = self.relay
        for line in self.host.take():
            relay.on_host_line(line, True)
        relay.flush()

    def wait_for(self, done: Callable[[], bool], timeout: float) -> bool:
        """The broker's frames served until `done()` (called under the relay's lock), or `timeout`
        seconds: whether it is done."""
        deadline = time.monotonic() + timeout
        while True:
            with self.relay.lock:
                if done():
                    return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.step(left, host=False)

    def step(self, timeout: float | None, host: bool) -> bool:
        """One wait, and what it found ready handled; False once the host's input ended."""
        relay = self.relay
        link = relay.link
        reading: list[Any] = [self.wake_r, self.host.fd] if host else [self.wake_r]
        writing: list[Any] = []
        if link is not None and link.pumped:
            if link is not self.served:
                self.served = link
                ready = link.take_ready()
                if ready:
                    relay.on_frames(link, ready)
            quiet = self.kept_alive(link)
            timeout = quiet if timeout is None else min(timeout, quiet)
            reading.append(link.sock)
            if link.backlog:
                writing.append(link.sock)
        else:
            link = None
        readable, writable, _ = select.select(reading, writing, [], timeout)
        if link is not None:
            if writable:
                try:
                    link.drain()
                except OSError as exc:
                    relay.broken(link, exc)
            if link.sock in readable:
                self.receive(link)
        if self.wake_r in readable:
            os.read(self.wake_r, 512)
        if host and self.host.fd in readable:
            more = self.host.read()
            self.take_host_lines()
            return more
        return True

    def kept_alive(self, link: Link) -> float:
        """A ping for a broker silent too long, a stalled connection broken; the seconds until
        the next look."""
        now = time.monotonic()
        if now - link.heard >= self.keepalive:
            link.heard = now
            self.relay.send(link, [PING])
        if link.backlog and now - link.stalled >= self.keepalive:
            self.relay.broken(link, TimeoutError("the broker took nothing for too long"))
        return max(0.0, link.heard + self.keepalive - now)

    def receive(self, link: Link) -> None:
        relay = self.relay
        try:
            frames = link.receive_ready()
        except (OSError, protocol.ProtocolError) as exc:
            log.info("broker connection lost: %s", exc)
            frames = None
        if frames is None:
            relay.end_link(link)
        elif frames:
            relay.on_frames(link, frames)


def batched() -> None:
    """This thread (the pump's: every frame of the relay passes through it) at Linux's batch
    policy (SCHED_BATCH, sched(7): its share of the CPU unchanged, but the scheduler does not let
    its wake-ups preempt the thread running, kernel/sched/fair.c). Each push of the broker's
    wakes the relay; at the normal policy that wake-up took the broker's core from it in the
    middle of its write, about one write in two on a busy 2-core machine, and the relay then ran
    for each frame alone. Batched, the broker finishes its pass (or the relay finds a free core),
    and the relay takes what has come by then in one read (docs/performance.md, stop 68). Called
    by the relay's main thread, the pump's, once it started its other threads: the broker
    thread, which starts a broker when none runs, keeps the normal policy, and so does that
    broker (a child inherits the policy of the thread that forks it). For the rest of the
    thread's life: not for a pump run in another program."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError) as exc:  # not Linux, or refused: the normal policy serves
        log.debug("the pump keeps the normal scheduling policy: %s", exc)


def read_here(relay: Pumped, link: Link) -> None:
    """Without a pump (a named pipe; Windows): `link` read on the calling thread, frame by frame,
    until it ends; the lines of frames read together are written together."""
    try:
        while True:
            try:
                incoming = link.receive()
            except TimeoutError:
                relay.send(link, [PING])
                continue
            if incoming is None:
                break
            relay.on_frames(link, [incoming], flush=not link.more_ready)
    except (OSError, protocol.ProtocolError) as exc:
        log.info("broker connection lost: %s", exc)
    finally:
        relay.end_link(link)

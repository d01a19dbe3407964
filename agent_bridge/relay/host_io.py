"""The host's side of the pump: its lines in (HostInput), whole lines out (HostOutput, write_all),
and the leaving signals put off while the input changes hands (HostInput.deferring) or a line
that shows messages is written and noted (ShowingWrite).

Hosts end their MCP servers with SIGINT, then SIGTERM; the relay's handler reads the host's
unread input (`HostInput.unread`) for cancels sent before the signal, so every line must be in
exactly one of the places it looks at, at every moment a handler can run.
"""

from __future__ import annotations

import os
import select
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

READ_CHUNK = 1 << 16
UNREAD_MAX = 1 << 20  # bytes of unread host input looked through for cancels at a signal
LEAVING_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # hosts end their MCP servers with these
SIGNAL_MASKS = hasattr(signal, "pthread_sigmask")  # POSIX
try:  # the C function: `signal.pthread_sigmask` wraps it to turn each signal into an enum (per read)
    from _signal import pthread_sigmask as _sigmask
except ImportError:  # another Python, or Windows (no masks there: SIGNAL_MASKS is False)
    _sigmask = getattr(signal, "pthread_sigmask", None)


class ShowingWrite:
    """Writing a line that shows messages and noting it shown (`around`): the thread that is
    there, for a leaving signal's handler that interrupts it (leaving.on_signal), and what that
    handler leaves to be done at its end (`then`)."""

    def __init__(self) -> None:
        self.thread: int | None = None
        self.then: Callable[[], object] | None = None

    @contextmanager
    def around(self) -> Iterator[None]:
        self.thread = threading.get_ident()
        try:
            yield
        finally:
            self.thread = None
            if self.then is not None:
                self.then()

    def here(self) -> bool:
        """Whether the calling thread is inside (for a handler: the thread it interrupted)."""
        return self.thread == threading.get_ident()


@contextmanager
def signals_held() -> Iterator[None]:
    """LEAVING_SIGNALS held (POSIX; Windows has no signal masks) while the relay starts its other
    threads, which inherit the mask: the main thread alone takes them (their handler reads the
    host's input, HostInput.unread, which that thread changes), and a process such a thread
    starts does not hold them (it takes them again itself, as the broker does)."""
    if not SIGNAL_MASKS:
        yield
        return
    before = _sigmask(signal.SIG_BLOCK, LEAVING_SIGNALS)
    try:
        yield
    finally:
        _sigmask(signal.SIG_SETMASK, before)


class HostInput:
    """The host's lines on `fd`, decoded as the SDK decodes them (UTF-8, bad bytes replaced).

    `lines` yields None after the last line of each read: what was read together has been
    handed over (the pump sends what it buffered for the broker then). The one-thread pump
    (relay.pump) calls `read` when the descriptor is readable, then handles what `take` gives."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.current = b""  # the line being handled
        self.pending: deque[bytes] = deque()  # lines read and not handed over yet
        self.rest = b""  # the start of a line not complete yet
        self.reading = False  # a read's bytes are not in `pending` or `rest` yet
        self.deferred: Callable[[], object] | None = None  # a signal's handler, put off by `reading`

    def lines(self) -> Iterator[str | None]:
        while True:
            if self.pending:
                yield from self.take()
                yield None
            if SIGNAL_MASKS:  # wait with the signals open; the read itself does not wait then
                select.select([self.fd], [], [])
            if not self.read():
                yield from self.take()
                return

    def read(self) -> bool:
        """One read (it waits only if nothing is ready): its complete lines join `pending`;
        False at the end of the input, with the last line, unended, pending too."""
        self.reading = SIGNAL_MASKS  # POSIX, where a read follows a select: it does not wait
        try:  # the bytes read are in `pending` or `rest` before a handler runs (`deferring`)
            chunk = os.read(self.fd, READ_CHUNK)
            if chunk:
                *complete, self.rest = (self.rest + chunk).split(b"\n")
                self.pending.extend(complete)
            else:
                self.pending.append(self.rest)
                self.rest = b""
        finally:
            self.reading = False
        if self.deferred is not None:
            deferred, self.deferred = self.deferred, None
            deferred()
        return bool(chunk)

    def deferring(self, handler: Callable[[], object]) -> Callable[..., None]:
        """A signal handler that runs `handler`, or, while a read's bytes are on their way to
        `pending` (where `unread` looks), right after they got there. A flag, not a signal
        mask: two system calls a read saved; Python runs handlers on the main thread only,
        between its bytecodes, and this thread is the one that reads."""
        def on_signal(*_: object) -> None:
            if self.reading:
                self.deferred = handler
            else:
                handler()
        return on_signal

    def take(self) -> Iterator[str]:
        """The pending lines, blank ones skipped, each `current` while it is handled."""
        pending = self.pending
        while pending:
            # The line is made current before it leaves `pending`: a handler running in
            # between finds it twice (a cancel taken back twice is taken back once), never not
            # at all. No signal mask per line: two system calls a line saved.
            self.current = pending[0]
            pending.popleft()
            if self.current.strip():
                yield self.current.decode("utf-8", "replace")
        self.current = b""

    def unread(self) -> bytes:
        """What the host wrote and was not handled to its end: the line being handled (a signal
        may have interrupted that), the lines read after it, and what has not been read yet (up
        to UNREAD_MAX, without waiting)."""
        data = bytearray(b"\n".join([self.current, *self.pending, self.rest]))
        try:  # polled, not made non-blocking: stdin may be a terminal this process shares
            while SIGNAL_MASKS and len(data) < UNREAD_MAX and select.select([self.fd], [], [], 0)[0]:
                chunk = os.read(self.fd, READ_CHUNK)
                if not chunk:
                    break
                data += chunk
        except OSError:  # closed
            pass
        return bytes(data)


def write_all(fd: int, data: bytes) -> None:
    """All of `data` to `fd` (a pipe may take it in parts); OSError when the reader is gone."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class HostOutput:
    """Whole lines to the host's stdout (`fd`), under one lock: written at once (`write`), or
    buffered (`buffer`: the broker's lines read together) and written together by the next
    `write` or `flush`. `gone` runs when the host closed its end: the session is over."""

    def __init__(self, fd: int, gone: Callable[[], object]) -> None:
        self.fd = fd
        self.gone = gone
        self.lock = threading.Lock()
        self.buffered: list[bytes] = []
        self.answers = 0  # answers among the buffered lines
        self.shared: int | None = None  # the pipe again, for the lock other writers take (share)

    def share(self) -> None:
        """Other processes write lines to the same pipe (relay.router and its sessions' relays):
        each write holds an exclusive flock on the pipe, taken through an open file description
        of its own (`/proc/self/fd`, Linux), so that a line longer than the pipe writes at once
        (PIPE_BUF) is never cut by another's. Where there is no such path, lines up to PIPE_BUF
        bytes are still written whole, as the kernel writes them."""
        try:
            self.shared = os.open(f"/proc/self/fd/{self.fd}", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            self.shared = None

    def write(self, line: str) -> None:
        """One line, after the lines buffered before it; returns once the pipe has all of it."""
        with self.lock:
            self.buffered.append((line + "\n").encode("utf-8", "surrogatepass"))
            self._write_buffered()

    def buffer(self, line: str, answer: bool) -> None:
        """One line for the next write (`answer`: it answers a request)."""
        with self.lock:
            self.buffered.append((line + "\n").encode("utf-8", "surrogatepass"))
            self.answers += answer

    def flush(self) -> int:
        """The buffered lines, written; returns how many answers they held."""
        with self.lock:
            if self.buffered:
                self._write_buffered()
            answered, self.answers = self.answers, 0
        return answered

    def _write_buffered(self) -> None:
        data, self.buffered = b"".join(self.buffered), []
        try:
            if self.shared is None:
                write_all(self.fd, data)
                return
            import fcntl

            fcntl.flock(self.shared, fcntl.LOCK_EX)
            try:
                write_all(self.fd, data)
            finally:
                fcntl.flock(self.shared, fcntl.LOCK_UN)
        except OSError:
            self.gone()

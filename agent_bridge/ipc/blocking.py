"""A blocking, standard-library client for one-shot control requests (hooks, CLI).

No Trio: the hooks use this at every session start and stop.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from agent_bridge.common import paths
from agent_bridge.ipc import peercred, protocol

try:  # the C module: `socket` builds its enums at import, ~2 ms of every hook run (SPEC §9)
    from _socket import AF_UNIX, SOCK_STREAM  # type: ignore[attr-defined, unused-ignore]
    from _socket import socket as _socket_type
except ImportError:  # interpreters without it
    from socket import AF_UNIX, SOCK_STREAM  # type: ignore[attr-defined, unused-ignore]
    from socket import socket as _socket_type  # type: ignore[assignment]


class BrokerUnavailable(OSError):
    """No broker answers on this home's socket."""


def broker_socket(home_dir: Path) -> str | None:
    """The socket of the running broker, or None when no broker record or process exists."""
    record = paths.read_broker_json(home_dir)
    if not record:
        return None
    pid = record.get("pid")
    sock = record.get("socket")
    if not isinstance(pid, int) or not isinstance(sock, str) or not paths.pid_alive(pid):
        return None
    return sock


def _connect(address: str, timeout: float) -> Any:
    """The broker's Unix socket, or its named pipe on Windows (the same sendall/recv/settimeout)."""
    if sys.platform == "win32":
        from agent_bridge.ipc.pipe import BlockingPipe

        return BlockingPipe(address, timeout)
    sock = _socket_type(AF_UNIX, SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        peercred.check_server(sock, address)  # before a byte is sent: this user's broker only
    except BaseException:
        sock.close()
        raise
    return _Closing(sock)


def connect(address: str, timeout: float) -> Any:
    """A connection to the broker for a client that keeps it open (the `agent-bridge mcp`
    relay): a socket, or a named pipe with the same sendall/recv/settimeout/close."""
    conn = _connect(address, timeout)
    return conn.sock if isinstance(conn, _Closing) else conn


class _Closing:
    """`with` for the C-level socket, which has no context manager of its own."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock

    def __enter__(self) -> Any:
        return self.sock

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def call(home_dir: Path, op: str, *, timeout: float = 2.0, **args: Any) -> Any:
    """Send one control request and return its result. Raises BrokerUnavailable or RemoteError."""
    sock_path = broker_socket(home_dir)
    if sock_path is None:
        raise BrokerUnavailable("no broker is running")
    deadline = time.monotonic() + timeout
    try:
        with _connect(sock_path, timeout) as sock:
            sock.sendall(protocol.encode(protocol.request(1, op, **args)))
            decoder = protocol.FrameDecoder()
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BrokerUnavailable("the broker did not answer in time")
                sock.settimeout(remaining)
                data = sock.recv(65536)
                if not data:
                    raise BrokerUnavailable("the broker closed the connection")
                for frame in decoder.feed(data):
                    if frame.get("id") != 1:
                        continue
                    if frame.get("ok"):
                        return frame.get("result")
                    err = frame.get("error") or {}
                    raise protocol.RemoteError(str(err.get("code")), str(err.get("message")))
    except (TimeoutError, ConnectionError, FileNotFoundError) as exc:
        raise BrokerUnavailable(str(exc) or type(exc).__name__) from None

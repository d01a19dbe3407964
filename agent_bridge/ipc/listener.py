"""The broker's Unix-socket listener: 0700 folder, 0600 socket, peer uid checked."""

from __future__ import annotations

import logging
import os
import socket as stdsocket
import struct
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

log = logging.getLogger("agent_bridge.ipc")

BACKLOG = 256  # 200 sessions reconnect at once after a broker restart


def peer_uid(sock: trio.socket.SocketType) -> int | None:
    """The uid of the process at the other end of a Unix socket, or None if unknown."""
    if hasattr(stdsocket, "SO_PEERCRED"):
        creds = sock.getsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_PEERCRED, struct.calcsize("3i"))
        uid: int = struct.unpack("3i", creds)[1]
        return uid
    if sys.platform == "darwin":  # LOCAL_PEERCRED: struct xucred {u_int version; uid_t uid; ...}
        creds = sock.getsockopt(0, 0x001, struct.calcsize("2I"))
        xuid: int = struct.unpack("2I", creds)[1]
        return xuid
    return None


def prepare_socket_path(path: str) -> None:
    folder = Path(path).parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        if st.st_uid == os.getuid():
            folder.chmod(0o700)
        else:
            raise PermissionError(f"{folder} belongs to another user; refusing to put the broker socket there")
    try:
        os.unlink(path)  # stale: we hold the broker lock, so no live broker owns it
    except FileNotFoundError:
        pass


async def open_unix_listener(path: str) -> trio.SocketListener:
    prepare_socket_path(path)
    sock = trio.socket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        await sock.bind(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(BACKLOG)
    return trio.SocketListener(sock)


async def serve_unix(
    path: str,
    handler: Callable[[trio.SocketStream], Awaitable[None]],
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind, report the path as started, then serve each connection in its own task."""
    listener = await open_unix_listener(path)
    my_uid = os.getuid()

    async def guarded(stream: trio.SocketStream) -> None:
        try:
            uid = peer_uid(stream.socket)
            if uid is not None and uid != my_uid:
                log.warning("refused a connection from uid %s", uid)
                return
            await handler(stream)
        except Exception:  # a bad client never takes the listener down
            log.exception("connection handler failed")
        finally:
            await trio.aclose_forcefully(stream)

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, guarded, [listener])
            task_status.started(path)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass

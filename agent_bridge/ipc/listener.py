"""The broker's Unix-socket listener: 0700 folder, 0600 socket, peer uid checked."""

from __future__ import annotations

import logging
import os
import socket as stdsocket
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from agent_bridge.common import paths
from agent_bridge.ipc import peercred

log = logging.getLogger("agent_bridge.ipc")

BACKLOG = 256  # 200 sessions reconnect at once after a broker restart


def prepare_socket_path(path: str, state_folder: Path | None = None) -> str:
    """Make the folder of the socket `path` ready and return the path to bind (SPEC §8, sockets).

    In the state folder (`state_folder`, already checked by `paths.ensure_home`): that path.
    Anywhere else (the runtime-dir or /tmp fallback for a long home path), another local user
    may have been there first, so the folder is created with mkdir 0700, or, if it exists, used
    only when it is a real folder of ours (opened without following a symlink; tightened through
    that descriptor, never through the path). A symlink or someone else's folder is never
    followed or changed: the socket goes into a fresh private folder beside it instead
    (mkdtemp), so a planted folder cannot keep the owner from having a broker."""
    folder = Path(path).parent
    if state_folder is not None and folder == state_folder:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    elif not _private_folder(folder):
        problem = paths.socket_folder_problem(folder) or "not usable"
        folder = Path(tempfile.mkdtemp(prefix=f"{folder.name}-", dir=folder.parent))
        log.warning("socket folder %s, so the socket goes in %s", problem, folder)
        path = str(folder / Path(path).name)
    try:
        os.unlink(path)  # stale: we hold the broker lock, so no live broker owns it
    except FileNotFoundError:
        pass
    return path


def _private_folder(folder: Path) -> bool:
    """Create `folder` 0700, or make sure the one there is a real folder of ours, 0700."""
    try:
        os.mkdir(folder, 0o700)
        return True
    except FileNotFoundError:  # its parent is missing (a runtime dir always exists; tests)
        folder.parent.mkdir(parents=True, exist_ok=True)
        return _private_folder(folder)
    except FileExistsError:
        pass
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # a symlink (ELOOP), not a folder (ENOTDIR)
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return False
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
        return True
    finally:
        os.close(fd)


async def open_unix_listener(path: str) -> trio.SocketListener:
    """Bind and listen on `path`, whose folder `prepare_socket_path` made ready."""
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
    state_folder: Path | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind, report the path bound as started (another than `path` when its folder was not
    safe to use, see prepare_socket_path), then serve each connection in its own task."""
    requested = path
    path = prepare_socket_path(path, state_folder)
    listener = await open_unix_listener(path)
    my_uid = os.getuid()

    async def guarded(stream: trio.SocketStream) -> None:
        try:
            uid = peercred.peer_uid(stream.socket)
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
        if Path(path).parent != Path(requested).parent:
            try:
                os.rmdir(Path(path).parent)  # the private folder made for this broker alone
            except OSError:
                pass

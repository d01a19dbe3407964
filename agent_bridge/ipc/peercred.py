"""Who is at the other end of a Unix socket (SPEC §8). Standard library only, and light: the
hooks and the relay check the broker with it before they send a byte.

The broker checks each client (ipc.listener); every client checks the broker (ipc.blocking,
ipc.client): another local user who got a socket of theirs where ours should be (a planted
folder, a swapped symlink) is refused before it hears the session's hello.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Any

try:  # the C module: `socket` builds its enums at import (see ipc.blocking)
    import _socket as _sock
except ImportError:  # pragma: no cover - interpreters without it
    import socket as _sock  # type: ignore[no-redef]

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;} (Linux)
_XUCRED = struct.Struct("2I")  # struct xucred {u_int cr_version; uid_t cr_uid; ...} (macOS, BSD)
XUCRED_SIZE = 76  # sizeof(struct xucred): version, uid, ngroups (padded), 16 gids
SOL_LOCAL, LOCAL_PEERCRED = 0, 0x001  # <sys/un.h> on macOS and the BSDs


class NotOurBroker(ConnectionRefusedError):
    """The socket is served by a process of another user: not this user's broker."""


def peer_uid(sock: Any) -> int | None:
    """The uid of the process at the other end of the connected Unix socket `sock` (a standard
    or Trio socket), or None where the platform cannot tell."""
    if hasattr(_sock, "SO_PEERCRED"):  # Linux
        creds = sock.getsockopt(_sock.SOL_SOCKET, _sock.SO_PEERCRED, _UCRED.size)
        uid: int = _UCRED.unpack(creds)[1]
        return uid
    if sys.platform == "darwin" or "bsd" in sys.platform:  # getpeereid(3) reads LOCAL_PEERCRED
        creds = sock.getsockopt(SOL_LOCAL, LOCAL_PEERCRED, XUCRED_SIZE)
        xuid: int = _XUCRED.unpack_from(creds)[1]
        return xuid
    return None


def check_server(sock: Any, address: str) -> None:
    """Raise NotOurBroker unless the server at the other end of `sock` runs as this user.
    A platform that cannot tell passes (the socket's 0700 folder is then the only guard)."""
    uid = peer_uid(sock)
    if uid is not None and uid != os.geteuid():
        raise NotOurBroker(
            f"{address} is served by uid {uid}, not by you (uid {os.geteuid()}): not your broker; "
            "refusing to talk to it (agent-bridge doctor shows where the socket is)"
        )

"""The dashboard's listening socket and `dashboard.url` (SPEC §2, §6), without Quart or Hypercorn:
bind loopback, listen, make this start's token, publish the URL.

The broker opens these before it says it is ready (a port in use is a refusal of `up`) and
imports the server, 150-230 ms of Quart and Hypercorn, only once it is wanted
(dashboard/deferred.py); a connection made in between waits in the listen backlog.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from agent_bridge.common import paths
from agent_bridge.dashboard import auth

HOST = "127.0.0.1"  # loopback only (SPEC §6)
DEFAULT_PORT = 7878  # fixed so a bookmark-free URL stays the same; a free port when it is taken
PORT_ENV = "AGENT_BRIDGE_WEB_PORT"
BACKLOG = 128  # connections waiting to be accepted (Hypercorn's own default, set again when it serves)


class DashboardError(RuntimeError):
    """The dashboard cannot start (a bad port setting, a port in use, an unwritable home)."""


@dataclass(frozen=True)
class Listening:
    """A listening loopback socket with this start's token, its URL published (or why not)."""

    sock: socket.socket
    token: str
    base_url: str  # without token, e.g. http://127.0.0.1:7878
    url: str  # with the token: what dashboard.url holds
    url_file: Path | None  # where the URL was published; None when the home could not take it
    publish_error: str | None = None  # why it could not, for the standalone command to say

    @property
    def port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    def close(self) -> None:
        """Stop listening (a connection still in the backlog is reset) and remove dashboard.url
        if it still holds this start's URL."""
        self.sock.close()
        if self.url_file is not None:
            _unpublish(self.url_file, self.url)


def listen(home: Path, port: int | None, *, require_url_file: bool = True) -> Listening:
    """Bind and listen on loopback (`bind_loopback`), make a new token and write dashboard.url.
    Raises DashboardError for a bad port setting, a port in use, or (with `require_url_file`)
    a home that cannot take dashboard.url; nothing is left open then."""
    sock = bind_loopback(port)
    try:
        sock.listen(BACKLOG)
        bound_port = sock.getsockname()[1]
        token = auth.new_token()
        base_url = f"http://{HOST}:{bound_port}"
        url = f"{base_url}/?{auth.TOKEN_PARAM}={token}"
        try:
            return Listening(sock, token, base_url, url, _publish(home, url))
        except OSError as exc:
            problem = f"cannot write {home / paths.DASHBOARD_URL}: {exc.strerror}"
            if require_url_file:
                raise DashboardError(problem) from None
            return Listening(sock, token, base_url, url, None, problem)
    except BaseException:
        sock.close()
        raise


# --- the port -------------------------------------------------------------------------------


def requested_port(
    port: int | None, env: dict[str, str] | os._Environ[str] | None = None
) -> tuple[int, bool]:
    """(port to try, whether it was asked for explicitly). An explicit port in use is an error;
    the default one falls back to any free port."""
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise DashboardError(f"port: expected 0..65535 (0 = any free port), got {port!r}")
        return port, True
    env = os.environ if env is None else env
    raw = env.get(PORT_ENV, "").strip()
    if not raw:
        return DEFAULT_PORT, False
    try:
        value = int(raw, 10)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise DashboardError(f"{PORT_ENV}: expected a port number 0..65535 (0 = any free port), got {raw!r}")
    return value, True


def bind_loopback(port: int | None) -> socket.socket:
    """A socket bound on 127.0.0.1, not yet listening."""
    wanted, explicit = requested_port(port)
    try:
        return _bind(wanted)
    except OSError as exc:
        if explicit or exc.errno not in (errno.EADDRINUSE, errno.EACCES):
            raise DashboardError(
                f"cannot listen on {HOST}:{wanted}: {exc.strerror}; "
                f"set {PORT_ENV} to another port, or to 0 for any free port"
            ) from None
    return _bind(0)


def _bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if sys.platform == "win32":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)  # type: ignore[attr-defined]
        else:
            # reuse a TIME_WAIT port after a restart
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((HOST, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


# --- dashboard.url --------------------------------------------------------------------------


def _publish(home: Path, url: str) -> Path:
    if not home.is_dir():
        paths.ensure_home(home)  # created 0700; an existing home's mode is left as it is
    target = home / paths.DASHBOARD_URL
    paths.write_private(target, url)
    return target


def _unpublish(target: Path, url: str) -> None:
    """Remove dashboard.url if it still holds our URL (a later dashboard may have replaced it)."""
    try:
        if target.read_text(encoding="utf-8").strip() == url:
            target.unlink()
    except OSError:
        pass

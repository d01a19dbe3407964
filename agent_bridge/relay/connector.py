"""The connection keeper's I/O: find the broker, start one (`agent-bridge up --detach`), say
hello, serve the connection until it ends, and again, sleeping as the keeper
(relay.keeper) says.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from agent_bridge.common import paths
from agent_bridge.ipc import blocking, peercred, protocol
from agent_bridge.ipc.protocol import Refused
from agent_bridge.relay.keeper import START_ATTEMPTS, Keeper
from agent_bridge.relay.link import Link

log = logging.getLogger("agent_bridge.mcp")

START_TIMEOUT = 30.0  # seconds `agent-bridge up --detach` may take
HELLO_TIMEOUT = 10.0  # seconds the broker may take to answer the relay's hello
KEEPALIVE_INTERVAL = 15.0  # the broker drops a connection silent for 45 s
# With no broker running, the first start waits this long for the host to ask what only a broker
# answers (`wanted`): a health check (`claude mcp list`) is answered and gone by then, and starts none.
START_GRACE = 1.0
# Seconds between two looks at broker.json while a backoff runs (wait_for_broker): a new broker is
# joined at most this long after it is ready. Two hundred relays looking this often cost a broker
# starting beside them little (a stat each).
BROKER_LOOK = 0.1


class BadHello(Exception):
    """The broker refused this session's hello as bad input (say, --name): fix it, do not retry."""


class Joining(Protocol):
    """What the keeper's loop needs of the relay."""

    cond: threading.Condition
    keeper: Keeper
    wanted: threading.Event

    def join(self, socket_path: str) -> Link: ...

    def serve_link(self, link: Link) -> None: ...

    def keeper_changed(self) -> None: ...


def broker_socket(home: Path) -> str | None:
    record = paths.running_broker(home)
    sock = record.get("socket") if record else None
    return sock if isinstance(sock, str) else None


def keep_connected(relay: Joining, home: Path, sleep: Callable[[float], None] = time.sleep) -> None:
    """Forever: a connection to the broker, served until it ends."""
    keeper = relay.keeper
    first = True
    while True:
        socket_path = broker_socket(home)
        with relay.cond:
            due = keeper.start_due(time.monotonic(), socket_path is not None)
            blocked = keeper.blocked_until_changed is not None
        if due and first and socket_path is None:
            relay.wanted.wait(START_GRACE)  # a health check has gone by then
            socket_path = broker_socket(home)  # another session may have started one meanwhile
            due = socket_path is None
        first = False
        if due:
            if not (blocked and still_blocked(relay, home)):
                start_broker(relay, home)
            socket_path = broker_socket(home)
        if socket_path is not None:
            try:
                link = relay.join(socket_path)
            except (Refused, peercred.NotOurBroker) as exc:  # wait: neither changes by retrying at once
                with relay.cond:
                    first, wait = keeper.refused_by(str(exc))
                    relay.keeper_changed()
                if first:
                    log.warning("this session cannot connect to the broker yet: %s", exc)
                sleep(wait)
                continue
            except (OSError, protocol.ProtocolError) as exc:
                log.info("broker not reachable: %s", exc)
            else:
                relay.serve_link(link)
        with relay.cond:
            wait = keeper.missed(time.monotonic())
        wait_for_broker(home, wait, sleep)


def wait_for_broker(
    home: Path, seconds: float, sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Sleep `seconds` (the keeper's backoff), or less: until broker.json is written anew
    (broker_looks)."""
    for pause in broker_looks(home, seconds, clock):
        sleep(pause)


def broker_looks(home: Path, seconds: float, clock: Callable[[], float]) -> Iterator[float]:
    """The pauses of a backoff of `seconds` that ends once broker.json is written anew: the
    caller sleeps each one (a thread here, a Trio task in bench_reconnect_storm). A broker
    writes that file last, once it answers (broker.root), so a broker restarted meanwhile is
    joined as soon as it is ready, not at the next try of a backoff that grew while it was
    down (up to BACKOFF_MAX). One look at the file's identity after each pause of at most
    BROKER_LOOK; a file removed (the old broker stopping) is not a new one."""
    before = _broker_json_identity(home)
    deadline = clock() + seconds
    while (left := deadline - clock()) > 0:
        yield min(BROKER_LOOK, left)
        now = _broker_json_identity(home)
        if now is not None and now != before:
            return
        before = now


def _broker_json_identity(home: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(home / paths.BROKER_JSON)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def still_blocked(relay: Joining, home: Path) -> bool:
    files = paths.start_files_identity(home)
    with relay.cond:
        return relay.keeper.still_blocked(files)


def start_broker(relay: Joining, home: Path) -> None:
    """Start a detached broker; racing relays are safe: the broker lock admits one.

    A start that fails while no other broker holds the lock is a failure of this home (its
    database, its folder): remembered with the reason `up` gave, for tool errors, and tried
    again only after a growing delay, at most START_ATTEMPTS times in a row."""
    log.info("no broker answering; starting one")
    files_before = paths.start_files_identity(home)  # what a permanent refusal was about
    try:
        done = subprocess.run(
            [sys.executable, "-m", "agent_bridge", "up", "--detach"],
            check=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=START_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return  # slow: the loop connects once it runs
    said = done.stderr.decode("utf-8", "replace")
    won_elsewhere = paths.PERMANENT not in said and paths.lock_holder(home) is not None
    if done.returncode == 0 or paths.ALREADY_RUNNING in said or won_elsewhere:
        # started, or another relay's broker won the lock (it may still be starting, so the
        # lock can look free for an instant): the loop connects. A permanent refusal is ours
        # whoever holds the lock now (another relay's `up`, refused the same way).
        return
    reason = said.strip().splitlines()
    text = reason[-1] if reason else f"`agent-bridge up` exited with status {done.returncode}"
    keeper = relay.keeper
    with relay.cond:
        keeper.start_failed(text.removeprefix("agent-bridge up: "), time.monotonic(),
                            files_before if paths.PERMANENT in text else None)
        relay.keeper_changed()
    if keeper.blocked_until_changed is not None:
        log.error("the broker cannot start (%s); not trying again until %s changes", keeper.start_failure,
                  " or ".join(paths.START_FILES))
    elif keeper.start_attempts == START_ATTEMPTS:
        log.error("the broker cannot start (%s); giving up after %d attempts", keeper.start_failure,
                  START_ATTEMPTS)
    else:
        log.warning("the broker cannot start: %s", keeper.start_failure)


def hello(socket_path: str, hello_request: dict[str, Any]) -> tuple[Link, dict[str, Any]]:
    """Connect and say hello (`mcp`): the link and the broker's answer. Raises Refused (this
    session not now), BadHello (bad input), OSError or ProtocolError."""
    sock = blocking.connect(socket_path, HELLO_TIMEOUT)
    link = Link(sock)
    try:
        link.send_json([hello_request])
        while True:
            answer = link.receive()
            if answer is None:
                raise ConnectionResetError("the broker closed the connection during hello")
            if answer.get("id") == hello_request["id"]:
                break
    except BaseException:
        link.close()
        raise
    if not answer.get("ok"):
        link.close()
        err = answer.get("error") or {}
        if err.get("code") == "refused":
            raise Refused(str(err.get("message")))
        if err.get("code") == "bad_request":
            raise BadHello(str(err.get("message")))
        raise ConnectionRefusedError(str(err.get("message")))
    link.keep_alive(KEEPALIVE_INTERVAL)
    result = answer.get("result")
    return link, result if isinstance(result, dict) else {}

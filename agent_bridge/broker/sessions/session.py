"""A connected session as the broker holds it in memory (SPEC §3)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from agent_bridge.common.domain import SessionView
from agent_bridge.common.rows import Message, Peer
from agent_bridge.core.showing import Showing
from agent_bridge.ipc.frames import Identity, Notice

# How strongly a session's host session id is known (SPEC §3, strongest first).
RANK_NONE = 0
RANK_CODEX_META = 1
RANK_CLAUDE_ENV = 2
RANK_HOOK = 3
RANK_EXPLICIT = 4


class Link(Protocol):
    """What a connected session's delivery task pushes to (broker.delivery), and what ends its
    connection when another connection takes the session over: the wire for a
    bridge-protocol client (broker.connection.WireLink), the MCP side's inbox for a relay
    (broker.mcp.host.SessionLink)."""

    @property
    def closed(self) -> bool: ...

    async def push_messages(self, messages: list[Message]) -> None:
        """The delivery task's batch, in order (empty when a read found nothing new)."""

    async def push_notice(self, notice: Notice) -> None:
        """An identity, "acked" or "offered" push (Session.notify)."""

    async def aclose(self) -> None: ...


@dataclass(eq=False)
class Session:
    conn: Link
    peer: Peer  # its record as last read or written
    host: tuple[int, int] | None = None
    rank: int = RANK_NONE
    wake: trio.Event = field(default_factory=trio.Event)
    replay: bool = False  # push every unacknowledged message again (identity changed)
    # Pushes other than messages ("identity", "acked"), sent by the delivery task: a request
    # that produces one never waits on this session's socket. Bounded: one identity (the
    # latest) and one "acked" holding the ids acknowledged elsewhere since the last send.
    notices: deque[Notice] = field(default_factory=deque)
    # Identity without a host session id (broker.sessions.identity): the resume secret handed out at
    # hello (kept only for that answer), the host instance (pid, start time) the connection
    # runs under, and whether it is still tentative: a new record with no host identity and
    # no tool call yet, which gets no decision notices (the ones it missed are listed, to be
    # queued if it turns into a real session) and leaves nothing behind.
    secret: str | None = None
    instance: tuple[int, int] | None = None
    tentative: bool = False
    missed: list[str] = field(default_factory=list)
    # What this connection is showing its host, message by message (agent_bridge.core.showing):
    # driven by its MCP side (broker.mcp.host.Bridge) or, for a bridge-protocol client, by its
    # offer / withdraw / ack requests. It moves with the session when its record changes.
    showing: Showing = field(default_factory=Showing)

    @property
    def id(self) -> str:
        return self.peer.id

    @property
    def name(self) -> str:
        return self.peer.name

    @property
    def host_session_id(self) -> str | None:
        return self.peer.host_session_id

    @property
    def is_job(self) -> bool:
        return self.peer.is_job

    def view(self) -> SessionView:
        return self.peer.view()

    def public(self) -> dict[str, Any]:
        """The `whoami` object (SPEC §5)."""
        return self.peer.public()

    def notify(self, notice: Notice) -> None:
        """Queue a push for the delivery task (coalesced per kind: the latest identity, one
        "acked" and one "offered" holding every id since the last send) and wake it."""
        for i, queued in enumerate(self.notices):
            if type(queued) is not type(notice):
                continue
            if not isinstance(notice, Identity) and not isinstance(queued, Identity):
                notice = notice._replace(ids=[*queued.ids, *(m for m in notice.ids if m not in queued.ids)])
            self.notices[i] = notice
            break
        else:
            self.notices.append(notice)
        self.wake.set()

    def poke(self, *, replay: bool = False) -> None:
        """Wake the delivery task; with `replay`, push every unacknowledged message again."""
        if replay:
            self.replay = True
        self.wake.set()

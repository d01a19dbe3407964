"""A connected session as the broker holds it in memory (SPEC §3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from agent_bridge.domain import SessionView
from agent_bridge.ipc.stream import FramedStream

# How strongly a session's host session id is known (SPEC §3, strongest first).
RANK_NONE = 0
RANK_CODEX_META = 1
RANK_CLAUDE_ENV = 2
RANK_HOOK = 3
RANK_EXPLICIT = 4

PUBLIC_FIELDS = ("id", "name", "agent", "project", "hostSessionId", "kind")


@dataclass(eq=False)
class Session:
    conn: FramedStream
    peer: dict[str, Any]
    host: tuple[int, int] | None = None
    rank: int = RANK_NONE
    wake: trio.Event = field(default_factory=trio.Event)
    replay: bool = False  # push every unacknowledged message again (identity changed)
    ambiguous: bool = False

    @property
    def id(self) -> str:
        return str(self.peer["id"])

    @property
    def name(self) -> str:
        return str(self.peer["name"])

    @property
    def host_session_id(self) -> str | None:
        return self.peer.get("hostSessionId")

    @property
    def is_job(self) -> bool:
        return self.peer["kind"] == "job"

    def view(self) -> SessionView:
        return SessionView(
            id=self.id,
            name=self.name,
            project=self.peer["project"],
            host_session_id=self.host_session_id,
            kind=self.peer["kind"],
        )

    def public(self) -> dict[str, Any]:
        return {k: self.peer.get(k) for k in PUBLIC_FIELDS}

    def poke(self, *, replay: bool = False) -> None:
        """Wake the delivery task; with `replay`, push every unacknowledged message again."""
        if replay:
            self.replay = True
        self.wake.set()

"""The `initialize` replay rule, with no I/O: what a broker that joins later must hear before the
host's next line, and which of its answers are not the host's.

The host says `initialize`, `notifications/initialized` and maybe `logging/setLevel` once, to
whichever broker (or none) answered then. A broker that joins afterwards (the first one, late;
or a new one after a restart) serves a fresh MCP session: it gets the host's `initialize` again,
with a request id of the relay's own (REPLAY_ID), then `notifications/initialized` if the host
sent it, then the host's last log level; the answers to those ids are dropped (`swallowed`).

The `initialize` is replayed only once it has been answered (by a broker, or by the relay
alone): one that no one answered yet is still on its way, and its answer is the host's.
"""

from __future__ import annotations

import json
from typing import Any

from agent_bridge.core import showing

REPLAY_ID = "agent-bridge-replay-{}"  # the id of a replayed request, whose answer is not the host's
INITIALIZED = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})


class Replay:
    def __init__(self) -> None:
        self.init: dict[str, Any] | None = None  # the host's initialize request
        self.init_answered = False
        self.initialized = False  # the host sent notifications/initialized
        self.level: dict[str, Any] | None = None  # the host's last logging/setLevel params
        self.swallow: set[str] = set()  # keys of the answers to replayed requests
        self.replays = 0

    def host_request(self, method: str, message: dict[str, Any]) -> None:
        """The host asked `method` (`message`: its request)."""
        if method == "initialize":
            self.init = message
        elif method == "logging/setLevel":
            params = message.get("params")
            self.level = params if isinstance(params, dict) else None

    def host_notification(self, method: str) -> None:
        if method == "notifications/initialized":
            self.initialized = True

    def answered(self, method: str, ok: bool = True) -> None:
        """The host's `method` request was answered (`ok`: with a result, not an error)."""
        if method == "initialize":
            self.init_answered = ok

    def swallowed(self, key: str) -> bool:
        """Whether the answer keyed `key` is to a replayed request (dropped, once)."""
        if key in self.swallow:
            self.swallow.discard(key)
            return True
        return False

    def lost(self) -> None:
        """The broker went away: answers to what was replayed to it will not come."""
        self.swallow.clear()

    def lines(self) -> list[str]:
        """The lines a joining broker gets first (their ids are swallowed from now on)."""
        if self.init is None or not self.init_answered:
            return []
        lines = [self._replayed("initialize", self.init.get("params"))]
        if self.initialized:
            lines.append(INITIALIZED)
        if self.level is not None:
            lines.append(self._replayed("logging/setLevel", self.level))
        return lines

    def _replayed(self, method: str, params: Any) -> str:
        self.replays += 1
        rid = REPLAY_ID.format(self.replays)
        self.swallow.add(showing.key(rid))
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        return json.dumps(message, ensure_ascii=False)

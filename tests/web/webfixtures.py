"""Helpers of the dashboard tests: a state folder with a real bridge.db written by the broker's
own Store, the real app served by Hypercorn on a real loopback socket, and the standalone
command as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import apsw
import httpx
import trio

from agent_bridge.common import domain, paths
from agent_bridge.common.config import Settings
from agent_bridge.dashboard import auth
from agent_bridge.dashboard.server import serve_dashboard
from agent_bridge.store import schema
from agent_bridge.store.decisions import Recipient
from agent_bridge.store.ids import now_ms
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.writer import Store

AGENT_BRIDGE = Path(sys.prefix) / "bin" / "agent-bridge"  # the installed console script
TIMEOUT = 30  # seconds: the fail_after guard of every test doing I/O
PROJECT = "/work/proj"
OTHER = "/work/other"


@dataclass
class Facts:
    """What the fixture database holds, for the assertions."""

    peers: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name
    decisions: list[dict[str, Any]] = field(default_factory=list)  # in recording order
    messages: list[dict[str, Any]] = field(default_factory=list)

    def _heads(self) -> dict[str, str]:
        return {d["topic"]: d["id"] for d in self.decisions}

    def _now(self, decision: dict[str, Any]) -> dict[str, Any]:
        """A revision as it reads today (`current` was true when it was recorded)."""
        return {**decision, "current": self._heads()[decision["topic"]] == decision["id"]}

    def current(self) -> list[dict[str, Any]]:
        """Current revisions, newest first."""
        return [self._now(d) for d in reversed(self.decisions) if self._heads()[d["topic"]] == d["id"]]

    def history(self, topic: str) -> list[dict[str, Any]]:
        """Every revision of `topic`, newest first."""
        return [self._now(d) for d in reversed(self.decisions) if d["topic"] == topic]


def build_database(home: Path) -> Facts:
    """A bridge.db at the current schema, written through the broker's Store, then closed (the
    broker is down: WAL checkpointed, no -wal or -shm left)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    facts = Facts()
    store = Store.open(home / "bridge.db")
    try:
        start = now_ms() - 3 * 3600_000
        clock = iter(range(start, start + 3 * 3600_000, 7 * 60_000))

        def peer(
            agent: str, project: str, kind: str = "interactive", host: str | None = None
        ) -> domain.SessionView:
            name = domain.session_name(agent, project) + ("-job" if kind == "job" else "")
            row = store.create_peer(agent=agent, name=name, project=project, kind=kind, host_session_id=host,
                                    now=next(clock))
            facts.peers[name] = row.to_json()  # the facts are what the API shows
            return row.view()

        claude = peer("claude", PROJECT, host="host-claude-1")
        codex = peer("codex", PROJECT)
        peer("codex", OTHER, kind="job")

        def decide(author: domain.SessionView, topic: str, text: str, scope: Any, notify=()) -> None:
            decision, _ = store.record_decision(
                author=author,
                author_agent=author.name.split("-")[0],
                topic=domain.normalize_topic(topic),
                text=domain.normalize_text(text),
                scope=domain.parse_scope(scope),
                source_message_id=None,
                recipients=[Recipient(s, s.host_session_id or f"peer:{s.id}") for s in notify],
                now=next(clock),
            )
            facts.decisions.append(decision.to_json())

        (hello,) = store.send_messages(
            claude.id, [Outgoing(codex.id, "Can you take the CI job?", 1, None)], next(clock)
        )
        facts.messages.append(hello.to_json())
        decide(claude, "Build / CI", "Use nox for CI.", "all")
        decide(claude, "database", "PostgreSQL 16, one database per service.", {"project": PROJECT})
        decide(codex, "Café", "Espresso only, no decaf.", {"sessions": [codex.name]})
        decide(claude, "build / ci", "Use nox sessions for CI, never tox.", "all", notify=[codex])
        decide(codex, "camera", "Hold to look, release to stop.", {"project": OTHER})
        decide(claude, "docs/history", "Keep a CHANGELOG.md per release.", {"project": PROJECT + "/"})
        decide(claude, "/leading//slashes", "A topic may hold any characters.", {"sessions": [claude.id]})
        decide(claude, "Database", "PostgreSQL 17 everywhere.", "all")
        (reply,) = store.send_messages(
            codex.id, [Outgoing(claude.id, "On it: nox sessions, no tox.", 2, hello.id)], next(clock)
        )
        facts.messages.append(reply.to_json())
    finally:
        store.close()
    return facts


def build_old_database(home: Path, version: int) -> None:
    """A bridge.db still at schema v1 or v2 (the DDL pinned in store.schema), with a peer and a
    message in it: the dashboard must not migrate it, and shows no decisions."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    conn = apsw.Connection(str(home / "bridge.db"))
    try:
        for step in schema.STEPS[:version]:
            conn.execute(step)
        conn.execute(
            "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at) "
            "VALUES ('p1', 'claude-old', 'claude', '/work/old', 'interactive', 1000, 2000), "
            "('p2', 'codex-old', 'codex', '/work/old', 'interactive', 1000, 1500)"
        )
        conn.execute(
            "INSERT INTO messages(id, from_peer, to_peer, body, hop, created_at) "
            "VALUES ('m1', 'p1', 'p2', 'hi', 1, 1200)"
        )
        if version >= 2:
            conn.execute("INSERT INTO receipts(message_id, peer_id) VALUES ('m1', 'p2')")
    finally:
        conn.close()


@dataclass
class Running:
    """A dashboard served by `serve_dashboard` in this process."""

    home: Path
    base: str
    url: str
    token: str
    port: int
    live: set[str]

    def client(self, *, cookie: bool = True, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Cookie": f"{auth.COOKIE}={self.token}"} if cookie else {}
        return httpx.AsyncClient(base_url=self.base, headers=headers, follow_redirects=False, **kwargs)


async def start_dashboard(nursery: trio.Nursery, home: Path, *, live: set[str] | None = None,
                          standalone: bool = False, port: int = 0) -> Running:
    live_ids = live if live is not None else set()
    base = await nursery.start(
        partial(serve_dashboard, home, live=None if standalone else (lambda: frozenset(live_ids)), port=port)
    )
    url = (home / "dashboard.url").read_text(encoding="utf-8")
    token = url.split(f"?{auth.TOKEN_PARAM}=", 1)[1]
    return Running(home, base, url, token, int(base.rsplit(":", 1)[1]), live_ids)


# --- the standalone command as a real process ------------------------------------------------


@dataclass
class Standalone:
    process: trio.Process
    url: str
    stderr_chunks: list[bytes]

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]

    @property
    def token(self) -> str:
        return self.url.split(f"?{auth.TOKEN_PARAM}=", 1)[1]

    async def stop(self, sig: int = signal.SIGINT) -> int:
        self.process.send_signal(sig)
        return await self.process.wait()


def standalone_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    env.update({"AGENT_BRIDGE_HOME": str(home), "AGENT_BRIDGE_WEB_PORT": "0", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


async def read_line(stream: trio.abc.ReceiveStream, buffer: bytearray) -> bytes:
    while b"\n" not in buffer:
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise AssertionError(f"stream closed before a full line: {bytes(buffer)!r}")
        buffer.extend(chunk)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line


async def start_standalone(
    nursery: trio.Nursery, env: dict[str, str], *args: str, **options: Any
) -> Standalone:
    """`agent-bridge dashboard [args]` as a child process; returns once it printed its URL."""
    process = await trio.lowlevel.open_process(
        [str(AGENT_BRIDGE), "dashboard", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **options,
    )
    stderr_chunks: list[bytes] = []

    async def drain_stderr() -> None:
        assert process.stderr is not None
        while chunk := await process.stderr.receive_some(4096):
            stderr_chunks.append(chunk)

    nursery.start_soon(drain_stderr)
    assert process.stdout is not None
    try:
        line = await read_line(process.stdout, bytearray())
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return Standalone(process, line.decode().strip(), stderr_chunks)


# --- the broker's own root in this process ----------------------------------------------------


class BrokerInProcess:
    """`run_broker` (what `agent-bridge up` runs) on this Trio loop, with its IPC socket and its
    dashboard; stoppable and restartable (on the same dashboard port, to see a token change)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.record: dict[str, Any] = {}
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None

    async def start(self, nursery: trio.Nursery, *, web_port: int = 0) -> dict[str, Any]:
        from agent_bridge.broker.root import run_broker  # the broker's imports: only where used

        paths.ensure_home(self.home)
        ready, done, scope = trio.Event(), trio.Event(), trio.CancelScope()
        self._scope, self._done = scope, done

        def on_ready(record: dict[str, Any]) -> None:
            self.record = dict(record)
            ready.set()

        async def run() -> None:
            try:
                with scope:
                    await run_broker(self.home, Settings(), web_port=web_port, on_ready=on_ready)
            finally:
                done.set()

        nursery.start_soon(run)
        await ready.wait()
        return self.record

    @property
    def web_port(self) -> int:
        return int(self.record["web"].rsplit(":", 1)[1])

    def dashboard_url(self) -> str:
        return (self.home / "dashboard.url").read_text(encoding="utf-8").strip()

    async def stop(self) -> None:
        assert self._scope is not None and self._done is not None
        self._scope.cancel()
        await self._done.wait()

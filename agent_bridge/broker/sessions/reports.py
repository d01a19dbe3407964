"""What hooks report about the host they run under (SPEC §3, rule 2's hook source): a report
live (`identify`, a control request) or left in the home folder while no broker ran (`ingest`),
each applied through the identity rules (sessions.identity): the host instance recorded, and the
one connected session of that host paired with the host session id."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from agent_bridge import hosts
from agent_bridge.broker.args import ADDRESS_MAX, no_unknown, parse_host, req_str
from agent_bridge.broker.sessions.registry import Registry
from agent_bridge.broker.sessions.session import RANK_EXPLICIT, RANK_HOOK, Session
from agent_bridge.common import domain, jsonlimit, paths
from agent_bridge.common.domain import InputError
from agent_bridge.store.ids import now_ms

if TYPE_CHECKING:
    from agent_bridge.broker.storage import StoreCalls

log = logging.getLogger("agent_bridge.broker")


class Pairing(Protocol):
    """What a report needs of the identity rules (sessions.identity.Identity)."""

    registry: Registry
    lock: trio.Lock

    async def learn(self, session: Session, hsid: str, rank: int) -> bool: ...

    async def confirm(self, session: Session) -> None: ...


class HookReports:
    """The hooks' reports, applied under the identity rules' lock."""

    def __init__(self, identity: Pairing, db: StoreCalls, home: Path) -> None:
        self.identity = identity
        self._db = db
        self.home = home

    async def identify(self, args: dict[str, Any]) -> dict[str, Any]:
        """A hook reports the host session id of the host it runs under."""
        allowed = {"hostSessionId", "agent", "host", "chain", "cwd", "source", "event", "at"}
        no_unknown(args, allowed, "identify")
        hsid = req_str(args, "hostSessionId", ADDRESS_MAX)
        agent = domain.normalize_agent(args.get("agent", hosts.DEFAULT.name))
        host = parse_host(args.get("host"))
        async with self.identity.lock:
            return await self.apply(hsid, agent, host)

    async def apply(self, hsid: str, agent: str, host: tuple[int, int] | None) -> dict[str, Any]:
        registry, db = self.identity.registry, self._db
        if host is not None:
            await db.record_host_instance(
                host[0], host[1], hsid, agent, now_ms(), exclusive=agent in hosts.EXCLUSIVE
            )
        bound = registry.find_connected(hsid)
        if bound is not None and bound.host_session_id == hsid:
            bound.rank = max(bound.rank, RANK_HOOK)
            await self.identity.confirm(bound)
            return {"session": bound.public(), "paired": True}
        # a connection given its host session id on its command line is that session only (one
        # relay per session of an opencode process, relay.router): never another id's candidate
        candidates = [s for s in registry.sessions.values()
                      if host is not None and s.host == host and s.rank < RANK_EXPLICIT]
        if len(candidates) == 1:
            paired = await self.identity.learn(candidates[0], hsid, RANK_HOOK)
            return {"session": candidates[0].public() if paired else None, "paired": paired}
        if len(candidates) > 1:
            log.warning(
                "host %s has %d connected sessions; cannot tell which is %s", host, len(candidates), hsid
            )
            return {"session": None, "paired": False, "ambiguous": True}
        peer = await db.peer_by_host_session(hsid)
        return {"session": None if peer is None else peer.public(), "paired": False}

    async def ingest(self) -> int:
        """Identity reports hooks left in the home folder while no broker ran."""
        folder = self.home / paths.REPORTS_DIR
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return 0
        count = 0
        for entry in names:
            if not entry.endswith(".json"):
                continue
            path = folder / entry
            try:
                report = jsonlimit.loads(path.read_text(encoding="utf-8"))
                hsid = req_str(report, "hostSessionId", ADDRESS_MAX)
                agent = domain.normalize_agent(report.get("agent", hosts.DEFAULT.name))
                host = parse_host(report.get("host"))
                await self.apply(hsid, agent, host)
                count += 1
            except (OSError, ValueError, InputError) as exc:
                log.warning("ignored identity report %s: %s", entry, exc)
            try:
                path.unlink()
            except OSError:
                pass
        return count

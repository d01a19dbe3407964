"""The broker's handlers of who is who (SPEC §3; broker.sessions.identity has the rules): `whoami`,
`peers`, `learn_identity` on a session's connection; `identify` (a hook), `connected` and
`forget` (the command line) as control requests; and the broker's own `ping`, `status`,
`shutdown`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import trio

from agent_bridge.broker.args import ADDRESS_MAX, SESSIONS_COMMAND, one_session
from agent_bridge.broker.args import no_unknown as _no_unknown
from agent_bridge.broker.args import req_str as _req_str
from agent_bridge.broker.sessions.session import Session
from agent_bridge.broker.state import Broker, control_op, session_op
from agent_bridge.common import domain, marks
from agent_bridge.common.domain import InputError
from agent_bridge.common.rows import Peer
from agent_bridge.store.federation_queries import RemoteSession
from agent_bridge.store.ids import now_ms

log = logging.getLogger("agent_bridge.broker")


@session_op("ping")
async def op_ping(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    return "pong"


@control_op("ping")
async def cmd_ping(broker: Broker, args: dict[str, Any]) -> Any:
    return "pong"


@session_op("status")
async def op_status(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    return broker.status()


@control_op("status")
async def cmd_status(broker: Broker, args: dict[str, Any]) -> Any:
    return broker.status()


@control_op("shutdown")
async def cmd_shutdown(broker: Broker, args: dict[str, Any]) -> Any:
    # the connection sets `stop` once this answer is sent; stopping interrupts the running jobs
    running = 0 if broker.jobs is None else len(broker.jobs.machine.running())
    return {"stopping": True, "jobsInterrupted": running}


@session_op("whoami")
async def op_whoami(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    _no_unknown(args, set(), "whoami")
    return session.public()


@session_op("peers")
async def op_peers(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    _no_unknown(args, {"project"}, "peers")
    project = args.get("project")
    if project is not None:
        project = domain.normalize_folder(project, what="project")
    rows = await broker.db.list_peers()
    listed = [p for p in rows if project is None or p.project == project]
    listed.sort(key=lambda p: (p.id not in broker.sessions, p.name))
    connected = [p.id in broker.sessions for p in listed]
    if any(on and p.host_session_id for p, on in zip(listed, connected, strict=True)):  # marks to read
        states = await trio.to_thread.run_sync(session_states, broker.home, listed, connected)
    else:
        states = session_states(broker.home, listed, connected)  # no file to read: offline or unknown
    here = [
        {**p.public(), "connected": on, **state.to_json()}
        for p, on, state in zip(listed, connected, states, strict=True)
    ]
    if broker.federation is None:
        return here
    # the team's other machines (SPEC §10): `machine` null here, their sessions as announced
    others = [remote_peer_json(r) for r in await broker.db.remote_sessions(now_ms())
              if project is None or r.project == project]
    return [{**p, "machine": None} for p in here] + others


def remote_peer_json(r: RemoteSession) -> dict[str, Any]:
    """Another machine's session as `peers` and `agent-bridge sessions` list it: its address
    `name@machine`, connected unless its machine is silent or said it left."""
    return {"id": r.id, "name": r.address, "agent": r.agent, "project": r.project, "hostSessionId": None,
            "kind": r.kind, "machine": r.machine, "connected": r.state != "offline", "state": r.state,
            "stateSince": r.last_heard}


def session_states(home: Path, peers: list[Peer], connected: list[bool]) -> list[marks.SessionState]:
    """Each session's busy/idle/offline state (marks.session_state): files read, off the loop."""
    return [
        marks.session_state(home, p.host_session_id, connected=on, last_seen=p.last_seen_at)
        for p, on in zip(peers, connected, strict=True)
    ]


@session_op("learn_identity")
async def op_learn_identity(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """The MCP server saw its host session id (Codex tool-call `_meta`)."""
    _no_unknown(args, {"hostSessionId", "source"}, "learn_identity")
    hsid = _req_str(args, "hostSessionId", ADDRESS_MAX)
    source = str(args.get("source") or "codex-meta")
    learned = await broker.identity.learn_from_session(session, hsid, source)
    return {"session": session.public(), "learned": learned}


@control_op("identify")
async def cmd_identify(broker: Broker, args: dict[str, Any]) -> Any:
    return await broker.identify(args)


@control_op("connected")
async def cmd_connected(broker: Broker, args: dict[str, Any]) -> Any:
    """The ids of the connected sessions (`agent-bridge sessions` reads the rest itself)."""
    _no_unknown(args, set(), "connected")
    return sorted(broker.sessions)


def _forget_files(home: Path, host_session_ids: list[str]) -> None:
    for hsid in host_session_ids:
        try:
            marks.forget_ended(home, hsid)
        except OSError as exc:  # the database forgot them: a file left behind is only clutter
            log.warning("could not remove the waiter files of a forgotten session: %s", exc)


@control_op("forget")
async def cmd_forget(broker: Broker, args: dict[str, Any]) -> Any:
    """Forget sessions that are not connected: by address, or every one last seen more than
    `goneForMs` ago. A connected or unknown address refuses the whole request."""
    _no_unknown(args, {"sessions", "goneForMs"}, "forget")
    addresses, gone_for = args.get("sessions"), args.get("goneForMs")
    if (addresses is None) == (gone_for is None):
        raise InputError("forget: give session addresses or goneForMs, not both and not neither")
    async with broker.identity.lock:  # nobody connects as one of them while they are forgotten
        if addresses is not None:
            if not isinstance(addresses, list) or not addresses or not all(
                isinstance(a, str) and a.strip() and len(a) <= ADDRESS_MAX for a in addresses
            ):
                raise InputError(
                    "sessions: expected a non-empty list of session names, ids or host session ids"
                )
            ids: list[str] = []
            for address in addresses:
                address = address.strip()
                held = broker.find_connected(address)
                if held is not None:
                    raise InputError(
                        f"{address!r} is connected ({held.name}); only gone sessions can be forgotten "
                        "(a gone record that shares its name: forget it by its id, see `agent-bridge "
                        "sessions`)"
                    )
                found = await broker.db.find_peers_by_address(address)
                if not found and "@" in address:  # another machine's session (SPEC §10): name@machine
                    name, _, machine = address.rpartition("@")
                    remote = await broker.db.remote_session(name, machine, now_ms())
                    if remote is not None and remote.state != "offline":
                        raise InputError(f"{address!r} is connected on machine {machine}; only gone "
                                         "sessions can be forgotten")
                    if remote is not None:
                        ids.append(remote.id)
                        continue
                if not found:
                    raise InputError(f"no session is addressed by {address!r} (see {SESSIONS_COMMAND})")
                chosen = one_session("sessions", address, found, SESSIONS_COMMAND)
                if chosen.id not in ids:
                    ids.append(chosen.id)
        else:
            if isinstance(gone_for, bool) or not isinstance(gone_for, int) or gone_for < 0:
                raise InputError("goneForMs: expected a non-negative integer (milliseconds)")
            now = now_ms()  # longer than since 1970: nobody (and no integer past SQLite's 64 bits)
            candidates = await broker.db.sessions_last_seen_before(now - min(gone_for, now + 1))
            ids = [i for i in candidates if i not in broker.sessions]
        forgotten = await broker.db.forget_peers(ids, now_ms(), fault=broker.fault)
    # over for good: their marks and waiter locks in <home>/waiters/ go too (a session without a
    # waiter, `claude -p` say, left its mark there), but those a live waiter holds (marks.forget_ended)
    ended = [item.peer.host_session_id for item in forgotten if item.peer.host_session_id]
    if ended:
        await trio.to_thread.run_sync(_forget_files, broker.home, ended)
    for item in forgotten:
        log.info(
            "forgot session %s (%s); dropped %d queued message(s)",
            item.peer.name,
            item.peer.id,
            len(item.dropped),
        )
    return {"forgotten": [item.to_json() for item in forgotten]}

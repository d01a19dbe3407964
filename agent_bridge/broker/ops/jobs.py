"""The job ops (SPEC §4.7): `delegate` and `job` for a session, `jobs` and `jobs cancel` for the
owner, over the jobs' supervisor (broker/jobs/supervisor.py)."""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, NamedTuple

import trio

from agent_bridge import hosts
from agent_bridge.broker.args import no_unknown
from agent_bridge.broker.jobs.supervisor import Supervisor, git
from agent_bridge.broker.sessions.session import Session
from agent_bridge.broker.state import Broker, control_op, session_op
from agent_bridge.common import domain, paths
from agent_bridge.common.domain import InputError
from agent_bridge.common.rows import JobRow
from agent_bridge.core import jobs as machine
from agent_bridge.store.ids import now_ms

log = logging.getLogger("agent_bridge.broker")


TASK_MAX = 20_000
TITLE_MAX = 200
MODEL_MAX = 200
WAIT_MAX = 50
TIMEOUT_DEFAULT = 3600
TIMEOUT_MAX = 7 * 86_400
ACCESS = ("read", "edit")
ACTIONS = ("status", "continue", "cancel")


def supervisor_of(broker: Broker) -> Supervisor:
    found: Supervisor | None = getattr(broker, "jobs", None)
    if found is None or found.closed:
        raise InputError("the broker is stopping: start the job again once it is back")
    return found


def _text(args: dict[str, Any], key: str, limit: int, *, required: bool = False) -> str | None:
    value = args.get(key)
    if value is None:
        if required:
            raise InputError(f"{key}: required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{key}: expected a non-empty string")
    if len(value) > limit:
        raise InputError(f"{key}: at most {limit} characters, got {len(value)}")
    return value


def _wait_seconds(args: dict[str, Any]) -> float:
    value = args.get("wait_seconds")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= WAIT_MAX:
        raise InputError(f"wait_seconds: expected a number from 0 to {WAIT_MAX}")
    return float(value)


def _inside(folder: str, project: str) -> bool:
    real, root = os.path.realpath(folder), os.path.realpath(project)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


class _Asked(NamedTuple):
    """A `delegate` call's arguments, checked."""

    host: hosts.Host
    task: str
    title: str
    access: str
    worktree: bool
    model: str | None
    timeout: float
    wait: float
    cwd: str


async def _asked(args: dict[str, Any], project: str) -> _Asked:
    no_unknown(args, {"agent", "task", "title", "access", "worktree", "model", "cwd", "wait_seconds",
                      "timeout_seconds"}, "delegate")
    agent = args.get("agent")
    host = hosts.by_name(agent) if isinstance(agent, str) else None
    if host is None:
        raise InputError(f"agent: expected one of {', '.join(hosts.NAMES)}, got {agent!r}")
    task = _text(args, "task", TASK_MAX, required=True)
    assert task is not None
    title = _text(args, "title", TITLE_MAX) or domain.one_line_title(task)
    access = args.get("access") or "read"
    if access not in ACCESS:
        raise InputError(f"access: expected \"read\" or \"edit\", got {access!r}")
    worktree = args.get("worktree")
    if worktree is not None and not isinstance(worktree, bool):
        raise InputError("worktree: expected true or false")
    model = _text(args, "model", MODEL_MAX)
    timeout = args.get("timeout_seconds")
    if timeout is None:
        timeout = TIMEOUT_DEFAULT
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 1 <= timeout <= TIMEOUT_MAX:
        raise InputError(f"timeout_seconds: expected a number from 1 to {TIMEOUT_MAX}")
    wait = _wait_seconds(args)
    cwd = project if args.get("cwd") is None else domain.normalize_folder(args.get("cwd"), what="cwd")
    if not _inside(cwd, project):
        raise InputError(f"cwd: {cwd} is outside this session's project {project}: a job works inside it")
    if not await trio.Path(cwd).is_dir():
        raise InputError(f"cwd: {cwd} is not a folder")
    return _Asked(host, task, title, access, bool(worktree), model, float(timeout), wait, cwd)


@session_op("delegate")
async def delegate(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """Start a job for the calling session (SPEC §4.7); nothing starts when anything is wrong."""
    jobs = supervisor_of(broker)
    project = session.peer.project
    asked = await _asked(args, project)
    host, access, cwd = asked.host, asked.access, asked.cwd
    depth = 1
    if session.peer.kind == "job":
        mine = [j for j in await broker.db.find_jobs(session.peer.name) if j.name == session.peer.name]
        depth = (mine[0].depth if mine else 1) + 1
    try:
        jobs.machine.check_submit(depth)
    except machine.Refused as exc:
        raise InputError(str(exc)) from None
    top = None
    if asked.worktree:
        top = await trio.to_thread.run_sync(git, cwd, "rev-parse", "--show-toplevel")
        if top is None:
            raise InputError(f"worktree: {cwd} is not in a git repository; drop worktree or use access edit")
    problem = await trio.to_thread.run_sync(host.job_check)
    if problem is not None:
        raise InputError(problem)
    job_id = str(uuid.uuid4())
    name = domain.job_name(host.name, job_id)
    worktree = branch = None
    if top is not None:
        worktree, branch = str(broker.home / paths.WORKTREES_DIR / name), f"agent-bridge/{name}"
        (broker.home / paths.WORKTREES_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)
        root = top.strip()
        added = await trio.to_thread.run_sync(git, root, "worktree", "add", "-b", branch, worktree, "HEAD")
        if added is None:
            raise InputError(f"worktree: git worktree add {worktree} failed; "
                             f"see `git -C {root} worktree list`")
        access, cwd = "edit", worktree
    row = await broker.db.record_job(
        job_id=job_id, name=name, parent_id=session.peer.id, agent=host.name, title=asked.title,
        task=asked.task, access=access, project=project, cwd=cwd, worktree=worktree, branch=branch,
        model=asked.model, depth=depth, timeout_ms=int(asked.timeout * 1000), now=now_ms())
    try:
        await jobs.submit(row)
    except machine.Refused as exc:  # the queue filled meanwhile: the record stays, ended
        await broker.db.end_job_run(row.id, 1, machine.CANCELLED, now_ms(), answer=None, thread=None,
                                    last_step=None, body=f"Job {name} was not started: {exc}")
        raise InputError(str(exc)) from None
    return {"job": await _wait_for(broker, jobs, job_id, asked.wait)}


async def _wait_for(broker: Broker, jobs: Supervisor, job_id: str, wait: float) -> dict[str, Any]:
    if wait > 0 and job_id in jobs.ended:
        with trio.move_on_after(wait):
            await jobs.ended[job_id].wait()
    row = await broker.db.job(job_id)
    assert row is not None
    return row.to_json()


async def _one_job(broker: Broker, address: object) -> JobRow:
    if not isinstance(address, str) or not address.strip() or len(address) > 200:
        raise InputError("id: expected a job's id or name (see `agent-bridge jobs`)")
    found = await broker.db.find_jobs(address.strip())
    if not found:
        raise InputError(f"no job has id or name {address!r} (see `agent-bridge jobs --all`)")
    if len(found) > 1:
        raise InputError(f"id: {address!r} names {len(found)} jobs; give more of its id")
    return found[0]


@session_op("job")
async def job(broker: Broker, session: Session, args: dict[str, Any]) -> Any:
    """A job's status, `continue` with a message, or `cancel`."""
    no_unknown(args, {"id", "action", "message"}, "job")
    row = await _one_job(broker, args.get("id"))
    action = args.get("action") or "status"
    if action not in ACTIONS:
        raise InputError(f"action: expected one of {', '.join(ACTIONS)}, got {action!r}")
    if action == "status":
        if args.get("message") is not None:
            raise InputError("message: only `continue` takes a message")
        return {"job": row.to_json()}
    jobs = supervisor_of(broker)
    try:
        if action == "cancel":
            await jobs.cancel(row)
        else:
            message = _text(args, "message", TASK_MAX, required=True)
            assert message is not None
            if not row.thread:
                raise InputError(f"job {row.name} has no host thread to continue (it never started)")
            await jobs.resume(row, message)
    except machine.Refused as exc:
        raise InputError(str(exc)) from None
    fresh = await broker.db.job(row.id)
    assert fresh is not None
    return {"job": fresh.to_json()}


@control_op("jobs")
async def cmd_jobs(broker: Broker, args: dict[str, Any]) -> Any:
    """`agent-bridge jobs [--all]`: the jobs not ended (all with `all`), oldest first."""
    no_unknown(args, {"all"}, "jobs")
    rows = await broker.db.jobs(every=bool(args.get("all")))
    return {"jobs": [r.to_json() for r in rows]}


@control_op("job_cancel")
async def cmd_job_cancel(broker: Broker, args: dict[str, Any]) -> Any:
    """`agent-bridge jobs cancel ID` and the dashboard's cancel: as `job(id, "cancel")`."""
    no_unknown(args, {"jobId"}, "job_cancel")
    row = await _one_job(broker, args.get("jobId"))
    try:
        await supervisor_of(broker).cancel(row)
    except machine.Refused as exc:
        raise InputError(str(exc)) from None
    fresh = await broker.db.job(row.id)
    assert fresh is not None
    return {"job": fresh.to_json()}

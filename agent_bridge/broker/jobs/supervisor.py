"""The broker's jobs (SPEC §4.7): the supervisor that carries out the job machine's effects
(core.jobs); the handlers of `delegate`, `job` and the owner's `jobs` / `jobs cancel` are
broker/ops/jobs.py.

The supervisor lives in the serving nursery, beside the listener: one task per running job
watches its process (its own process group, started from the command the job's host module
builds: hosts.*.job_command), reads its progress from its output file (`Host.job_report`), and
reports its exit to the machine. What the machine answers is carried out in order under one
lock: start a process, stop a process group (SIGTERM, then SIGKILL after a grace), or end a run
(its answer written to `<home>/jobs/<id>/answer.md`, one active message to the parent, in one
transaction). A broker killed with -9 leaves its jobs running: the next one adopts each by pid
and start time and watches it the same way; a job whose process is gone is read from its output
and ends as the machine says. At `stop` every running job is interrupted before the store closes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import trio

from agent_bridge import hosts
from agent_bridge.broker.sessions.session import Session
from agent_bridge.broker.state import Broker
from agent_bridge.common import paths, procinfo
from agent_bridge.common.domain import InputError
from agent_bridge.common.rows import JobRow
from agent_bridge.core import jobs as machine
from agent_bridge.hosts.base import JobLaunch, JobReport
from agent_bridge.store.ids import now_ms

log = logging.getLogger("agent_bridge.broker")

GRACE = 3.0  # seconds between SIGTERM and SIGKILL of a stopped job's process group
WATCH_EVERY = 0.5  # seconds between looks at a running job's output (its last step, its thread)
ANSWER_MAX = 8000
FILES_MAX = 40  # changed files listed in the answer message


class Supervisor:
    """The job machine and the processes of its running jobs."""

    def __init__(self, broker: Broker, nursery: trio.Nursery) -> None:
        self.broker = broker
        self.nursery = nursery
        self.machine = machine.Jobs(max_jobs=broker.settings.max_jobs)
        self.lock = trio.Lock()  # the machine and its effects, one event at a time
        self.pids: dict[str, int] = {}  # a running job's process (its group's leader)
        self.ended: dict[str, trio.Event] = {}  # set when the job's current run ends
        self.ticked = trio.Event()  # a deadline may have moved
        self.closed = False

    # --- the tree ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Adopt what the store holds, then stop runs at their deadlines, until cancelled."""
        rows = await self.broker.db.jobs()
        gone: list[JobRow] = []
        async with self.lock:
            for row in rows:
                self.ended[row.id] = trio.Event()
                self.machine.adopt(row.id, row.depth, row.timeout_ms, row.state, row.started_at, row.run)
                if row.state == machine.RUNNING:
                    if _alive(row.pid, row.pid_start):
                        self.pids[row.id] = int(row.pid or 0)
                        self.nursery.start_soon(self._guarded, row.id, self._watch_adopted, row.id,
                                                int(row.pid or 0), row.pid_start)
                        log.info("job %s: adopted its running process %s", row.name, row.pid)
                    else:
                        gone.append(row)
            for row in gone:  # read what it printed before it went
                report = self._report(row)
                await self._apply(self.machine.exited(row.id, answered=report.answer is not None,
                                                      failed=report.failed is not None))
            await self._apply(self.machine.fill())
        task_status.started()
        while True:
            deadline = self.machine.next_deadline()
            self.ticked = trio.Event()
            with trio.move_on_after(60 if deadline is None else max(0, (deadline - now_ms()) / 1000)):
                await self.ticked.wait()
            try:
                async with self.lock:
                    await self._apply(self.machine.tick(now_ms()))
            except Exception as exc:  # noqa: BLE001 - the store cannot take it now: the next tick tries
                log.warning("jobs: a timeout could not be carried out now: %s", exc)
                await trio.sleep(WATCH_EVERY)

    async def shut_down(self) -> int:
        """`stop`: interrupt every running job (its thread stays resumable) and wait for their
        ends to be recorded. Returns how many were running."""
        async with self.lock:
            self.closed = True
            running = self.machine.running()
            await self._apply(self.machine.down())
        with trio.move_on_after(GRACE + 5):
            for job_id in running:
                await self.ended[job_id].wait()
        return len(running)

    # --- requests --------------------------------------------------------------------------

    async def submit(self, row: JobRow) -> None:
        async with self.lock:
            self.ended[row.id] = trio.Event()
            await self._apply(self.machine.submit(row.id, row.depth, row.timeout_ms))

    def _known(self, row: JobRow) -> None:
        """A job that ended before this broker started is not in the machine until asked about."""
        if row.id not in self.machine.jobs:
            self.machine.adopt(row.id, row.depth, row.timeout_ms, row.state, row.started_at, row.run)
            self.ended.setdefault(row.id, trio.Event())

    async def resume(self, row: JobRow, message: str) -> None:
        async with self.lock:
            self._known(row)
            effects = self.machine.resume(row.id)  # raises Refused before anything is written
            # recorded before a start reads it (a Start only schedules the run's task)
            await self.broker.db.job_event(row.id, row.run + 1, machine.QUEUED, now_ms(), prompt=message)
            self.ended[row.id] = trio.Event()
            await self._apply(effects)

    async def cancel(self, row: JobRow) -> None:
        async with self.lock:
            self._known(row)
            await self._apply(self.machine.cancel(row.id))

    # --- effects -----------------------------------------------------------------------

    async def _apply(self, effects: list[machine.Effect]) -> None:
        for effect in effects:
            if isinstance(effect, machine.Start):
                self.nursery.start_soon(self._guarded, effect.job_id, self._run, effect.job_id)
            elif isinstance(effect, machine.Stop):
                self.nursery.start_soon(self._stop, effect.job_id)
            else:
                await self._end(effect)
        self.ticked.set()

    async def _guarded(self, job_id: str, run: Any, *args: Any) -> None:
        """A job's task: what goes wrong in it (the store refusing a write, say) is logged, and
        the broker goes on; the job's record says where it was, and the next broker takes it
        from there."""
        try:
            await run(*args)
        except Exception as exc:  # noqa: BLE001 - one job's trouble must not end the broker
            log.error("job %s: its supervision stopped: %s: %s", job_id, type(exc).__name__, exc)

    async def _stop(self, job_id: str) -> None:
        pid = self.pids.get(job_id)
        if pid is None:
            return  # not started yet: its start sees the stop
        _signal_group(pid, signal.SIGTERM)
        await trio.sleep(GRACE)
        if self.pids.get(job_id) == pid:
            _signal_group(pid, signal.SIGKILL)

    async def _run(self, job_id: str) -> None:
        """Start the job's process and watch it until it exits."""
        row = await self.broker.db.job(job_id)
        assert row is not None
        run = self.machine.jobs[job_id].runs
        out = self._folder(job_id)
        try:
            command, cwd = await self._command(row, run)
            # the process writes them; opening a file in the state folder does not block for long
            stdout = open(out / f"run-{run}.jsonl", "wb")  # noqa: SIM115, ASYNC230
            stderr = open(out / f"run-{run}.err", "wb")  # noqa: SIM115, ASYNC230
            try:
                proc = await trio.lowlevel.open_process(
                    command.argv, cwd=cwd, env={**os.environ, **command.env}, start_new_session=True,
                    stdin=subprocess.PIPE if command.stdin is not None else subprocess.DEVNULL,
                    stdout=stdout, stderr=stderr)
            finally:
                stdout.close()
                stderr.close()
        except (OSError, InputError) as exc:
            (out / f"run-{run}.err").write_text(f"could not start: {exc}\n", encoding="utf-8")
            async with self.lock:
                await self._apply(self.machine.exited(job_id, answered=False, failed=True))
            return
        self.pids[job_id] = proc.pid
        started = procinfo.describe(proc.pid)
        await self.broker.db.job_event(job_id, run, machine.RUNNING, now_ms(), pid=proc.pid,
                                       pid_start=None if started is None else started[0].start)
        async with self.lock:
            self.machine.started(job_id, now_ms())
            self.ticked.set()  # its timeout is a new deadline
            if self.machine.jobs[job_id].stopping is not None:
                self.nursery.start_soon(self._stop, job_id)
        if command.stdin is not None and proc.stdin is not None:
            try:
                await proc.stdin.send_all(command.stdin)
                await proc.stdin.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        await self._watch(job_id, run, row, lambda: proc.poll() is None)
        await proc.wait()
        await self._exited(job_id, row, proc.returncode)

    async def _watch_adopted(self, job_id: str, pid: int, start: int | None) -> None:
        row = await self.broker.db.job(job_id)
        assert row is not None
        await self._watch(job_id, row.run, row, lambda: _alive(pid, start))
        await self._exited(job_id, row, None)

    async def _watch(self, job_id: str, run: int, row: JobRow, running: Any) -> None:
        """Record the job's progress (its thread once known, its last step) while it runs."""
        host = hosts.by_name(row.agent)
        assert host is not None
        seen: tuple[str | None, str | None] = (row.thread, row.last_step)
        while running():
            await trio.sleep(WATCH_EVERY)
            report = host.job_report(self._output(job_id, run))
            now = (report.thread or seen[0], report.last_step or seen[1])
            if now != seen:
                seen = now
                await self.broker.db.job_event(job_id, run, machine.RUNNING, now_ms(), thread=now[0],
                                               last_step=now[1])

    async def _exited(self, job_id: str, row: JobRow, returncode: int | None) -> None:
        self.pids.pop(job_id, None)
        report = self._report(row)
        failed = report.failed is not None or (returncode not in (0, None) and report.answer is None)
        async with self.lock:
            await self._apply(self.machine.exited(job_id, answered=report.answer is not None, failed=failed))

    async def _end(self, ended: machine.Ended) -> None:
        """A run ended: its answer file, and the one message to the parent, recorded."""
        row = await self.broker.db.job(ended.job_id)
        assert row is not None
        run = self.machine.jobs[ended.job_id].runs or 1
        report = self._report(row, run)
        answer = report.answer if report.answer is not None else ""
        folder = self._folder(row.id)
        answer_file = folder / "answer.md"
        answer_file.write_text(answer, encoding="utf-8")
        if row.worktree and row.branch:  # the job's edits become a commit on its branch, to review and merge
            await trio.to_thread.run_sync(_commit_worktree, row)
        changes = await trio.to_thread.run_sync(_changes, row)
        body = answer_message(row, ended.state, ended.why, answer, report.failed, answer_file, changes)
        message_id = await self.broker.db.end_job_run(
            row.id, run, ended.state, now_ms(), body=body, answer=answer[:ANSWER_MAX] or None,
            thread=report.thread or row.thread, last_step=report.last_step or row.last_step)
        if message_id is not None:
            parent = self.broker.sessions.get(row.parent.id or "")
            if parent is not None:
                parent.poke()
            await self._post(row.parent.id, parent)
        self.ended.setdefault(row.id, trio.Event()).set()
        log.info("job %s: %s", row.name, ended.state)

    async def _post(self, parent_id: str | None, parent: Session | None) -> None:
        """The parent's file in the hooks' post box, before a `delegate` waiting on this run is
        answered: its next tool call's hook finds the answer, as a send's recipient's does
        (feeds/postbox.py; the box's own pass would come up to GAP later)."""
        pending = self.broker.pending
        peer = parent.peer if parent is not None else (
            await self.broker.db.get_peer(parent_id) if parent_id else None)
        if pending is not None and peer is not None and peer.host_session_id:
            await pending.add({peer.host_session_id})

    # --- files -----------------------------------------------------------------------------

    def _folder(self, job_id: str) -> Path:
        folder = self.broker.home / paths.JOBS_DIR / job_id
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return folder

    def _output(self, job_id: str, run: int) -> bytes:
        try:
            return (self.broker.home / paths.JOBS_DIR / job_id / f"run-{run}.jsonl").read_bytes()
        except OSError:
            return b""

    def _report(self, row: JobRow, run: int | None = None) -> JobReport:
        host = hosts.by_name(row.agent)
        assert host is not None
        report = host.job_report(self._output(row.id, run or row.run))
        if report.failed is None and report.answer is None:
            try:
                err = (self.broker.home / paths.JOBS_DIR / row.id / f"run-{run or row.run}.err").read_text(
                    encoding="utf-8", errors="replace").strip()
            except OSError:
                err = ""
            if err.startswith("could not start:"):
                report.failed = err.splitlines()[0]
        return report

    async def _command(self, row: JobRow, run: int) -> tuple[Any, str]:
        from agent_bridge.hosts.edits import launcher

        host = hosts.by_name(row.agent)
        assert host is not None
        if run > 1:  # `continue`, maybe days later (delegate checked the host for the first run)
            problem = await trio.to_thread.run_sync(host.job_check)
            if problem is not None:
                raise InputError(problem)
        addresses = frozenset({row.name, row.id})
        lines = await self.broker.db.job_note(row.project, addresses)
        note = f"agent-bridge: you are {row.name}, a job for {row.parent.name}. {host.tools_sentence()}"
        if lines:
            note += " Owner decisions, newest first:\n" + "\n".join(lines)
        task = row.prompt if run > 1 and row.prompt else row.task
        bridge = [*launcher(), "mcp", "--job", "--agent", row.agent, "--name", row.name, "--project",
                  row.project, "--host-session-id", row.id]
        env = {"AGENT_BRIDGE_HOME": str(self.broker.home)}
        thread = row.thread if run > 1 else None
        launch = JobLaunch(row.id, row.name, task, note, row.access, Path(row.cwd), Path(row.project),
                           row.model, thread, bridge, env, self._folder(row.id))
        return host.job_command(launch), row.cwd


def _alive(pid: int | None, start: int | None) -> bool:
    if not pid:
        return False
    found = procinfo.describe(pid)
    return found is not None and (start is None or found[0].start == start)


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def git(cwd: str, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _commit_worktree(row: JobRow) -> None:
    """Commit whatever the job left changed in its worktree, on its branch (author agent-bridge)."""
    assert row.worktree is not None
    if not git(row.worktree, "status", "--porcelain"):
        return
    git(row.worktree, "add", "-A")
    git(row.worktree, "-c", "user.name=agent-bridge", "-c", "user.email=agent-bridge@localhost", "commit",
         "--no-verify", "-q", "-m", f"{row.name}: {row.title}")


def _changes(row: JobRow) -> list[str]:
    """The files changed in the job's folder as git sees them (uncommitted), and for a worktree
    the commits on its branch and the diff stat of the branch against where it started."""
    status = git(row.cwd, "status", "--porcelain")
    lines = [] if status is None else [line for line in status.splitlines() if line.strip()]
    if row.worktree and row.branch:
        base = git(row.project, "merge-base", "HEAD", row.branch)
        if base is not None:
            commits = git(row.project, "log", "--oneline", f"{base.strip()}..{row.branch}") or ""
            lines += [f"commit {c}" for c in commits.splitlines()]
            stat = git(row.project, "diff", "--stat", f"{base.strip()}..{row.branch}") or ""
            lines += [f"diff {s.strip()}" for s in stat.splitlines() if s.strip()]
    return lines


def answer_message(row: JobRow, state: str, why: str | None, answer: str, failed: str | None,
                   answer_file: Path, changes: list[str]) -> str:
    """The one message a run's end sends to the parent (SPEC §4.7)."""
    said = {machine.FINISHED: "finished", machine.FAILED: "failed", machine.CANCELLED: "was cancelled",
            machine.INTERRUPTED: "was interrupted"}[state]
    if why == machine.TIMEOUT:
        said = f"failed: it ran past its timeout ({row.timeout_ms // 1000} s)"
    lines = [f"Job {row.name} ({row.agent}, {row.access} access) {said}: {row.title}"]
    if failed and state == machine.FAILED and why is None:
        lines.append(f"Error: {failed}")
    if answer:
        cut = answer if len(answer) <= ANSWER_MAX else answer[:ANSWER_MAX] + "…"
        lines += ["Answer:", cut]
    lines.append(f"Whole answer: {answer_file}")
    if changes:
        shown = changes[:FILES_MAX]
        lines.append("Files changed (git status):" + "".join(f"\n  {c}" for c in shown)
                     + (f"\n  … {len(changes) - FILES_MAX} more" if len(changes) > FILES_MAX else ""))
    if row.worktree and row.branch:
        lines += [f"Worktree: {row.worktree} on branch {row.branch}",
                  f"Review: git -C {row.project} diff HEAD...{row.branch}",
                  f"Merge: git -C {row.project} merge {row.branch}",
                  f"Remove: git -C {row.project} worktree remove {row.worktree} && "
                  f"git -C {row.project} branch -D {row.branch}"]
    lines.append(f'Continue it: job(id="{row.id}", action="continue", message="…")')
    return "\n".join(lines)


# --- handlers --------------------------------------------------------------------------

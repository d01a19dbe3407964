"""A job's life (SPEC §4.7), with no I/O: which jobs run, which wait, when one is stopped and
how each run ends. The broker's job supervisor (broker/jobs/supervisor.py) feeds it what happened (a job
was asked for, its process started or exited, the owner cancelled it, time passed, the broker
goes down) and carries out what it answers: start this job's process, stop that one's process
group, record and deliver this run's end.

    queued ──start──▶ running ──exit──▶ finished | failed | interrupted
       │                 │ cancel / timeout / down: stop, then at exit cancelled | failed | interrupted
       └──cancel──▶ cancelled
    an ended job ──continue──▶ queued (its next run)

Rules: at most `max_jobs` run at once, the others wait first come first served, and at most
`max_queued` wait; a job is at most `max_depth` deep (a job's job's job is refused); each run ends
exactly once, with one `Ended` (the supervisor turns it into the one answer message); a run that
was told to stop ends as what it was told (cancelled, failed by its timeout, interrupted by
`down`), whatever its process printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

QUEUED, RUNNING = "queued", "running"
FINISHED, FAILED, CANCELLED, INTERRUPTED = "finished", "failed", "cancelled", "interrupted"
ENDED = frozenset({FINISHED, FAILED, CANCELLED, INTERRUPTED})
STATES = (QUEUED, RUNNING, FINISHED, FAILED, CANCELLED, INTERRUPTED)

CANCEL, TIMEOUT, DOWN = "cancel", "timeout", "down"  # why a running job is stopped
STOPPED_AS = {CANCEL: CANCELLED, TIMEOUT: FAILED, DOWN: INTERRUPTED}

MAX_JOBS = 4  # running at once (config.toml `max_jobs`)
MAX_QUEUED = 20  # waiting; one more is refused
MAX_DEPTH = 2  # a session's job is depth 1, that job's job depth 2


class Start(NamedTuple):
    """Start this job's process (its next run)."""

    job_id: str


class Stop(NamedTuple):
    """Stop this job's process group (SIGTERM, then SIGKILL after a grace)."""

    job_id: str
    why: str  # CANCEL, TIMEOUT or DOWN


class Ended(NamedTuple):
    """This run ended in `state`: record it and deliver the one answer message."""

    job_id: str
    state: str
    why: str | None  # for a stopped run: CANCEL, TIMEOUT or DOWN; else None


Effect = Start | Stop | Ended


class Refused(Exception):
    """A request the rules refuse; the text is the one-line error for the agent or owner."""


@dataclass
class Job:
    id: str
    depth: int
    timeout_ms: int
    state: str = QUEUED
    deadline: int | None = None  # while running: when its timeout stops it
    stopping: str | None = None  # while running: why it was told to stop
    runs: int = 0  # runs started so far


class Jobs:
    """Every job the broker knows, and the queue."""

    def __init__(self, max_jobs: int = MAX_JOBS, max_queued: int = MAX_QUEUED,
                 max_depth: int = MAX_DEPTH) -> None:
        if max_jobs < 1:
            raise ValueError("max_jobs must be at least 1")
        self.max_jobs = max_jobs
        self.max_queued = max_queued
        self.max_depth = max_depth
        self.jobs: dict[str, Job] = {}
        self.queue: list[str] = []  # waiting job ids, first come first

    # --- what is ---------------------------------------------------------------------

    def running(self) -> list[str]:
        return [j.id for j in self.jobs.values() if j.state == RUNNING]

    def state(self, job_id: str) -> str:
        return self._job(job_id).state

    # --- what happens ----------------------------------------------------------------

    def check_submit(self, depth: int) -> None:
        """Raise Refused when a new job of this depth would be refused (nothing changes)."""
        if depth > self.max_depth:
            raise Refused(f"jobs nest at most {self.max_depth} deep: this one would be depth {depth}; "
                          "do the work here or hand it back to the parent")
        if len(self.queue) >= self.max_queued:
            raise Refused(f"{len(self.queue)} jobs are already queued (at most {self.max_queued}): "
                          "wait for some to end, or cancel some with `agent-bridge jobs cancel ID`")

    def submit(self, job_id: str, depth: int, timeout_ms: int) -> list[Effect]:
        """A new job: it starts now when a slot is free, else waits. Raises Refused."""
        if job_id in self.jobs:
            raise Refused(f"job {job_id} exists already")
        self.check_submit(depth)
        self.jobs[job_id] = Job(job_id, depth, timeout_ms)
        self.queue.append(job_id)
        return self._fill()

    def adopt(self, job_id: str, depth: int, timeout_ms: int, state: str, started_at: int | None,
              runs: int) -> None:
        """A job as the store recorded it, when a broker starts: a queued job waits again; a
        running one whose process still runs is running (its deadline from when it started). A
        running job whose process is gone is adopted as running and then reported `exited`."""
        job = Job(job_id, depth, timeout_ms, state=state, runs=runs)
        if state == RUNNING:
            job.deadline = (started_at or 0) + timeout_ms
        self.jobs[job_id] = job
        if state == QUEUED:
            self.queue.append(job_id)

    def fill(self) -> list[Effect]:
        """Start what may start (after adopting)."""
        return self._fill()

    def started(self, job_id: str, now: int) -> None:
        """The run's process started at `now`."""
        job = self._job(job_id)
        if job.state == RUNNING and job.deadline is None:
            job.deadline = now + job.timeout_ms

    def exited(self, job_id: str, *, answered: bool, failed: bool) -> list[Effect]:
        """The run's process is gone (or could not start). `answered`: it printed its final
        answer; `failed`: the host said the run failed. A run told to stop ends as told."""
        job = self._job(job_id)
        if job.state != RUNNING:
            return []  # already ended (a second report of one exit)
        if job.stopping is not None:
            state = STOPPED_AS[job.stopping]
        elif failed:
            state = FAILED
        elif answered:
            state = FINISHED
        else:
            state = INTERRUPTED  # the process went without an answer
        return [self._end(job, state, job.stopping), *self._fill()]

    def cancel(self, job_id: str) -> list[Effect]:
        """The owner or the parent cancels: a waiting job ends at once, a running one is stopped
        (and ends as cancelled when its process is gone). Raises Refused for an ended job."""
        job = self._job(job_id)
        if job.state == QUEUED:
            self.queue.remove(job_id)
            job.runs += 1  # a run that never started: it ends all the same, once
            return [self._end(job, CANCELLED, CANCEL)]
        if job.state == RUNNING:
            return self._stop(job, CANCEL)
        raise Refused(f"job {job_id} has already ended ({job.state})")

    def tick(self, now: int) -> list[Effect]:
        """Time passed: stop every run past its deadline."""
        effects: list[Effect] = []
        for job in self.jobs.values():
            if job.state == RUNNING and job.deadline is not None and now >= job.deadline:
                effects += self._stop(job, TIMEOUT)
        return effects

    def next_deadline(self) -> int | None:
        deadlines = [j.deadline for j in self.jobs.values()
                     if j.state == RUNNING and j.stopping is None and j.deadline is not None]
        return min(deadlines) if deadlines else None

    def resume(self, job_id: str) -> list[Effect]:
        """`continue`: an ended job runs again (its next run), as a new arrival in the queue.
        Raises Refused while it is queued or running, or when the queue is full."""
        job = self._job(job_id)
        if job.state not in ENDED:
            raise Refused(f"job {job_id} is {job.state}: continue it once it has ended")
        if len(self.queue) >= self.max_queued:
            raise Refused(f"{len(self.queue)} jobs are already queued (at most {self.max_queued})")
        job.state, job.stopping, job.deadline = QUEUED, None, None
        self.queue.append(job_id)
        return self._fill()

    def down(self) -> list[Effect]:
        """The broker goes down: every running job is stopped and ends interrupted (resumable);
        waiting jobs stay queued for the next broker."""
        effects: list[Effect] = []
        for job in self.jobs.values():
            if job.state == RUNNING:
                effects += self._stop(job, DOWN)
        self.max_jobs = 0  # nothing starts any more
        return effects

    # --- the rules -------------------------------------------------------------------

    def _job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise Refused(f"no job {job_id}")
        return job

    def _stop(self, job: Job, why: str) -> list[Effect]:
        if job.stopping is not None:
            return []  # already told: the first reason stands
        job.stopping = why
        return [Stop(job.id, why)]

    def _end(self, job: Job, state: str, why: str | None) -> Ended:
        job.state, job.deadline, job.stopping = state, None, None
        return Ended(job.id, state, why)

    def _fill(self) -> list[Effect]:
        effects: list[Effect] = []
        while self.queue and len(self.running()) < self.max_jobs:
            job = self.jobs[self.queue.pop(0)]
            job.state, job.deadline, job.stopping = RUNNING, None, None
            job.runs += 1
            effects.append(Start(job.id))
        return effects

"""Model-based test of the job machine (agent_bridge/core/jobs.py), like the showing machine's:
hypothesis drives any sequence of what can happen to jobs (asked for, started, exited with or
without an answer, cancelled, timed out, continued, the broker going down) and checks, after
every step, the rules of SPEC §4.7 against a record kept here from the effects alone:

- never more than max_jobs running, never more than max_queued waiting;
- jobs start first come first served;
- each run ends exactly once, with one `Ended`, and a job runs again only after `continue`;
- a run told to stop ends as it was told (cancel → cancelled, timeout → failed, down →
  interrupted), whatever its process reported; an untold run ends finished, failed or
  interrupted by what its process reported;
- nothing starts after `down`.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent_bridge.core import jobs as J

MAX_JOBS, MAX_QUEUED = 2, 3


class JobsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m = J.Jobs(max_jobs=MAX_JOBS, max_queued=MAX_QUEUED)
        self.now = 0
        self.count = 0
        self.waiting: list[str] = []  # our own queue, from what was asked and what started
        self.running: dict[str, str | None] = {}  # job -> why it was told to stop (first reason)
        self.ended: dict[str, str] = {}  # job -> state of its last ended run
        self.runs: dict[str, int] = {}
        self.ends: dict[str, int] = {}
        self.is_down = False

    def apply(self, effects: list[J.Effect]) -> None:
        for effect in effects:
            if isinstance(effect, J.Start):
                assert not self.is_down, "a job started after down"
                assert self.waiting and self.waiting[0] == effect.job_id, "not first come first served"
                self.waiting.pop(0)
                self.running[effect.job_id] = None
                self.runs[effect.job_id] = self.runs.get(effect.job_id, 0) + 1
                self.m.started(effect.job_id, self.now)
            elif isinstance(effect, J.Stop):
                assert effect.job_id in self.running and self.running[effect.job_id] is None
                self.running[effect.job_id] = effect.why
            else:
                assert isinstance(effect, J.Ended)
                self.ends[effect.job_id] = self.ends.get(effect.job_id, 0) + 1
                assert self.ends[effect.job_id] == self.runs.get(effect.job_id, 0) or (
                    effect.state == J.CANCELLED and effect.job_id in self.waiting
                ), "a run ended twice, or a job ended that never ran"
                if effect.job_id in self.waiting:  # cancelled while waiting
                    self.waiting.remove(effect.job_id)
                    self.runs[effect.job_id] = self.runs.get(effect.job_id, 0) + 1  # an empty run
                else:
                    told = self.running.pop(effect.job_id)
                    if told is not None:
                        assert effect.state == J.STOPPED_AS[told] and effect.why == told
                self.ended[effect.job_id] = effect.state

    # --- what can happen ---------------------------------------------------------------

    @rule(depth=st.integers(1, 3))
    def ask(self, depth: int) -> None:
        self.count += 1
        job_id = f"j{self.count}"
        try:
            effects = self.m.submit(job_id, depth, timeout_ms=100)
        except J.Refused:
            assert depth > J.MAX_DEPTH or len(self.waiting) >= MAX_QUEUED
            return
        assert depth <= J.MAX_DEPTH and len(self.waiting) < MAX_QUEUED
        self.waiting.append(job_id)
        self.apply(effects)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), answered=st.booleans(), failed=st.booleans())
    def exit(self, data: st.DataObject, answered: bool, failed: bool) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.running)))
        told = self.running[job_id]
        before = self.runs[job_id]
        self.apply(self.m.exited(job_id, answered=answered, failed=failed))
        assert self.ends[job_id] == before
        if told is None:
            expected = J.FAILED if failed else J.FINISHED if answered else J.INTERRUPTED
            assert self.ended[job_id] == expected

    @precondition(lambda self: self.count)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = f"j{data.draw(st.integers(1, self.count))}"
        if job_id not in self.m.jobs:
            with pytest.raises(J.Refused):
                self.m.cancel(job_id)
            return
        if job_id in self.ended and job_id not in self.running and job_id not in self.waiting:
            with pytest.raises(J.Refused):
                self.m.cancel(job_id)
            return
        self.apply(self.m.cancel(job_id))

    @rule(ms=st.integers(0, 150))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        self.apply(self.m.tick(self.now))

    @precondition(lambda self: self.ended)
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.ended)))
        if job_id in self.running or job_id in self.waiting or len(self.waiting) >= MAX_QUEUED:
            with pytest.raises(J.Refused):
                self.m.resume(job_id)
            return
        if self.is_down:
            self.waiting.append(job_id)
            assert self.m.resume(job_id) == []  # waits for the next broker
            return
        self.waiting.append(job_id)
        self.apply(self.m.resume(job_id))

    @rule()
    def down(self) -> None:
        self.is_down = True
        self.apply(self.m.down())
        assert all(why is not None for why in self.running.values())

    # --- the rules ---------------------------------------------------------------------

    @invariant()
    def agrees(self) -> None:
        assert len(self.running) <= MAX_JOBS
        assert len(self.waiting) <= MAX_QUEUED
        assert sorted(self.m.running()) == sorted(self.running)
        assert self.m.queue == self.waiting
        if not self.is_down:  # a free slot never leaves a job waiting
            assert not self.waiting or len(self.running) == MAX_JOBS
        for job_id, state in self.ended.items():
            if job_id not in self.running and job_id not in self.waiting:
                assert self.m.state(job_id) == state

    @invariant()
    def deadlines_stop_runs(self) -> None:
        late = [j for j in self.m.jobs.values() if j.state == J.RUNNING and j.deadline is not None
                and j.deadline <= self.now]
        assert all(self.running[j.id] is not None for j in late), "a run outlived its timeout"


TestJobsModel = JobsModel.TestCase
TestJobsModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_a_stopped_run_ends_as_told_whatever_it_printed() -> None:
    m = J.Jobs(max_jobs=1)
    assert m.submit("a", 1, 1000) == [J.Start("a")]
    assert m.submit("b", 1, 1000) == []  # waits for the slot
    m.started("a", 0)
    assert m.tick(999) == []
    assert m.tick(1000) == [J.Stop("a", J.TIMEOUT)]
    assert m.cancel("a") == []  # already told: the first reason stands
    assert m.exited("a", answered=True, failed=False) == [J.Ended("a", J.FAILED, J.TIMEOUT), J.Start("b")]


def test_refusals_are_one_line() -> None:
    m = J.Jobs(max_jobs=1, max_queued=1)
    with pytest.raises(J.Refused) as deep:
        m.submit("x", 3, 10)
    m.submit("a", 1, 10)
    m.submit("b", 1, 10)
    with pytest.raises(J.Refused) as full:
        m.submit("c", 1, 10)
    with pytest.raises(J.Refused) as running:
        m.resume("a")
    for refusal in (deep, full, running):
        assert "\n" not in str(refusal.value) and str(refusal.value)

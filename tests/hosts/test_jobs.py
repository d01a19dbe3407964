"""Delegation end to end (SPEC §4.7): real Claude Code and Codex sessions hand work to each other
through the `delegate` tool, against the scripted models. The job runs under the broker's
supervision (a broker started with the offline environment the job's host needs: a job inherits
the broker's environment) and its answer comes back to the parent as one message of kind `job`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_bridge.common import paths
from agent_bridge.store import job_queries, reader
from tests.hosts.conftest import (
    GATE_STEP,
    World,
    codex_outputs,
    plan,
    poll_until,
    result_text,
    tool_results,
    wait_gone,
)

pytestmark = pytest.mark.slow


def jobs(world: World) -> list[dict[str, Any]]:
    with reader.reading(world.bridge_home / "bridge.db") as conn:
        rows = [] if conn is None else job_queries.jobs(conn, every=True)
    return [j.to_json() | {"pid": j.pid, "run": j.run} for j in rows]


def job_messages(world: World) -> list[tuple[str, str]]:
    """(recipient name, body) of every answer message a job's run sent, in order."""
    with reader.reading(world.bridge_home / "bridge.db") as conn:
        assert conn is not None
        rows = conn.execute(
            "SELECT p.name, m.body FROM messages m JOIN job_events e ON e.message_id = m.id "
            "JOIN peers p ON p.id = m.to_peer ORDER BY e.seq").fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def family(pid: int) -> list[int]:
    """`pid` and every process under it (a host may start its MCP servers in groups of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` still runs (zombies count as gone)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


@pytest.fixture
def jobs_world(world: World) -> Iterator[World]:
    world.restart_broker(world.job_env())
    yield world
    # nothing a job started is left running once its broker is down
    world.bridge("down", check=False)
    for job in jobs(world):
        if job["pid"]:
            poll_until(lambda pid=job["pid"]: not group_alive(pid), f"job {job['name']}'s processes to end",
                       timeout=10)


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True)
    return done.stdout


def after_delegate(requests: list[Any], job: dict[str, Any]) -> Any:
    """The parent model's request that carries `delegate`'s answer (the job's id in its result):
    the job's answer message must be in it, put there by the hook that ran after that tool call
    (the broker adds the parent's post box file before a waiting `delegate` is answered)."""
    carrying = [r for r in requests if job["id"] in r.text]
    assert carrying, "no request carried delegate's answer"
    return carrying[0]


def claude_parent(world: World, *steps: tuple[str, dict[str, Any]]) -> tuple[str, Any]:
    session = str(uuid.uuid4())
    return session, world.claude(plan(*steps), session_id=session)


def test_claude_delegates_to_codex_and_gets_the_answer_in_its_next_request(jobs_world: World) -> None:
    w = jobs_world
    w.bridge("decide", "lint", "ruff only, decided before the job")
    task = plan(("whoami", {})) + " review the diff"
    _, run = claude_parent(w, ("delegate", {"agent": "codex", "task": task,
                                            "wait_seconds": 50}), ("whoami", {}))
    run.wait()
    [job] = jobs(w)
    assert job["state"] == "finished" and job["agent"] == "codex" and job["access"] == "read"
    assert job["answer"] == "done." and job["thread"]
    # the job's first request knew the owner's decision
    assert "ruff only, decided before the job" in w.codex_model.requests[0].text
    # its answer came back as one message of kind job, shown to the parent model mid-turn
    [(to, body)] = job_messages(w)
    assert to.startswith("claude") and body.startswith(f"Job {job['name']} (codex, read access) finished")
    said = f"Job {job['name']} (codex, read access) finished"
    assert said in after_delegate(w.claude_model.requests, job).text, "not in the parent's next request"


def test_codex_delegates_to_claude_and_gets_the_answer_in_its_next_request(jobs_world: World) -> None:
    w = jobs_world
    w.bridge("decide", "db", "PostgreSQL, decided before the job")
    w.codex(plan(("delegate", {"agent": "claude", "task": plan(("whoami", {})) + " check the migration",
                              "wait_seconds": 50}), ("whoami", {}))).wait()
    [job] = jobs(w)
    assert job["state"] == "finished" and job["agent"] == "claude" and job["answer"] == "done."
    assert "PostgreSQL, decided before the job" in w.claude_model.requests[0].text
    [(to, body)] = job_messages(w)
    assert to.startswith("codex") and f"Job {job['name']} (claude, read access) finished" in body
    said = f"Job {job['name']} (claude, read access) finished"
    assert said in after_delegate(w.codex_model.requests, job).text, "not in the parent's next request"


def test_a_worktree_job_edits_its_branch_and_never_the_working_copy(jobs_world: World) -> None:
    w = jobs_world
    git(w.project, "init", "-q")
    (w.project / "app.py").write_text("print('v1')\n", encoding="utf-8")
    git(w.project, "add", "app.py")
    git(w.project, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    def copy() -> tuple[str, str, str]:
        return (git(w.project, "status", "--porcelain"), git(w.project, "diff", "--cached"),
                git(w.project, "log"))

    before = copy()
    command = "echo \"print('v2')\" > app.py && echo new > added.txt"
    task = plan(("!exec_command", {"cmd": command})) + " edit it"
    _, run = claude_parent(w, ("delegate", {"agent": "codex", "task": task, "worktree": True,
                                            "wait_seconds": 50}))
    run.wait()
    [job] = jobs(w)
    assert job["state"] == "finished" and job["access"] == "edit"
    branch, worktree = job["branch"], Path(job["worktree"])
    assert branch == f"agent-bridge/{job['name']}" and worktree == w.bridge_home / "worktrees" / job["name"]
    # the edit is on the branch, committed; the project's working copy and index are as they were
    assert git(w.project, "show", f"{branch}:app.py") == "print('v2')\n"
    assert git(w.project, "show", f"{branch}:added.txt") == "new\n"
    assert (w.project / "app.py").read_text(encoding="utf-8") == "print('v1')\n"
    assert not (w.project / "added.txt").exists()
    assert copy() == before
    [(_, body)] = job_messages(w)
    assert f"on branch {branch}" in body and f"merge {branch}" in body and "added.txt" in body


def test_read_access_through_delegate_leaves_the_tree_byte_identical(jobs_world: World) -> None:
    w = jobs_world
    (w.project / "keep.txt").write_text("mine\n", encoding="utf-8")
    task = plan(("!exec_command", {"cmd": "echo changed > keep.txt; touch new.txt"})) + " try to write"
    _, run = claude_parent(w, ("delegate", {"agent": "codex", "task": task, "wait_seconds": 50}))
    run.wait()
    [job] = jobs(w)
    assert job["state"] == "finished"
    assert sorted(p.name for p in w.project.iterdir()) == ["keep.txt"]
    assert (w.project / "keep.txt").read_text(encoding="utf-8") == "mine\n"
    [out] = codex_outputs(w.codex_model.requests[-1].body)
    assert "Read-only file system" in " ".join(out)


def test_a_running_job_gets_a_message_between_tool_calls_and_continue_resumes_it(jobs_world: World) -> None:
    w = jobs_world
    task = plan(("whoami", {}), GATE_STEP("job-works"), ("whoami", {})) + " long job"
    _, run = claude_parent(w, ("delegate", {"agent": "claude", "task": task}))
    run.wait()
    w.claude_model.wait_reached("job-works")
    [job] = jobs(w)
    assert job["state"] == "running"
    w.bridge("send", job["name"], "owner here: also check the README")
    w.claude_model.open_gate("job-works")
    poll_until(lambda: jobs(w)[0]["state"] == "finished", "the job's end")
    job_requests = w.claude_model.of_session(job["id"])
    assert any("owner here: also check the README" in r.text for r in job_requests[1:-1] + job_requests[-1:])
    # continue: the same thread, with its context
    _, again = claude_parent(w, ("job", {"id": job["id"], "action": "continue",
                                         "message": "PLAN [] and now the tests?"}))
    again.wait()
    poll_until(lambda: (jobs(w)[0]["state"], jobs(w)[0]["run"]) == ("finished", 2), "the continued run's end")
    last = w.claude_model.of_session(job["id"])[-1]
    assert "long job" in last.text and "and now the tests?" in last.text
    assert len(job_messages(w)) == 2


def test_cancel_ends_the_process_group_and_the_parent_gets_the_cancelled_result(jobs_world: World) -> None:
    w = jobs_world
    task = plan(("whoami", {}), GATE_STEP("held")) + " never ends"
    _, run = claude_parent(w, ("delegate", {"agent": "codex", "task": task}))
    run.wait()
    w.codex_model.wait_reached("held")
    [job] = jobs(w)
    pgid = job["pid"]
    assert job["state"] == "running" and group_alive(pgid)
    done = w.bridge("jobs", "cancel", job["name"])
    assert "Stopping" in done.stdout
    poll_until(lambda: not group_alive(pgid), "the job's process group to end", timeout=5)
    poll_until(lambda: jobs(w)[0]["state"] == "cancelled", "the cancelled state")
    [(to, body)] = job_messages(w)
    assert to.startswith("claude") and f"Job {job['name']} (codex, read access) was cancelled" in body
    w.codex_model.open_gate("held")


def test_a_job_past_its_timeout_is_stopped_and_the_parent_told_how_to_continue(jobs_world: World) -> None:
    w = jobs_world
    task = plan(("whoami", {}), GATE_STEP("too-long")) + " slow"
    _, run = claude_parent(w, ("delegate", {"agent": "codex", "task": task, "timeout_seconds": 2}))
    run.wait()
    w.codex_model.wait_reached("too-long")
    poll_until(lambda: jobs(w)[0]["state"] == "failed", "the timeout", timeout=30)
    [job] = jobs(w)
    poll_until(lambda: not group_alive(job["pid"]), "the job's process group to end", timeout=10)
    [(_, body)] = job_messages(w)
    assert f"Job {job['name']} (codex, read access) failed: it ran past its timeout (2 s)" in body
    assert f'job(id="{job["id"]}", action="continue"' in body
    w.codex_model.open_gate("too-long")


def test_a_broker_killed_while_a_job_runs_delivers_its_answer_once_after_restart(jobs_world: World) -> None:
    w = jobs_world
    task = plan(("whoami", {}), GATE_STEP("through-a-crash")) + " survive"
    _, run = claude_parent(w, ("delegate", {"agent": "codex", "task": task}))
    run.wait()
    w.codex_model.wait_reached("through-a-crash")
    record = paths.read_broker_json(w.bridge_home)
    assert record is not None
    os.kill(record["pid"], signal.SIGKILL)
    wait_gone(record["pid"])
    w.restart_broker(w.job_env(), down=False)  # the job's own MCP server may have started one already
    [job] = jobs(w)
    assert job["state"] == "running" and group_alive(job["pid"])  # adopted, not restarted
    w.codex_model.open_gate("through-a-crash")
    poll_until(lambda: jobs(w)[0]["state"] == "finished", "the adopted job's end")
    [(to, body)] = job_messages(w)  # once
    assert f"Job {job['name']} (codex, read access) finished" in body
    # unmarked: the parent has never been offered it, so it is no repeat
    with reader.reading(w.bridge_home / "bridge.db") as conn:
        assert conn is not None
        [(offered,)] = conn.execute(
            "SELECT r.offered_at FROM receipts r JOIN job_events e ON e.message_id = r.message_id").fetchall()
    assert offered is None


def test_a_job_whose_process_died_is_interrupted_and_continue_resumes_it(jobs_world: World) -> None:
    w = jobs_world
    task = plan(("whoami", {}), GATE_STEP("dies")) + " remember PERIWINKLE"
    _, run = claude_parent(w, ("delegate", {"agent": "codex", "task": task}))
    run.wait()
    w.codex_model.wait_reached("dies")
    record = paths.read_broker_json(w.bridge_home)
    assert record is not None
    [job] = jobs(w)
    # frozen first, so that its MCP server cannot start another broker in between; then the
    # broker and the job die while no broker watches
    frozen = family(job["pid"])
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    os.kill(record["pid"], signal.SIGKILL)
    wait_gone(record["pid"])
    for pid in frozen:
        os.kill(pid, signal.SIGKILL)
    poll_until(lambda: not group_alive(job["pid"]), "the job's process group to end")
    w.codex_model.open_gate("dies")
    w.restart_broker(w.job_env(), down=False)
    poll_until(lambda: jobs(w)[0]["state"] == "interrupted", "the interrupted state")
    [(_, body)] = job_messages(w)
    assert "was interrupted" in body and "continue" in body
    _, again = claude_parent(w, ("job", {"id": job["id"], "action": "continue", "message": "PLAN [] go on"}))
    again.wait()
    poll_until(lambda: jobs(w)[0]["state"] == "finished", "the resumed run's end")
    last = w.codex_model.requests[-1]
    assert "remember PERIWINKLE" in last.text and "go on" in last.text


def test_down_interrupts_a_running_job_says_so_and_continue_resumes_it(jobs_world: World) -> None:
    w = jobs_world
    task = plan(("whoami", {}), GATE_STEP("at-down")) + " remember CELADON"
    _, run = claude_parent(w, ("delegate", {"agent": "claude", "task": task}))
    run.wait()
    w.claude_model.wait_reached("at-down")
    [job] = jobs(w)
    assert job["state"] == "running"
    stopped = w.bridge("down")
    assert "1 running job interrupted" in stopped.stdout and "continue" in stopped.stdout
    [job] = jobs(w)
    assert job["state"] == "interrupted" and not group_alive(job["pid"])  # recorded before the store closed
    [(_, body)] = job_messages(w)
    assert f"Job {job['name']} (claude, read access) was interrupted" in body
    w.claude_model.open_gate("at-down")
    w.restart_broker(w.job_env(), down=False)
    _, again = claude_parent(w, ("job", {"id": job["name"], "action": "continue",
                                         "message": "PLAN [] go on"}))
    again.wait()
    poll_until(lambda: (jobs(w)[0]["state"], jobs(w)[0]["run"]) == ("finished", 2), "the resumed run's end")
    last = w.claude_model.of_session(job["id"])[-1]
    assert "remember CELADON" in last.text and "go on" in last.text
    assert len(job_messages(w)) == 2


def test_max_jobs_queues_the_fifth(jobs_world: World) -> None:
    w = jobs_world
    steps = [("delegate", {"agent": "codex", "task": plan(("whoami", {}), GATE_STEP("five")) + f" job {n}"})
             for n in range(5)]
    _, run = claude_parent(w, *steps)
    run.wait()
    poll_until(lambda: sum(j["state"] == "running" for j in jobs(w)) == 4, "four running jobs")
    states = [j["state"] for j in jobs(w)]
    assert states.count("running") == 4 and states.count("queued") == 1
    assert jobs(w)[-1]["state"] == "queued"  # first come, first served
    listed = w.bridge("jobs", "--json")
    assert len(json.loads(listed.stdout)) == 5
    w.codex_model.open_gate("five")
    poll_until(lambda: all(j["state"] == "finished" for j in jobs(w)), "all five to finish", timeout=90)
    assert len(job_messages(w)) == 5


def test_refusals_start_nothing_and_say_what_to_do(jobs_world: World, tmp_path: Path) -> None:
    w = jobs_world
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _, run = claude_parent(
        w,
        ("delegate", {"agent": "codex", "task": "x", "cwd": str(outside)}),
        ("delegate", {"agent": "codex", "task": "x", "worktree": True}),  # the project is no git repository
        ("delegate", {"agent": "gemini", "task": "x"}),
    )
    run.wait()
    texts = [result_text(b) for b in tool_results(w.claude_model.requests[-1].body)]
    assert len(texts) == 3
    assert "outside this session's project" in texts[0]
    assert "not in a git repository" in texts[1]
    assert "expected one of" in texts[2] or "gemini" in texts[2]
    assert all("\n" not in t for t in texts)
    assert jobs(w) == []
    # a host CLI that is not there: the broker's PATH has no codex
    w.restart_broker({**w.job_env(), "PATH": "/usr/bin:/bin"})
    _, run = claude_parent(w, ("delegate", {"agent": "codex", "task": "x"}))
    run.wait()
    [text] = [result_text(b) for b in tool_results(w.claude_model.requests[-1].body)]
    assert "codex is not on PATH" in text and "npm install" in text
    assert jobs(w) == []


def test_depth_three_is_refused(jobs_world: World) -> None:
    w = jobs_world
    inner = plan(("delegate", {"agent": "codex", "task": "PLAN [] too deep"}))
    middle = plan(("delegate", {"agent": "claude", "task": inner, "wait_seconds": 50}))
    _, run = claude_parent(w, ("delegate", {"agent": "codex", "task": middle, "wait_seconds": 50}))
    run.wait()
    found = jobs(w)
    assert [j["agent"] for j in found] == ["codex", "claude"]  # depth 1 and 2; the third was refused
    depth2 = w.claude_model.of_session(found[1]["id"])
    assert any("jobs nest at most 2 deep" in r.text for r in depth2)

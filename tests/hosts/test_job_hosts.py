"""How each host runs a job (SPEC §4.7), with the real CLIs against the scripted models: the
command `Host.job_command` builds is started here as the broker starts it (its own process
group, stdin from the command, output to files), and `Host.job_report` reads what it printed.

What is proved per host: under `read` the model's attempts to write a file and to run a shell
command that writes one leave the project byte-identical; under `edit` the same writes land; the
bridge is there whatever `install` did (these runs follow an `uninstall`); the first model
request carries a decision recorded before the job started; `continue` resumes the host's thread
with its context; a task that looks like a flag is read as the task.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from agent_bridge import hosts
from agent_bridge.hosts.base import JobLaunch, JobReport
from tests.hostbin import CLAUDE_OFFLINE_ENV
from tests.hosts.conftest import (
    AGENT_BRIDGE,
    RUN_TIMEOUT,
    World,
    claude_tool_names,
    codex_messages,
    codex_outputs,
    plan,
    result_text,
    tool_results,
)

pytestmark = pytest.mark.slow

HOSTS = ("claude", "codex")


def tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` (but .git's innards) with the hash of its bytes."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and ".git" not in path.relative_to(folder).parts:
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def launch(world: World, agent: str, task: str, *, access: str = "read", thread: str | None = None,
           job_id: str | None = None, note: str = "") -> JobLaunch:
    job_id = job_id or str(uuid.uuid4())
    name = f"{agent}-job-{job_id[:8]}"
    out = world.root / "jobs" / job_id
    out.mkdir(parents=True, exist_ok=True)
    bridge = [AGENT_BRIDGE, "mcp", "--job", "--agent", agent, "--name", name, "--project", str(world.project)]
    return JobLaunch(job_id, name, task, note, access, world.project, world.project, None, thread, bridge,
                     {"AGENT_BRIDGE_HOME": str(world.bridge_home)}, out)


def run_job(world: World, agent: str, job: JobLaunch) -> tuple[JobReport, bytes]:
    """Start the job's command as the broker does and wait for it; (its report, its stdout)."""
    host = hosts.by_name(agent)
    assert host is not None
    command = host.job_command(job)
    env = {**world.base_env(), **command.env}
    if agent == "claude":
        env.update(CLAUDE_OFFLINE_ENV, ANTHROPIC_BASE_URL=world.claude_model.url,
                   CLAUDE_CODE_TMPDIR=str(world.root / "tmp"))
    else:
        env.update(CODEX_HOME=str(world.codex_home), FAKE_MODEL_KEY="test-key")
    proc = subprocess.Popen(command.argv, cwd=job.cwd, env=env, start_new_session=True,
                            stdin=subprocess.PIPE if command.stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    world.procs.append(proc)  # type: ignore[arg-type]  # killed at teardown if still running
    out, err = proc.communicate(command.stdin, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, f"{agent} exited {proc.returncode}: {err[-3000:]!r}"
    return host.job_report(out), out


@pytest.fixture
def bare(world: World) -> World:
    """The world with nothing installed: a job's host gets the bridge from its command line."""
    world.bridge("uninstall", "--claude", "--codex")
    return world


def model_of(world: World, agent: str):  # type: ignore[no-untyped-def]
    return world.claude_model if agent == "claude" else world.codex_model


def writes(agent: str, project: Path) -> str:
    """A plan whose model writes a file with the host's edit tool (Claude Code) and runs a shell
    command that writes one."""
    if agent == "claude":
        return plan(("Write", {"file_path": str(project / "written.txt"), "content": "by the job"}),
                    ("Bash", {"command": f"echo by-the-job > {project / 'shell.txt'}"}))
    return plan(("!exec_command", {"cmd": f"echo by-the-job > {project / 'shell.txt'}"}),
                ("!exec_command", {"cmd": f"python3 -c \"open('{project / 'written.txt'}','w')\""}))


@pytest.mark.parametrize("agent", HOSTS)
def test_read_access_leaves_the_project_byte_identical(bare: World, agent: str) -> None:
    (bare.project / "keep.txt").write_text("the owner's file\n", encoding="utf-8")
    before = tree(bare.project)
    report, _ = run_job(bare, agent, launch(bare, agent, writes(agent, bare.project)))
    assert report.answer == "done." and report.failed is None
    assert report.thread
    assert tree(bare.project) == before
    # the model did try, and the host refused each attempt
    last = model_of(bare, agent).requests[-1].body
    if agent == "claude":  # the editing and shell tools are not there at all, not even to load
        assert not {"Write", "Bash", "Edit"} & claude_tool_names(last)
        refusals = [result_text(b) for b in tool_results(last, with_searches=True)]
        assert refusals == ["No matching deferred tools found"] * 2
    else:  # Codex's sandbox: the shell ran, its writes failed
        outputs = [" ".join(o) for o in codex_outputs(last)]
        assert len(outputs) == 2 and all("Read-only file system" in o for o in outputs), outputs


@pytest.mark.parametrize("agent", HOSTS)
def test_edit_access_lets_the_same_writes_land(bare: World, agent: str) -> None:
    report, _ = run_job(bare, agent, launch(bare, agent, writes(agent, bare.project), access="edit"))
    assert report.answer == "done." and report.failed is None
    assert (bare.project / "shell.txt").exists() or (bare.project / "written.txt").exists()
    if agent == "codex":
        assert (bare.project / "shell.txt").read_text(encoding="utf-8").strip() == "by-the-job"
    else:
        assert (bare.project / "written.txt").read_text(encoding="utf-8") == "by the job"


@pytest.mark.parametrize("agent", HOSTS)
def test_the_first_request_knows_the_owners_decision_and_the_bridge_is_there(bare: World, agent: str) -> None:
    bare.bridge("decide", "database", "PostgreSQL 16, decided before the job")
    note = "Pinned owner decisions: database: PostgreSQL 16, decided before the job"
    report, _ = run_job(bare, agent, launch(bare, agent, plan(("whoami", {})), note=note))
    assert report.failed is None
    first = model_of(bare, agent).requests[0]
    assert "PostgreSQL 16, decided before the job" in first.text
    # the bridge's tools are there from the first step (the job's command has its host wait for them)
    assert ("mcp__agent-bridge__delegate" if agent == "claude" else '"mcp__agent_bridge"') in first.text
    # the bridge's whoami answered, as the job's session, of kind job
    last = model_of(bare, agent).requests[-1].text
    assert f"{agent}-job-" in last and '\\"kind\\": \\"job\\"' in last.replace(' ', ' ')


@pytest.mark.parametrize("agent", HOSTS)
def test_continue_resumes_the_thread_with_its_context(bare: World, agent: str) -> None:
    job = launch(bare, agent, "PLAN [] remember the word HELIOTROPE")
    first, _ = run_job(bare, agent, job)
    assert first.thread and first.answer == "done."
    again = launch(bare, agent, "PLAN [] what was the word?", thread=first.thread, job_id=job.job_id)
    second, _ = run_job(bare, agent, again)
    assert second.thread == first.thread
    last = model_of(bare, agent).requests[-1]
    assert "HELIOTROPE" in last.text and "what was the word?" in last.text


def test_a_claude_job_starts_with_its_note_before_the_task_and_its_hook_runs_at_continue(bare: World) -> None:
    """Claude Code waits for a SessionStart hook before its first request: a job's first run has
    its note before the task (as Codex has) and no hook; `continue` runs the hook, whose note
    carries what was decided since."""
    bare.bridge("decide", "queue", "RabbitMQ, decided before the job")
    note = "agent-bridge: you are claude-job-x. Owner decisions: queue: RabbitMQ, decided before the job"
    job = launch(bare, "claude", "PLAN [] first run", note=note)
    first, _ = run_job(bare, "claude", job)
    assert first.answer == "done." and first.thread
    [request] = bare.claude_model.of_session(first.thread)
    prompt = request.body["messages"][0]["content"]
    prompt_text = prompt if isinstance(prompt, str) else " ".join(b.get("text", "") for b in prompt)
    assert f"{note}\n\nPLAN [] first run" in prompt_text
    assert "SessionStart hook additional context" not in request.text
    bare.bridge("decide", "cache", "Redis, decided between the runs")
    again = launch(bare, "claude", "PLAN [] second run", thread=first.thread, job_id=job.job_id, note=note)
    second, _ = run_job(bare, "claude", again)
    assert second.answer == "done."
    last = bare.claude_model.requests[-1]
    assert "SessionStart hook additional context" in last.text
    assert "Redis, decided between the runs" in last.text
    assert last.text.count(note) == 1  # the first run's prompt, in the thread; not put before this one


@pytest.mark.parametrize("agent", HOSTS)
def test_a_task_that_looks_like_a_flag_is_the_task(bare: World, agent: str) -> None:
    report, out = run_job(bare, agent, launch(bare, agent, "--help PLAN []"))
    assert report.answer == "done.", out[-2000:]
    seen = model_of(bare, agent).requests[-1]
    texts = seen.text if agent == "claude" else " ".join(codex_messages(seen.body, "user"))
    assert "--help PLAN []" in texts


def test_a_missing_cli_is_one_line_saying_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    for host in hosts.ALL:
        problem = host.job_check()
        assert problem is not None and "\n" not in problem and "install" in problem


def test_the_installed_clis_can_run_jobs(host_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join([str(host_bin), os.environ.get("PATH", "")]))
    assert [host.job_check() for host in hosts.ALL] == [None] * len(hosts.ALL)

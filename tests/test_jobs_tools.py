"""`delegate`, `job` and `agent-bridge jobs` refuse bad input (SPEC §4.7, §5): through the real
MCP client and the CLI against a real broker, each refusal is one line that says what to do, and
nothing is recorded: no job, no session, no worktree. (Jobs that run are proved with the real
hosts in tests/hosts/test_jobs.py.)"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import call, call_error, mcp_session, run_cli

pytestmark = pytest.mark.slow

BAD_DELEGATE: list[tuple[dict[str, Any], str]] = [
    ({"agent": "gemini", "task": "x"}, "agent: expected one of"),
    ({"task": "x"}, "missing required argument agent"),
    ({"agent": "codex"}, "missing required argument task"),
    ({"agent": "codex", "task": "   "}, "task: expected a non-empty string"),
    ({"agent": "codex", "task": "x" * 20_001}, "task: at most 20000 characters"),
    ({"agent": "codex", "task": "x", "access": "write"}, 'access: expected "read" or "edit"'),
    ({"agent": "codex", "task": "x", "worktree": "yes"}, "worktree: expected true or false"),
    ({"agent": "codex", "task": "x", "timeout_seconds": 0}, "timeout_seconds: expected a number"),
    ({"agent": "codex", "task": "x", "timeout_seconds": True}, "timeout_seconds: expected a JSON number"),
    ({"agent": "codex", "task": "x", "wait_seconds": 51}, "wait_seconds: expected a number from 0 to 50"),
    ({"agent": "codex", "task": "x", "cwd": "/etc"}, "outside this session's project"),
    ({"agent": "codex", "task": "x", "cwd": "relative/folder"}, "cwd"),
    ({"agent": "codex", "task": "x", "model": ""}, "model: expected a non-empty string"),
    ({"agent": "codex", "task": "x", "colour": "red"}, "colour"),
]


def stored(home: Path) -> tuple[int, int]:
    """(jobs, sessions of kind job) in the broker's database."""
    conn = sqlite3.connect(f"file:{home / 'bridge.db'}?mode=ro", uri=True)
    try:
        jobs = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        peers = conn.execute("SELECT count(*) FROM peers WHERE kind = 'job'").fetchone()[0]
    finally:
        conn.close()
    return int(jobs), int(peers)


async def test_bad_delegate_and_job_calls_are_refused_in_one_line_and_store_nothing(
    env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    # no host CLI on the broker's PATH (the relay starts the broker with this environment)
    env = {**env, "PATH": os.pathsep.join(d for d in env["PATH"].split(os.pathsep)
                                          if not any(shutil.which(c, path=d) for c in ("codex", "claude")))}
    with trio.fail_after(120):
        async with mcp_session(env, "--agent", "claude", "--project", str(project)) as s:
            await call(s, "whoami")
            for args, said in BAD_DELEGATE:
                text = await call_error(s, "delegate", **args)
                assert said in text, (args, text)
                assert "\n" not in text.strip(), text
            # a worktree needs git: the project is no repository
            text = await call_error(s, "delegate", agent="codex", task="x", worktree=True)
            assert "not in a git repository" in text and "\n" not in text.strip()
            # all else right, but the host's CLI is not there
            for agent, said in (("codex", "codex is not on PATH: install it (npm install -g @openai/codex)"),
                                ("claude", "claude (Claude Code) is not on PATH: install it "
                                           "(npm install -g @anthropic-ai/claude-code)")):
                text = await call_error(s, "delegate", agent=agent, task="x")
                assert said in text and "\n" not in text.strip(), text
            for args, said in [
                ({"id": "no-such-job"}, "no job has id or name 'no-such-job'"),
                ({}, "missing required argument id"),
                ({"id": "x" * 201}, "id: expected a job's id or name"),
            ]:
                text = await call_error(s, "job", **args)
                assert said in text and "\n" not in text.strip(), (args, text)
    assert stored(home) == (0, 0)
    assert not (home / "worktrees").exists() or not any((home / "worktrees").iterdir())


def test_the_jobs_command_lists_none_and_refuses_an_unknown_cancel(env: dict[str, str], home: Path) -> None:
    run_cli(env, "up", "--detach")
    try:
        listed = run_cli(env, "jobs")
        assert listed.returncode == 0 and "No running or queued jobs" in listed.stdout
        as_json = run_cli(env, "jobs", "--all", "--json")
        assert as_json.returncode == 0 and json.loads(as_json.stdout) == []
        refused = run_cli(env, "jobs", "cancel", "nope")
        assert refused.returncode != 0
        err = refused.stderr.strip()
        assert "no job has id or name 'nope'" in err and "\n" not in err, err
    finally:
        run_cli(env, "down")

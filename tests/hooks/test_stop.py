"""`agent-bridge hook stop` with no broker running: nothing can be
acknowledged, so nothing blocks; the identity is still left for the next broker."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from agent_bridge.common import paths
from tests.hooks.conftest import build_db, hook_env, log_lines, run_hook

SID = "hs-stop-1"


@pytest.mark.parametrize("agent", ["claude", "codex"])
@pytest.mark.parametrize("active", [False, True])
def test_broker_down_exits_0_silently_and_leaves_the_identity(agent, active, hook_home, project):
    build_db(hook_home, [("camera", "Hold to look", "all")])
    stdin = {"session_id": SID, "transcript_path": None, "cwd": str(project), "hook_event_name": "Stop",
             "stop_hook_active": active, "last_assistant_message": "Done.", "turn_id": "t-1"}
    result = run_hook(
        "stop", agent, stdin, hook_env(hook_home, AGENT_BRIDGE_HOST_PID=str(os.getpid())), cwd=project
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert log_lines(hook_home) == []  # a broker that is down is not a failure
    report = json.loads(
        (
            hook_home / paths.REPORTS_DIR / (hashlib.sha256(SID.encode()).hexdigest()[:32] + ".json")
        ).read_text()
    )
    assert report["event"] == "Stop" and report["agent"] == agent and report["source"] == ""
    assert report["host"]["pid"] == os.getpid()


def test_a_stale_broker_record_exits_0_silently(hook_home, project):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    paths.ensure_home(hook_home)
    (hook_home / paths.BROKER_JSON).write_text(
        json.dumps({"pid": int(gone.stdout), "socket": str(hook_home / "x")})
    )
    result = run_hook("stop", "claude", {"session_id": SID, "cwd": str(project)}, hook_env(hook_home))
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert (hook_home / paths.REPORTS_DIR).is_dir()


@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b'{"cwd": "/work/app"}', b'{"session_id": ""}'])
def test_malformed_input_exits_0_silently_and_logs_one_line(raw, hook_home, project):
    result = run_hook("stop", "codex", raw, hook_env(hook_home), cwd=project)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    lines = log_lines(hook_home)
    assert len(lines) == 1 and "stop (codex)" in lines[0] and "no block" in lines[0]
    assert not (hook_home / paths.REPORTS_DIR).exists()

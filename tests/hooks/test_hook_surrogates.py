"""A hook's stdin is JSON the host wrote; a `session_id` holding a lone surrogate (`"\\ud800"`,
valid JSON, not encodable as UTF-8) is bad input like any other: the SessionStart note is still
printed (without reporting that id), the Stop hook exits 0, and broker.log names the problem in
one line, never as an encoding error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hooks.conftest import build_db, hook_env, log_lines, note_of, run_hook

LONE = b'"hs-\\ud800-x"'  # JSON text of a string with a lone high surrogate


def raw_input(project: Path, event: str) -> bytes:
    return (
        b'{"session_id": '
        + LONE
        + b', "transcript_path": "/tmp/t.jsonl", "cwd": "'
        + str(project).encode()
        + b'", "hook_event_name": "'
        + event.encode()
        + b'", "source": "startup"}'
    )


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_session_start_gives_the_note_without_the_bad_session_id(agent, hook_home, project):
    build_db(hook_home, [("camera", "Hold to look", "all")])
    result = run_hook(
        "session-start", agent, raw_input(project, "SessionStart"), hook_env(hook_home), cwd=project
    )
    assert result.stderr == b""
    note = note_of(result)
    assert "camera: Hold to look" in note
    assert not (hook_home / "reports").exists()  # the id was not reported anywhere
    lines = log_lines(hook_home)
    assert len(lines) == 1, lines
    assert f"session-start ({agent})" in lines[0] and "session_id" in lines[0] and "surrogate" in lines[0], (
        lines
    )
    assert "UnicodeEncodeError" not in lines[0] and "codec" not in lines[0], lines


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_stop_exits_0_with_one_clear_log_line(agent, hook_home, project):
    build_db(hook_home, [])
    result = run_hook("stop", agent, raw_input(project, "Stop"), hook_env(hook_home), cwd=project)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert not (hook_home / "reports").exists()
    lines = log_lines(hook_home)
    assert len(lines) == 1, lines
    assert f"stop ({agent})" in lines[0] and "session_id" in lines[0] and "surrogate" in lines[0], lines
    assert "UnicodeEncodeError" not in lines[0] and "codec" not in lines[0], lines

"""SPEC §4.5, §8: the SessionStart note does not depend on leaving the identity report. With no
broker and a state folder that cannot be written (read-only, full), the decisions are still
readable, so the note is still printed."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.hooks.conftest import HOOK, build_db, hook_env, note_of

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare for a read-only mount",
)


def test_the_note_is_printed_when_the_identity_report_cannot_be_written(hook_home, project):
    import subprocess

    build_db(hook_home, [("db", "PostgreSQL everywhere", "all")])
    payload = {
        "session_id": "s-ro",
        "cwd": str(project),
        "source": "startup",
        "hook_event_name": "SessionStart",
    }
    command = ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(hook_home),
               *HOOK, "hook", "session-start", "--agent", "claude"]
    result = subprocess.run(command, input=json.dumps(payload).encode(), env=hook_env(hook_home),
                            capture_output=True, timeout=60)
    note = note_of(result)
    assert "db: PostgreSQL everywhere" in note, note
    assert not (hook_home / "reports").exists()  # it really could not leave the report

"""The hooks a host's plugin runs (opencode, hosts/opencode_plugin.py): `post-tool-use` for a host
that defers the acknowledgement prints the messages with their ids and acknowledges nothing;
`ack` acknowledges them afterwards; `status` keeps the busy/idle mark. Bad input: exit 0, one
log line, nothing acknowledged or marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from agent_bridge.common import marks, paths
from agent_bridge.ipc.client import open_bridge_client
from tests.hooks.conftest import build_db, hook_env, log_lines, run_hook
from tests.hooks.test_post_tool_use import acked, post_input, send


@pytest.mark.slow
async def test_opencode_hand_over_waits_for_the_plugins_ack(broker, env, home, project):
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "opencode", "project": str(project),
                                                         "hostSessionId": "ses_busy"}):
            ids = await send(home, "ses_busy", ["use port 8080"])
            result = await trio.to_thread.run_sync(lambda: run_hook(
                "post-tool-use", "opencode", post_input("ses_busy", project), hook_env(home), cwd=project))
            answer = json.loads(result.stdout)
            assert answer["ids"] == ids and isinstance(answer["peer"], str)
            assert "use port 8080" in answer["hookSpecificOutput"]["additionalContext"]
            assert acked(home, ids) == [None]  # printed to the plugin, not yet taken by opencode
            done = await trio.to_thread.run_sync(lambda: run_hook(
                "ack", "opencode", {"session_id": "ses_busy", "ids": ids, "peer": answer["peer"]},
                hook_env(home), cwd=project))
            assert (done.returncode, done.stdout) == (0, b"")
            assert None not in acked(home, ids)


@pytest.mark.parametrize("raw", [b"not json", b"[1]", b'{"session_id": "s", "ids": []}',
                                 b'{"session_id": "s", "ids": [3]}', b'{"ids": ["a"]}'])
def test_a_bad_ack_exits_0_and_logs_one_line(raw, hook_home, project):
    result = run_hook("ack", "opencode", raw, hook_env(hook_home), cwd=project)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    lines = log_lines(hook_home)
    assert len(lines) == 1 and "ack (opencode)" in lines[0], lines


def test_status_keeps_the_busy_idle_mark(hook_home: Path, project: Path) -> None:
    build_db(hook_home, [])
    for state in ("busy", "idle"):
        result = run_hook("status", "opencode", {"session_id": "ses_x", "cwd": str(project), "status": state},
                          hook_env(hook_home), cwd=project)
        assert (result.returncode, result.stdout) == (0, b"")
        assert marks.session_state(hook_home, "ses_x", connected=True, last_seen=None).state == state
    bad = run_hook("status", "opencode", {"session_id": "ses_x", "cwd": str(project), "status": "asleep"},
                   hook_env(hook_home), cwd=project)
    assert (bad.returncode, bad.stdout) == (0, b"")
    assert marks.session_state(hook_home, "ses_x", connected=True, last_seen=None).state == "idle"
    assert any("status (opencode)" in line for line in log_lines(hook_home))

"""What earlier versions wrote into the hosts' configuration keeps working after the package was
regrouped into one folder per process (issue 43): the command lines are written out here as the
layout before it produced them (agent_bridge/hooks/quick.py for the PostToolUse hook of a user
install; agent_bridge/relay_quick.py for a job's MCP server), not taken from today's code, and
run as the hosts run them."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import trio

import agent_bridge
from agent_bridge.common import paths
from agent_bridge.hosts.edits import hook_command, mcp_command
from agent_bridge.ipc.client import open_bridge_client
from tests.conftest import wait_for
from tests.hooks.conftest import hook_env
from tests.hooks.test_post_tool_use import acked, context_of, post_input
from tests.test_relay_quick import INITIALIZED, call, initialize, result_json

PACKAGE = Path(agent_bridge.__file__).parent
AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")


def old_post_tool_use_line(agent: str) -> str:
    """The PostToolUse hook of a user-scope install by the layout before (hosts/edits.py then)."""
    return shlex.join([sys.executable, "-I", "-S", str(PACKAGE / "hooks" / "quick.py"), "post-tool-use",
                       "--agent", agent])


def old_job_server(agent: str, project: Path) -> list[str]:
    """A job's MCP server command by the layout before (hosts/edits.py mcp_command then)."""
    job_id = str(uuid.uuid4())
    return [sys.executable, "-I", "-S", str(PACKAGE / "relay_quick.py"), "mcp", "--job", "--agent", agent,
            "--name", f"{agent}-job-{job_id[:8]}", "--project", str(project), "--host-session-id", job_id]


def test_install_still_writes_the_hook_lines_earlier_installs_wrote():
    """So hosts configured before and after the move run the same commands, and doctor and
    uninstall recognise both."""
    for agent in ("claude", "codex"):
        assert hook_command([AGENT_BRIDGE], "post-tool-use", agent, {}) == old_post_tool_use_line(agent)
        assert hook_command([AGENT_BRIDGE], "session-start", agent, {}) == shlex.join(
            [AGENT_BRIDGE, "hook", "session-start", "--agent", agent])


async def test_an_earlier_install_s_post_tool_use_line_hands_a_message_over(broker, home, tmp_path):
    project = tmp_path / "app"
    project.mkdir()
    env = hook_env(home)
    with trio.fail_after(120):
        ready = home / paths.PENDING_DIR / paths.PENDING_READY
        await wait_for(lambda: trio.to_thread.run_sync(ready.exists), what="the post box kept")
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-old"}), \
                open_bridge_client(record["socket"], {"agent": "codex", "project": "/w/s",
                                                      "hostSessionId": "hs-sender"}) as (tx, _):
            sent = await tx.request("send", to="hs-old", text="from before the move")

            def run() -> subprocess.CompletedProcess[bytes]:
                return subprocess.run(["sh", "-c", old_post_tool_use_line("claude")], cwd=project, env=env,
                                      input=json.dumps(post_input("hs-old", project)).encode(),
                                      capture_output=True, timeout=60)

            result = await trio.to_thread.run_sync(run)
            assert "from before the move" in context_of(result)
            assert acked(home, [sent["message"]["id"]])[0] is not None


def test_an_earlier_job_s_mcp_server_path_still_serves_the_job(broker, env, tmp_path):
    """The handshake answered by the script at the old path, the tool call by the relay through
    the broker, as the job's session."""
    host = subprocess.Popen(old_job_server("codex", tmp_path), env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = [initialize(1), INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                 call(3, "whoami")]
        out, err = host.communicate(b"".join(json.dumps(m).encode() + b"\n" for m in lines), timeout=60)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    assert host.returncode == 0, err.decode()
    answers = {a["id"]: a for a in map(json.loads, out.splitlines())}
    assert answers[1]["result"]["serverInfo"]["name"] == "agent-bridge"
    assert "tools" in answers[2]["result"]
    assert result_json(answers[3])["kind"] == "job"


def test_today_s_job_server_is_the_script_in_the_relay_s_folder(tmp_path):
    argv = mcp_command([AGENT_BRIDGE, "mcp", "--job", "--agent", "codex"])
    assert argv[:4] == [sys.executable, "-I", "-S", str((PACKAGE / "relay" / "quick.py").absolute())]


def test_a_command_line_the_script_does_not_read_goes_to_the_command_line_s_parser():
    """`--help` (or a typo) is argparse's to answer, with the same words `agent-bridge mcp` uses."""
    for script in (PACKAGE / "relay" / "quick.py", PACKAGE / "relay_quick.py"):
        done = subprocess.run([sys.executable, "-I", "-S", str(script), "mcp", "--help"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        expected = subprocess.run([AGENT_BRIDGE, "mcp", "--help"], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (0, expected.stdout)
        bad = subprocess.run([sys.executable, "-I", "-S", str(script), "mcp", "--name=x", "--bogus"],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr

"""SPEC §8: an `agent-bridge mcp` whose broker cannot start says why, in its tool errors, and
stops respawning it; one whose state folder is unusable says so at once, naming the folder."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import trio

from agent_bridge.relay import main as relay
from tests.conftest import REPO, mcp_session, run_cli, wait_for
from tests.test_refusals import newer_database

pytestmark = pytest.mark.slow


async def test_an_unstartable_broker_is_not_respawned_forever_and_tool_errors_say_why(env, home):
    newer_database(home)
    with trio.fail_after(120):
        async with mcp_session(env, "--project", "/w/refused") as s:
            first = await s.call_tool("whoami", {})
            assert first.is_error and "schema version 99" in first.content[0].text, first.content[0].text

            async def gave_up():
                result = await s.call_tool("whoami", {})
                assert result.is_error and "schema version 99" in result.content[0].text, result.content[
                    0
                ].text
                return "gave up" in result.content[0].text and result.content[0].text

            said = await wait_for(gave_up, timeout=90, interval=0.2, what="the server to give up")
            assert "agent-bridge up" in said
    log = (home / "broker.log").read_text()
    starts = log.count("ERROR agent_bridge.broker: bridge.db has schema version 99")
    assert 1 <= starts <= relay.START_ATTEMPTS, log
    assert "Traceback" not in log
    doctor = run_cli(env, "doctor")
    broker_line = next(line for line in doctor.stdout.splitlines() if " broker " in line)
    assert "the last start failed: bridge.db has schema version 99" in broker_line, doctor.stdout


def read_only(home: Path, *command: str) -> list[str]:
    """`command` in its own mount namespace where `home` is a read-only bind mount of itself:
    a real read-only folder (the suite runs as root, whom no file mode stops)."""
    return ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(home), *command]


can_mount = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare for a read-only mount",
)


async def initialize_fails_fast(env: dict[str, str], command: list[str], stderr_path: Path) -> str:
    """Start the server with the real client; `initialize` must fail within 2 s (a deadline,
    not a measurement); returns what the server wrote on stderr."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(REPO))
    with open(stderr_path, "w") as errlog:  # noqa: ASYNC230 - a test, before anything runs
        with pytest.raises(Exception) as failed:  # noqa: PT011 - the SDK's "Connection closed"
            with trio.fail_after(2):
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
    assert not isinstance(failed.value, trio.TooSlowError), "initialize took longer than 2 s"
    return await trio.Path(stderr_path).read_text()


@can_mount
async def test_an_unwritable_home_fails_initialize_fast_naming_the_folder(env, home, tmp_path):
    home.mkdir(mode=0o700)
    command = read_only(home, sys.executable, "-m", "agent_bridge", "mcp", "--project", "/w/ro")
    said = await initialize_fails_fast({**env, "AGENT_BRIDGE_HOME": str(home)}, command, tmp_path / "stderr")
    assert str(home) in said and "cannot write" in said, said
    assert "Traceback" not in said
    assert len(said.strip().splitlines()) == 1, said


async def test_a_home_that_cannot_be_created_is_one_clear_line(env, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    home = blocker / "home"
    said = await initialize_fails_fast({**env, "AGENT_BRIDGE_HOME": str(home)},
                                       [sys.executable, "-m", "agent_bridge", "mcp", "--project", "/w/x"],
                                       tmp_path / "stderr")
    assert str(home) in said and "Traceback" not in said, said
    assert len(said.strip().splitlines()) == 1, said


def start_attempts(home: Path) -> int:
    """`up` runs refused for the newer database so far (each logs its refusal once)."""
    try:
        return (
            (home / "broker.log")
            .read_text()
            .count("ERROR agent_bridge.broker: bridge.db has schema version 99")
        )
    except FileNotFoundError:
        return 0


async def test_a_permanent_refusal_is_tried_once_per_relay_until_the_file_changes(env, home):
    """Issue 23, point 5: three relays, a newer-schema bridge.db. `up` says the refusal is
    permanent; each relay tries once, says at once that it gave up, and tries again only after
    the file's identity changed (here: its mtime), once."""
    from tests.test_delivery import RawHost

    db = newer_database(home)
    done = run_cli(env, "up", "--detach")
    assert done.returncode == 1 and "(permanent: until bridge.db changes)" in done.stderr, done.stderr
    assert start_attempts(home) == 1
    hosts = []
    try:
        with trio.fail_after(120):
            for n in range(3):
                hosts.append(await RawHost.start(env, "--project", f"/w/permanent-{n}"))

            async def all_gave_up() -> bool:
                for host in hosts:
                    result = await host.response(await host.call_request("whoami"))
                    text = result["content"][0]["text"]
                    assert result["isError"] and "schema version 99" in text, text
                    if "gave up until that changes" not in text:
                        return False
                return True

            await wait_for(all_gave_up, timeout=60, interval=0.1, what="every relay to give up")
            # at most one try per relay (plus the `up` above), not START_ATTEMPTS each; relays
            # whose `up` ran while another's held the lock share that one's refusal
            first_round = start_attempts(home)
            assert 2 <= first_round <= 1 + len(hosts)
            stat = db.stat()
            os.utime(db, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a new identity

            async def tried_again() -> bool:
                return start_attempts(home) > first_round

            await wait_for(tried_again, timeout=60, interval=0.1, what="one more try once the file changed")
            await wait_for(all_gave_up, timeout=60, interval=0.1, what="every relay to give up again")
            second_round = start_attempts(home) - first_round
            assert 1 <= second_round <= len(hosts)
            for host in hosts:
                assert await host.end() == 0
    finally:
        for host in hosts:
            with trio.CancelScope(shield=True):
                await host.kill()
    assert start_attempts(home) == first_round + second_round  # none after the last refusal
    assert "Traceback" not in (home / "broker.log").read_text()

"""`agent-bridge demo` runs to completion and shows who received the decision."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from agent_bridge.cli import demo
from agent_bridge.common import paths
from agent_bridge.ipc.client import BrokerGone
from tests.conftest import CLI, run_cli

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("env_home", [False, True])
def test_demo_in_a_temporary_home_cleans_up(env, home, tmp_path, env_home):
    """Without --home the demo writes to no real state folder: neither the default one nor the
    one AGENT_BRIDGE_HOME names."""
    e = {k: v for k, v in env.items() if k != "AGENT_BRIDGE_HOME"}
    e["HOME"] = str(tmp_path)
    e.pop("XDG_STATE_HOME", None)
    if env_home:
        e["AGENT_BRIDGE_HOME"] = str(paths.ensure_home(home))
    out = run_cli(e, "demo", "--no-wait", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr
    if env_home:
        assert list(home.iterdir()) == []
    text = out.stdout
    assert "deliveredTo: claude-demo-project, codex-demo-project, opencode-demo-project" in text
    assert re.search(r"claude-demo-project\s+received the decision notice", text)
    assert re.search(r"codex-demo-project\s+received the decision notice", text)
    assert re.search(r"opencode-demo-project\s+received the decision notice", text)
    assert re.search(r"codex-demo-project-2\s+received nothing", text)  # the job runner
    assert "send(to='opencode') -> opencode-demo-project received it" in text  # an agent kind as address
    assert "hop  3  active" in text and "hop  4  passive" in text  # the demo broker's hop limit is 4
    assert "decisions() -> ['database']" in text
    assert "Stopped the demo broker." in text
    # --no-wait: nothing to look at afterwards, and the text says so instead of pointing there
    assert "Look at:" not in text and "http://" not in text
    assert "the demo ends here: the four sessions disconnect, the demo's broker stops" in text
    home = Path(re.search(r"Starting a broker in (\S+) …", text).group(1))
    assert not home.exists()  # the temporary home is removed
    assert not (tmp_path / ".local" / "state" / "agent-bridge").exists()  # the user's home untouched


def test_demo_with_home_uses_the_running_broker_and_leaves_it(broker, env, home):
    out = run_cli(env, "demo", "--no-wait", "--home", str(home), timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"warning: --home {home}: the demo writes to this state folder" in out.stderr
    assert "agent-bridge retract database" in out.stderr
    assert "Starting a broker" not in out.stdout
    assert "the demo ends here: the four sessions disconnect." in out.stdout  # this broker keeps running
    # the decision concerns the demo's own folder, never every real session
    (decision,) = json.loads(run_cli(env, "decisions", "--json").stdout)
    assert decision["scope"] == {"project": str(home / "demo-project")}
    assert "hop 10  passive" in out.stdout  # the running broker's default hop limit
    assert paths.read_broker_json(home)["pid"] == broker.pid  # still running
    assert broker.status()["pid"] == broker.pid


def _processes_of(home: Path) -> list[int]:
    """Live processes (zombies have no environment) working for the state folder `home`: the
    demo's broker, an `up` or `down` it ran."""
    mark = b"AGENT_BRIDGE_HOME=" + bytes(home)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours
            continue
        if mark in environ:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the processes through /proc")
@pytest.mark.parametrize("when", ["starting", "running", "waiting"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
async def test_demo_ended_by_a_signal_leaves_no_broker_and_no_folder(env, tmp_path, sig, when):
    """A closed terminal (SIGHUP), `timeout` or a process manager (SIGTERM) end the demo as Ctrl-C
    (SIGINT) does: its broker stopped, its temporary folder removed; whether the signal comes
    while its broker is still starting, while the simulated sessions run, or while it waits for
    Ctrl-C at the end. Sent, as a terminal and `timeout` send it, to the demo's process group."""
    e = {k: v for k, v in env.items() if k != "AGENT_BRIDGE_HOME"}
    e["HOME"] = str(tmp_path)
    e.pop("XDG_STATE_HOME", None)
    with trio.fail_after(120):
        proc = await trio.lowlevel.open_process(
            [*CLI, "demo"], env=e, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdout is not None
        out = b""

        async def until(text: bytes) -> None:
            nonlocal out
            while text not in out:
                chunk = await proc.stdout.receive_some()
                assert chunk, f"the demo ended before {text!r}: {out.decode()}"
                out += chunk

        try:
            await until(" …\n".encode())
            home = Path(re.search(r"Starting a broker in (\S+) …", out.decode()).group(1))
            if when == "running":
                await until(b"1. Four simulated sessions connected")
            elif when == "waiting":
                await until(b"Press Ctrl-C to end the demo.")
                assert _processes_of(home)  # its broker runs
            os.killpg(proc.pid, sig)
            while chunk := await proc.stdout.receive_some():
                out += chunk
            code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    said = out.decode()
    assert code == 0, said  # ended by its own clean-up, not by the signal (a negative code)
    if when != "starting":  # a signal to the group at the instant `up` starts may end it first
        assert "Stopped the demo broker." in said
    assert "Traceback" not in said
    assert not await trio.Path(home).exists(), said
    assert _processes_of(home) == [], said


async def _ctrl_c_in_a_reader_while_a_request_waits(also: BaseException | None = None) -> None:
    """The shape of a Ctrl-C that lands in a client's reader task (Trio raises it in whichever
    task runs when the signal comes): the reader's clean-up wakes the waiting request, which
    fails with BrokerGone beside the KeyboardInterrupt."""
    async with trio.open_nursery() as nursery:
        woken = trio.Event()

        async def reader() -> None:
            try:
                await trio.lowlevel.checkpoint()
                raise KeyboardInterrupt
            finally:
                woken.set()  # as BridgeClient._read's finally sets its pending requests' events

        nursery.start_soon(reader)
        await woken.wait()
        if also is not None:
            raise also
        raise BrokerGone("the broker connection closed before it answered", maybe_processed=True)


def test_ctrl_c_in_a_client_task_ends_the_demo_as_interrupted_without_a_traceback():
    """CI caught the demo, ended by SIGINT while its sessions ran, printing "Interrupted." and then
    the BrokerGone of a request whose connection the interruption had closed (exit 1)."""
    with pytest.raises(BaseExceptionGroup) as raised:  # the race the demo must absorb, as Trio raises it
        trio.run(_ctrl_c_in_a_reader_while_a_request_waits)
    assert raised.group_contains(KeyboardInterrupt) and raised.group_contains(BrokerGone)

    assert demo.run_sessions(_ctrl_c_in_a_reader_while_a_request_waits) is False


def test_an_error_beside_ctrl_c_in_the_demo_is_still_shown():
    """Only Ctrl-C and the closed connections it causes are absorbed; a real error propagates."""
    with pytest.raises(BaseExceptionGroup) as raised:
        demo.run_sessions(_ctrl_c_in_a_reader_while_a_request_waits, ValueError("a real defect"))
    assert raised.group_contains(ValueError)

    async def gone() -> None:
        raise BrokerGone("the broker connection closed")

    with pytest.raises(BrokerGone):  # a broker gone without Ctrl-C is not an interruption
        demo.run_sessions(gone)

    async def done() -> None:
        await trio.lowlevel.checkpoint()

    assert demo.run_sessions(done) is True

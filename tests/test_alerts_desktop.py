"""The owner's desktop alerts end to end (SPEC §4.6 "The owner is told"): a real broker process on
a real `dbus-daemon --session` started here, with a small `org.freedesktop.Notifications` service
written here (dbus-fast), receives a `Notify` call for a new question (`ask_owner`), a message to
the owner (`send` to "owner") and a job that ended (a real `codex` job, offline). With no
notification service: one log line, nothing else; with `alerts = false`: nothing.

The service's module has no `from __future__ import annotations`: dbus-fast reads the D-Bus
signatures from the annotations as written."""

import asyncio
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface, method

from agent_bridge.common import paths
from tests.conftest import BrokerProcess, call, mcp_session, run_cli, wait_until
from tests.hostbin import host_program

pytestmark = pytest.mark.slow

DBUS_DAEMON = shutil.which("dbus-daemon") or "/usr/bin/dbus-daemon"
BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


class Notifications(ServiceInterface):
    """What desktop-notifier calls of a notification server: Notify, GetCapabilities,
    GetServerInformation (and CloseNotification, which it may). Records each Notify."""

    def __init__(self) -> None:
        super().__init__("org.freedesktop.Notifications")
        self.calls: list[dict[str, Any]] = []
        self.changed = threading.Condition()

    @method()
    def Notify(self, app_name: "s", replaces_id: "u", app_icon: "s", summary: "s", body: "s",  # noqa: F821, N802
               actions: "as", hints: "a{sv}", expire_timeout: "i") -> "u":  # noqa: F821, F722
        with self.changed:
            self.calls.append({"app": app_name, "summary": summary, "body": body})
            self.changed.notify_all()
            return len(self.calls)

    @method()
    def GetCapabilities(self) -> "as":  # noqa: F821, N802, F722
        return ["body"]

    @method()
    def GetServerInformation(self) -> "ssss":  # noqa: F821, N802
        return ["agent-bridge-test", "agent-bridge", "1", "1.2"]

    @method()
    def CloseNotification(self, id: "u") -> None:  # noqa: F821, N802, A002
        pass

    def wait_for(self, matches, what: str, timeout: float = 60.0) -> dict[str, Any]:
        """The first recorded call `matches` accepts, waiting for it up to `timeout` seconds."""
        with self.changed:
            found = self.changed.wait_for(lambda: next((c for c in self.calls if matches(c)), None), timeout)
        assert found, f"no Notify call for {what} within {timeout} s; got {self.calls}"
        return found


class Bus:
    """A private session bus (a real dbus-daemon) and, once `serve` ran, the fake service on it."""

    def __init__(self, folder: Path) -> None:
        config = folder / "session.conf"
        config.write_text(BUS_CONFIG.format(socket=folder / "bus"), encoding="utf-8")
        argv = [DBUS_DAEMON, f"--config-file={config}", "--nofork", "--print-address=1"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()
        assert self.address.startswith("unix:"), self.proc.stderr.read() if self.proc.stderr else ""
        self.service: Notifications | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def serve(self) -> Notifications:
        ready = threading.Event()
        service = Notifications()
        self.service = service

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            bus = await MessageBus(bus_address=self.address).connect()
            bus.export("/org/freedesktop/Notifications", service)
            await bus.request_name("org.freedesktop.Notifications")
            self._stop = asyncio.Event()
            ready.set()
            await self._stop.wait()
            bus.disconnect()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        assert ready.wait(30), "the fake notification service did not start"
        return service

    def close(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture
def bus() -> Iterator[Bus]:
    if not os.path.exists(DBUS_DAEMON):
        if os.environ.get("CI"):  # as the interactive host tests and tmux: CI must run this one
            pytest.fail("CI runs the desktop alert tests, but dbus-daemon is not installed")
        pytest.skip("dbus-daemon is not installed")
    with tempfile.TemporaryDirectory(prefix="ab-bus-") as folder:
        b = Bus(Path(folder))
        try:
            yield b
        finally:
            b.close()


def log_lines(home: Path, word: str) -> list[str]:
    text = (home / paths.LOG_NAME).read_text(encoding="utf-8") if (home / paths.LOG_NAME).exists() else ""
    return [line for line in text.splitlines() if word in line]


def write_config(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text, encoding="utf-8")


def codex_offline(folder: Path) -> dict[str, str]:
    """A CODEX_HOME whose model is a closed port on 127.0.0.1: a job there ends at once, offline."""
    codex_home = folder / "codex-home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "gpt-test"\nmodel_provider = "closed"\ncheck_for_update_on_startup = false\n\n'
        "[analytics]\nenabled = false\n\n[features]\nplugins = false\n\n"
        '[model_providers.closed]\nname = "closed"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "FAKE_MODEL_KEY"\nrequires_openai_auth = false\nsupports_websockets = false\n'
        "request_max_retries = 0\nstream_max_retries = 0\n", encoding="utf-8")
    return {"CODEX_HOME": str(codex_home), "FAKE_MODEL_KEY": "test-key"}


async def test_a_question_a_message_to_the_owner_and_a_job_end_each_reach_the_notification_service(
    env: dict[str, str], home: Path, tmp_path: Path, bus: Bus
) -> None:
    codex = host_program("codex")
    service = bus.serve()
    project = tmp_path / "proj"
    project.mkdir()
    env = {**env, "DBUS_SESSION_BUS_ADDRESS": bus.address,
           "PATH": f"{codex.parent}{os.pathsep}{env['PATH']}", **codex_offline(tmp_path)}
    broker = BrokerProcess(env, home).start()
    try:
        with trio.fail_after(180):
            async with mcp_session(env, "--agent", "claude", "--project", str(project)) as s:
                long_question = "Which database should the app use? " + "x" * 400
                asked = await call(s, "ask_owner", question=long_question)
                call_ = await trio.to_thread.run_sync(
                    service.wait_for, lambda c: c["summary"].startswith("agent-bridge: question from"),
                    "the question")
                assert call_["app"] == "agent-bridge"
                assert call_["body"].startswith("Which database should the app use? xxx")
                assert len(call_["body"]) == 200  # never more of the question than 200 characters
                assert asked["question"]["state"] == "open"

                sent = await call(s, "send", to="owner", text="The migration is done; please look.")
                assert sent["message"]["to"]["id"] == "cli"
                call_ = await trio.to_thread.run_sync(
                    service.wait_for, lambda c: c["summary"].startswith("agent-bridge: message from"),
                    "the message to the owner")
                assert call_["body"] == "The migration is done; please look."

                job = (await call(s, "delegate", agent="codex", task="Review the diff and report."))["job"]
                # it ended already (no model to reach), or it is cancelled now
                await trio.to_thread.run_sync(lambda: run_cli(env, "jobs", "cancel", job["id"]))
                call_ = await trio.to_thread.run_sync(
                    service.wait_for, lambda c: c["summary"].startswith(f"agent-bridge: job {job['name']} "),
                    "the job's end")
                assert call_["summary"].split()[-1] in {"finished", "failed", "cancelled", "interrupted"}
                assert call_["body"] == "Review the diff and report."
        # each alerted once: one question, one message, one job end
        assert len(service.calls) == 3, service.calls
        assert log_lines(home, "alerts:") == []
    finally:
        broker.stop()


async def test_with_no_notification_service_the_broker_says_so_once_and_goes_on(
    env: dict[str, str], home: Path, tmp_path: Path, bus: Bus
) -> None:
    """A session bus with no `org.freedesktop.Notifications` on it: one log line, no traceback,
    the broker answers on; later alerts add nothing to the log."""
    env = {**env, "DBUS_SESSION_BUS_ADDRESS": bus.address}
    broker = BrokerProcess(env, home).start()
    try:
        with trio.fail_after(120):
            async with mcp_session(env, "--agent", "claude", "--project", str(tmp_path)) as s:
                await call(s, "send", to="owner", text="first")
                await trio.to_thread.run_sync(
                    lambda: wait_until(lambda: log_lines(home, "alerts:"), what="the alerts line"))
                for n in range(3):
                    await call(s, "send", to="owner", text=f"more {n}")
                await call(s, "ask_owner", question="Which queue?")
                assert (await call(s, "whoami"))["name"]
        broker.stop()
        [line] = log_lines(home, "alerts:")
        assert "no desktop notification service answered" in line
        assert "org.freedesktop.Notifications" in line  # the reason, in the library's words
        text = (home / paths.LOG_NAME).read_text(encoding="utf-8")
        assert "Traceback" not in text and "Notification failed" not in text
    finally:
        broker.stop()


async def test_alerts_false_in_config_toml_turns_them_off(
    env: dict[str, str], home: Path, tmp_path: Path, bus: Bus
) -> None:
    service = bus.serve()
    write_config(home, "alerts = false\n")
    env = {**env, "DBUS_SESSION_BUS_ADDRESS": bus.address}
    broker = BrokerProcess(env, home).start()
    try:
        assert log_lines(home, "alerts: off (alerts = false in config.toml)")
        with trio.fail_after(120):
            async with mcp_session(env, "--agent", "claude", "--project", str(tmp_path)) as s:
                await call(s, "send", to="owner", text="nobody is told")
                await call(s, "ask_owner", question="Which queue?")
    finally:
        broker.stop()
    assert service.calls == []


def test_alerts_in_config_toml_must_be_true_or_false(env: dict[str, str], home: Path) -> None:
    write_config(home, 'alerts = "yes"\n')
    done = run_cli(env, "up")
    assert done.returncode != 0
    assert "alerts: expected true or false, got 'yes'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_owner_cannot_send_to_the_owner(env: dict[str, str], broker: BrokerProcess) -> None:
    for address in ("owner", "CLI"):
        done = run_cli(env, "send", address, "hello me")
        assert done.returncode != 0
        [line] = done.stderr.strip().splitlines()
        assert f"to: no session is addressed by {address!r}" in line  # the owner is the sender here

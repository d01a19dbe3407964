"""Two real brokers on a hub of three nats-server nodes (hub-config --cluster): one node killed
mid-stream, the brokers reconnect to the others and every message arrives once (SPEC §10,
issue 44 point 4)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from agent_bridge.federation import hub
from tests.conftest import BrokerProcess
from tests.federation.conftest import TEAM, Hub, free_port, make_machines
from tests.federation.test_broker_faults import COUNT, all_arrived, bob_listed_at_a
from tests.federation.test_brokers import broker_env, session

pytestmark = pytest.mark.slow
SECRET = "0123456789abcdef0123456789abcdef"
DEADLINE = 180


async def test_a_hub_of_three_losing_a_node_mid_stream(folder: Path) -> None:
    machines = make_machines(folder, ("a", "b"))
    route_ports = [free_port() for _ in range(3)]
    routes = tuple(f"127.0.0.1:{p}" for p in route_ports)
    nodes = [Hub(folder / f"n{i}", machines, TEAM,
                 cluster=hub.make_cluster("abhub", f"n{i}", route_ports[i], routes, SECRET))
             for i in range(3)]
    urls = ", ".join(n.url for n in nodes)
    brokers: list[BrokerProcess] = []
    try:
        with trio.fail_after(DEADLINE):
            for node in nodes:
                await node.start()
            for m in machines:
                table = f'[federation]\nurl = "{urls}"\nmachine = "{m.name}"\nteam = "{TEAM}"\n'
                (m.home / "config.toml").write_text(table, encoding="utf-8")
                broker = BrokerProcess(broker_env(m.home), m.home)
                brokers.append(broker)
                await trio.to_thread.run_sync(broker.start)
            a, b = machines
            async with session(a.home, "alice", "/w/a") as (alice, _), session(b.home, "bob", "/w/b"):
                await bob_listed_at_a(alice)
                for i in range(COUNT):
                    if i == COUNT // 2:
                        await nodes[0].stop(signal.SIGKILL)
                    await alice.request("send", to="bob@b", text=f"message {i}")
                await all_arrived(b.home, "a", COUNT)
    finally:
        for broker in brokers:
            broker.kill()
        for node in nodes:
            await node.kill()

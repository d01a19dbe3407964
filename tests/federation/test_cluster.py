"""A hub of three nats-server nodes (hub-config --cluster) keeps serving when the node that leads the
team's stream is killed: machines ask for 3 replicas (one on a single server), publishes that time
out are retried with the same id, and the receiver gets each message once."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest
import trio

from agent_bridge.federation import hub, settings, subjects
from agent_bridge.federation.errors import HubError, Unknown
from agent_bridge.federation.transport import CLUSTER_REPLICAS, Transport, open_transport

from .conftest import TEAM, Hub, free_port, make_machines

pytestmark = pytest.mark.slow
SECRET = "0123456789abcdef0123456789abcdef"


def cluster_settings(home: Path, machine: str, urls: list[str]) -> settings.FederationSettings:
    (home / "config.toml").write_text(
        f'[federation]\nurl = "{", ".join(urls)}"\nmachine = "{machine}"\nteam = "{TEAM}"\n', encoding="utf-8"
    )
    loaded = settings.load(home)
    assert loaded is not None and len(loaded.servers) == 3
    return loaded


async def until_done(fn, *args):  # type: ignore[no-untyped-def]
    """Retry `fn(*args)` while the cluster settles (a leader being elected): Unknown and the hub's
    passing refusals; the caller's fail_after bounds it."""
    while True:
        try:
            return await fn(*args)
        except (Unknown, HubError):
            await trio.sleep(0.2)  # polled under the caller's deadline


async def publish_all(a: Transport, ids: list[str]) -> None:
    for msg_id in ids:
        await until_done(a.publish, subjects.msg(TEAM, "a", "b"), msg_id.encode(), msg_id, 1.0)


async def test_a_three_node_hub_survives_losing_the_stream_leader(folder: Path) -> None:
    machines = make_machines(folder, ("a", "b"))
    route_ports = [free_port() for _ in range(3)]
    routes = tuple(f"127.0.0.1:{p}" for p in route_ports)
    nodes = [
        Hub(
            folder / f"n{i}",
            machines,
            TEAM,
            cluster=hub.make_cluster("abhub", f"n{i}", route_ports[i], routes, SECRET),
        )
        for i in range(3)
    ]
    urls = [n.url for n in nodes]
    try:
        with trio.fail_after(120):
            for node in nodes:
                await node.start()
            async with (
                open_transport(cluster_settings(machines[0].home, "a", urls)) as a,
                open_transport(cluster_settings(machines[1].home, "b", urls)) as b,
            ):
                await until_done(a.ensure_streams)
                await until_done(b.ensure_streams)  # the same R3 config: a no-op
                states = await until_done(a.streams)
                assert [s.replicas for s in states] == [CLUSTER_REPLICAS, CLUSTER_REPLICAS]
                ids = [str(uuid.uuid4()) for _ in range(20)]
                await publish_all(a, ids[:10])

                leader = states[0].leader
                assert leader in {"n0", "n1", "n2"}
                await nodes[int(leader[1:])].stop(signal.SIGKILL)

                await publish_all(a, ids[10:])
                got: list[str] = []
                while len(got) < len(ids):
                    for incoming in await until_done(b.fetch, "msg", 50, 1.0):
                        got.append(incoming.msg_id or "")
                        await until_done(b.ack, incoming)
                assert sorted(got) == sorted(ids)
                assert await b.fetch("msg", timeout=1.0) == []
                after = await until_done(a.streams)
                assert after[0].leader != leader and after[0].messages == len(ids)
    finally:
        for node in nodes:
            await node.kill()

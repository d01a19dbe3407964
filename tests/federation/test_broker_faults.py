"""Faults between two real federated brokers and a real nats-server (SPEC §10, issue 44 point 4):
the hub killed and restarted while sends go on, and a kill -9 of the receiving or the sending
broker mid-stream. Each time every message a `send` answered reaches the other machine's
bridge.db exactly once."""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from agent_bridge.store import reader
from tests.conftest import BrokerProcess, wait_for
from tests.federation.conftest import Hub
from tests.federation.test_brokers import broker_env, federated_broker, peers_named, session

DEADLINE = 120
COUNT = 30


def arrived_from(home: Path, machine: str) -> tuple[int, int]:
    """(messages from `machine` in this home's bridge.db, distinct ids among them)."""
    with reader.reading(home / "bridge.db") as conn:
        assert conn is not None
        row = conn.execute("SELECT count(*), count(DISTINCT id) FROM messages WHERE machine = ?",
                           (machine,)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def all_arrived(home: Path, machine: str, count: int) -> None:
    async def there() -> bool:
        total, distinct = await trio.to_thread.run_sync(arrived_from, home, machine)
        assert total == distinct, f"{total - distinct} message(s) stored twice"
        return total == count

    await wait_for(there, timeout=DEADLINE, what=f"{count} messages from {machine}")


async def bob_listed_at_a(alice: object) -> None:
    async def listed() -> bool:
        found = await peers_named(alice, "bob@b")
        return found is not None and found["connected"]

    await wait_for(listed, timeout=DEADLINE, what="bob@b in alice's peers")


async def test_the_hub_killed_and_restarted_while_sends_go_on(team_hub: Hub) -> None:
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    with trio.fail_after(DEADLINE), federated_broker(a, team_hub), federated_broker(b, team_hub):
        async with session(a.home, "alice", "/w/a") as (alice, _), session(b.home, "bob", "/w/b"):
            await bob_listed_at_a(alice)
            for i in range(COUNT):
                if i == COUNT // 3:
                    await team_hub.stop(signal.SIGKILL)  # the sends go on: each answered from the outbox
                if i == 2 * COUNT // 3:
                    await team_hub.start()
                await alice.request("send", to="bob@b", text=f"message {i}")
            await all_arrived(b.home, "a", COUNT)


async def test_the_receiving_broker_killed_mid_stream(team_hub: Hub) -> None:
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    with trio.fail_after(DEADLINE), federated_broker(a, team_hub):
        b.settings(team_hub)
        receiver = BrokerProcess(broker_env(b.home), b.home)
        try:
            await trio.to_thread.run_sync(receiver.start)
            async with session(a.home, "alice", "/w/a") as (alice, _):
                async with session(b.home, "bob", "/w/b"):
                    await bob_listed_at_a(alice)
                for i in range(COUNT):
                    if i == COUNT // 2:
                        await trio.to_thread.run_sync(receiver.kill)  # kill -9 mid-stream
                    await alice.request("send", to="bob@b", text=f"message {i}")
                await trio.to_thread.run_sync(receiver.start)
                await all_arrived(b.home, "a", COUNT)
        finally:
            receiver.kill()


async def test_the_sending_broker_killed_with_its_outbox_full(team_hub: Hub) -> None:
    """The hub away, so nothing the sends queued can have gone out; then kill -9 of the sender:
    its outbox, read from bridge.db by the next broker, goes out once the hub is back."""
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    with trio.fail_after(DEADLINE), federated_broker(b, team_hub):
        a.settings(team_hub)
        sender = BrokerProcess(broker_env(a.home), a.home)
        try:
            await trio.to_thread.run_sync(sender.start)
            async with session(b.home, "bob", "/w/b"):
                async with session(a.home, "alice", "/w/a") as (alice, _):
                    await bob_listed_at_a(alice)
                    await team_hub.stop(signal.SIGKILL)
                    for i in range(COUNT):
                        await alice.request("send", to="bob@b", text=f"message {i}")
                await trio.to_thread.run_sync(sender.kill)  # kill -9, every message still in its outbox
                assert await trio.to_thread.run_sync(arrived_from, b.home, "a") == (0, 0)
                await team_hub.start()
                await trio.to_thread.run_sync(sender.start)
                await all_arrived(b.home, "a", COUNT)
        finally:
            sender.kill()

"""A hub that loses its whole JetStream store, between real brokers and a real nats-server (SPEC
§10, issue 44): the hub killed and started again on an empty store folder, the stand-in for a
power cut with JetStream's default fsync interval (nats-server issue 7564) or a new disk.

Machine a records a decision while no other machine was ever heard: its PubAck does not end it,
it stays owed (`federation status`: owed, until a first machine is heard). The hub loses it; a's
broker keeps its connection (nats-py reconnects: the same process, no fresh connect), hears from
the hub that the team's stream and its consumers are gone, and makes the streams again. Machine
b joins later (first heard by its presence): a owes it the decision and publishes it again with
the same id, b stores it, and b's receipt ends it on a. Messages then go both ways through the
consumers a made again on the same connection."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import trio

from tests.conftest import run_cli, wait_for
from tests.federation.conftest import Hub
from tests.federation.test_brokers import (
    DEADLINE,
    broker_env,
    federated_broker,
    next_message,
    peers_named,
    session,
)


async def status_of(home: Path, *text: str) -> Any:
    shown = await trio.to_thread.run_sync(lambda: run_cli(broker_env(home), "federation", "status", *text))
    assert shown.returncode == 0, shown.stderr
    return shown.stdout if text == () else json.loads(shown.stdout)


async def past_the_decision(pushes: Any) -> dict[str, Any]:
    """The next message pushed to a session after the decision's notice, if that comes first (a
    session's catch-up gives it the current decision, here or on b)."""
    message = await next_message(pushes)
    if message["kind"] == "decision":
        assert "db: PostgreSQL" in message["text"], message
        message = await next_message(pushes)
    return message


async def test_a_decision_recorded_alone_reaches_a_machine_that_joins_after_the_hub_lost_it(
    team_hub: Hub,
) -> None:
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    with trio.fail_after(DEADLINE * 2), federated_broker(a, team_hub) as a_broker:
        decided = await trio.to_thread.run_sync(
            lambda: run_cli(broker_env(a.home), "decide", "db", "PostgreSQL", "--scope", "all"))
        assert decided.returncode == 0, decided.stderr

        async def owed_to_a_first_machine() -> bool:  # relayed (PubAck), and still owed
            outbox = (await status_of(a.home, "--json"))["outbox"]
            return outbox["decisions"] == 1 and outbox["awaitingFirstMachine"] == 1

        await wait_for(owed_to_a_first_machine, timeout=DEADLINE, what="a's decision relayed and owed")
        shown = await status_of(a.home)
        assert "decisions and retractions owed to the team: 1, 1 of them until a first machine" in shown

        await team_hub.stop(signal.SIGKILL)  # the power cut: the hub's store is gone with it
        shutil.rmtree(team_hub.store)
        await team_hub.start()

        with federated_broker(b, team_hub):
            async def stored_on_b() -> bool:
                listed = await trio.to_thread.run_sync(
                    lambda: run_cli(broker_env(b.home), "decisions", "db", "--json"))
                return "PostgreSQL" in listed.stdout

            await wait_for(stored_on_b, timeout=DEADLINE, what="the decision on machine b, joined later")

            async def ended_on_a() -> bool:  # b's receipt, through a's receipt consumer made again
                return (await status_of(a.home, "--json"))["outbox"]["decisions"] == 0

            await wait_for(ended_on_a, timeout=DEADLINE, what="b's receipt ending a's decision")
            hub_state = a_broker.status()["federation"]  # the same broker, its connection kept
            assert a_broker.proc is not None and a_broker.proc.poll() is None
            assert hub_state["connected"] and hub_state["reconnects"] >= 1, hub_state

            async with session(a.home, "alice", "/w/a") as (alice, alice_pushes), \
                    session(b.home, "bob", "/w/b") as (bob, bob_pushes):
                async def bob_listed() -> bool:
                    found = await peers_named(alice, "bob@b")
                    return found is not None and found["connected"]

                await wait_for(bob_listed, timeout=DEADLINE, what="bob@b in alice's peers")
                sent = await alice.request("send", to="bob@b", text="after the hub lost its store")
                arrived = await past_the_decision(bob_pushes)
                assert arrived["id"] == sent["message"]["id"], arrived
                reply = await bob.request("send", to="alice@a", text="got it", reply_to=arrived["id"])
                back = await past_the_decision(alice_pushes)  # a's message consumer, made again
                assert back["id"] == reply["message"]["id"] and back["text"] == "got it"

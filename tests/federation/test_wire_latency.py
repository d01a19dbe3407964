"""What the remote message path's latency work relies on (issue 44 item 7), against a real
nats-server where the hub is involved: a pull's acks ride with the next pull, a pull asks for one
message while the hub said none more waited, and a publish starts before its result is awaited."""

from __future__ import annotations

import asyncio
import uuid

import trio

from agent_bridge.federation import subjects
from agent_bridge.federation.loop import open_asyncio_bridge
from agent_bridge.federation.transport import open_transport

from .conftest import TEAM, Hub, a_to_b

GUARD = 30


async def test_acks_handed_to_the_next_pull_are_acknowledged(team_hub: Hub) -> None:
    """Acks given to `fetch` reach the hub (nothing comes back after ack_wait); those not given
    come back, as test_wire's not-acked test shows for a fetch without any."""
    with trio.fail_after(GUARD):
        async with a_to_b(team_hub) as (a, b):
            for body in (b"one", b"two"):
                await a.publish(subjects.msg(TEAM, "a", "b"), body, str(uuid.uuid4()))
            got = await b.fetch("msg", batch=10, timeout=2)
            assert [i.body for i in got] == [b"one", b"two"]
            # "one" acked with this pull; "two" not: only "two" is delivered again after ack_wait
            again = await b.fetch("msg", batch=10, timeout=5, acks=got[:1])
            assert [(i.body, i.num_delivered) for i in again] == [(b"two", 2)]
            assert await b.fetch("msg", batch=10, timeout=2.5, acks=again) == []


async def test_a_pull_asks_for_one_while_none_more_waited_then_for_the_batch(team_hub: Hub) -> None:
    m = team_hub.machines
    subject = subjects.msg(TEAM, "a", "b")

    async def publish(*bodies: bytes) -> None:
        for body in bodies:
            await a.publish(subject, body, str(uuid.uuid4()))

    with trio.fail_after(GUARD):
        async with (
            open_transport(m["a"].settings(team_hub)) as a,
            open_transport(m["b"].settings(team_hub)) as b,
        ):
            await a.ensure_streams()
            await publish(b"m1")
            first = await b.fetch("msg", batch=10, timeout=2)
            assert [i.body for i in first] == [b"m1"]  # and the hub said none more waited
            await publish(b"m2", b"m3", b"m4")
            one = await b.fetch("msg", batch=10, timeout=2, acks=first)
            assert [i.body for i in one] == [b"m2"]  # a pull for one; its delivery says two more wait
            rest = await b.fetch("msg", batch=10, timeout=2, acks=one)
            assert [i.body for i in rest] == [b"m3", b"m4"]


async def test_a_submitted_call_runs_before_its_result_is_awaited() -> None:
    with trio.fail_after(10):
        async with open_asyncio_bridge() as bridge:
            ran = trio.Event()

            async def note() -> str:
                await asyncio.sleep(0)
                bridge.to_trio(ran.set)
                return "done"

            submitted = bridge.submit(note)
            await ran.wait()  # nobody awaits its result yet
            assert await submitted.result() == "done"

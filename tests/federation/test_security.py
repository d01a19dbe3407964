"""Issue 44 point 5: the configuration `hub-config` prints refuses a client without credentials, with an
unknown key, and a machine's key used for another machine's subjects, consumers or inbox. Each
attempt is made with raw nats-py (not the transport, which would not even try), on the same kind of
asyncio loop thread the broker uses."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
import trio
from nats.js.api import AckPolicy, ConsumerConfig

from agent_bridge.federation import identity, subjects
from agent_bridge.federation.loop import open_asyncio_bridge
from agent_bridge.federation.transport import open_transport

from .conftest import TEAM, Hub

GUARD = 30
STREAM = subjects.stream(TEAM)


async def on_asyncio(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    async with open_asyncio_bridge() as bridge:
        return await bridge.call(fn, *args)


async def connect_as(hub_: Hub, seed: str | None, inbox_machine: str, errors: list[str]) -> Any:
    async def error_cb(exc: Exception) -> None:
        errors.append(str(exc))

    options: dict[str, Any] = dict(
        servers=[hub_.url],
        allow_reconnect=False,
        max_reconnect_attempts=0,
        connect_timeout=2,
        error_cb=error_cb,
        inbox_prefix=subjects.inbox_prefix(inbox_machine),
    )
    if seed is not None:
        options["nkeys_seed_str"] = seed
    return await nats.connect(**options)


def violation(errors: str, subject: str) -> bool:
    """The server's -ERR names the subject; nats-py hands it to error_cb in lower case."""
    return "permissions violation" in errors.lower() and subject.lower() in errors.lower()


def seed_of(hub_: Hub, machine: str) -> str:
    return identity.read_seed(hub_.machines[machine].home / "machine.nk")


async def streams_made(hub_: Hub) -> None:
    with trio.fail_after(GUARD):
        async with open_transport(hub_.machines["a"].settings(hub_)) as a:
            await a.ensure_streams()


@pytest.mark.parametrize("who", ["no credentials", "unknown key"])
async def test_a_client_the_hub_does_not_know_is_refused(team_hub: Hub, folder: Path, who: str) -> None:
    seed = None if who == "no credentials" else identity.ensure(folder / "stranger.nk").seed()

    async def attempt() -> str:
        errors: list[str] = []
        try:
            nc = await connect_as(team_hub, seed, "a", errors)
        except Exception as exc:
            return " ".join([str(exc), *errors])
        await nc.close()
        return "connected"

    with trio.fail_after(GUARD):
        outcome = await on_asyncio(attempt)
    assert "authorization violation" in outcome.lower()


async def denied(hub_: Hub, machine: str, action: Callable[[Any], Awaitable[Any]]) -> tuple[str, str]:
    """Run `action(nc)` connected as `machine`; (what it returned or raised, the errors the server sent)."""

    async def run() -> tuple[str, str]:
        errors: list[str] = []
        nc = await connect_as(hub_, seed_of(hub_, machine), machine, errors)
        try:
            try:
                result = repr(await action(nc))
            except Exception as exc:
                result = f"{type(exc).__name__}: {exc}"
            try:
                await nc.flush(timeout=2)
            except Exception:
                pass
            await asyncio.sleep(0.05)  # the server's -ERR for the last command reaches error_cb
        finally:
            await nc.close()
        return result, " | ".join(errors)

    with trio.fail_after(GUARD):
        return await on_asyncio(run)


async def request(nc: Any, subject: str, body: bytes = b"") -> Any:
    return await nc.request(subject, body, timeout=1)


async def test_a_machine_cannot_publish_as_another(team_hub: Hub) -> None:
    await streams_made(team_hub)
    for subject in (
        subjects.msg(TEAM, "b", "a"),
        subjects.msg(TEAM, "b", "c"),
        subjects.rcpt(TEAM, "b", "c"),
        subjects.dec(TEAM, "b"),
        subjects.presence(TEAM, "b"),
    ):
        result, errors = await denied(
            team_hub,
            "a",
            lambda nc, s=subject: nc.jetstream().publish(
                s, b"forged", headers={"Nats-Msg-Id": str(uuid.uuid4())}, timeout=1
            ),
        )
        assert violation(errors, subject), (subject, result, errors)
        assert "Timeout" in result or "NoStream" in result  # no PubAck: not stored
    # and nothing of it reached anyone
    with trio.fail_after(GUARD):
        for machine in ("a", "c"):
            async with open_transport(team_hub.machines[machine].settings(team_hub)) as t:
                for kind in subjects.KINDS:
                    assert await t.fetch(kind, timeout=0.3) == [], (machine, kind)
            async with open_transport(team_hub.machines["c"].settings(team_hub)) as t:
                assert await t.read_presence() == []


def consumer_request(name: str, filter_subject: str) -> bytes:
    config = ConsumerConfig(
        name=name, durable_name=name, filter_subject=filter_subject, ack_policy=AckPolicy.EXPLICIT
    )
    return json.dumps({"stream_name": STREAM, "config": config.as_dict()}).encode()


@pytest.mark.parametrize(
    "subject_tail, name, filter_subject",
    [
        ("a_msg.t1.msg.*.b", "a_msg", "t1.msg.*.b"),  # its own consumer's name, b's messages
        ("b_msg.t1.msg.*.b", "b_msg", "t1.msg.*.b"),  # b's consumer
        ("a_rcpt.t1.rcpt.*.b", "a_rcpt", "t1.rcpt.*.b"),
        ("a_msg.t1.msg.>", "a_msg", "t1.msg.>"),  # everything
        ("a_msg", "a_msg", "t1.msg.*.b"),  # no filter in the subject
        ("x", "x", "t1.msg.*.b"),  # another name
        ("", "eph", "t1.msg.*.b"),  # an ephemeral one: $JS.API.CONSUMER.CREATE.<stream>
    ],
)
async def test_a_machine_cannot_make_a_consumer_of_what_is_addressed_to_another(
    team_hub: Hub, subject_tail: str, name: str, filter_subject: str
) -> None:
    await streams_made(team_hub)
    subject = f"$JS.API.CONSUMER.CREATE.{STREAM}" + (f".{subject_tail}" if subject_tail else "")
    result, errors = await denied(
        team_hub, "a", lambda nc: request(nc, subject, consumer_request(name, filter_subject))
    )
    assert "permissions violation" in errors.lower(), (result, errors)


async def test_the_body_filter_must_match_the_pinned_subject(team_hub: Hub) -> None:
    """The one create subject a may use carries its own filter; a body asking for b's messages under
    it is refused by the server itself (filter mismatch)."""
    await streams_made(team_hub)
    subject = f"$JS.API.CONSUMER.CREATE.{STREAM}.a_msg.{subjects.consumer_filter(TEAM, 'a', 'msg')}"

    async def create(nc: Any) -> str:
        return (await request(nc, subject, consumer_request("a_msg", "t1.msg.*.b"))).data.decode()

    result, errors = await denied(team_hub, "a", create)
    assert '"error"' in result and "filter" in result.lower() and "consumer_info" not in result, (
        result,
        errors,
    )


@pytest.mark.parametrize(
    "subject",
    [
        f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.a_msg",  # the legacy create, unpinned
        f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.b_msg",  # pull from b's consumer
        f"$JS.API.CONSUMER.INFO.{STREAM}.b_msg",
        f"$JS.API.CONSUMER.DELETE.{STREAM}.b_msg",
        f"$JS.API.STREAM.MSG.GET.{STREAM}",  # read any stored message directly
        f"$JS.API.DIRECT.GET.{STREAM}",
        f"$JS.API.STREAM.UPDATE.{STREAM}",
        f"$JS.API.STREAM.PURGE.{STREAM}",
        f"$JS.API.STREAM.DELETE.{STREAM}",
        f"$JS.ACK.{STREAM}.b_msg.1.1.1.1.0",  # ack for b
        "$JS.API.STREAM.LIST",
    ],
)
async def test_a_machine_cannot_touch_another_machines_consumers_or_the_stream(
    team_hub: Hub, subject: str
) -> None:
    await streams_made(team_hub)
    result, errors = await denied(team_hub, "a", lambda nc: request(nc, subject, b'{"seq": 1}'))
    assert violation(errors, subject), (result, errors)


@pytest.mark.parametrize("subject", ["_INBOX_b.>", "_INBOX.>", "_INBOX_b.x", "t1.msg.>", "t1.msg.*.b", ">"])
async def test_a_machine_cannot_listen_to_another_machines_inbox_or_the_traffic(
    team_hub: Hub, subject: str
) -> None:
    result, errors = await denied(team_hub, "a", lambda nc: nc.subscribe(subject))
    assert violation(errors, subject), (result, errors)


async def test_a_machine_without_its_inbox_prefix_gets_no_replies(team_hub: Hub) -> None:
    """The default _INBOX. prefix is not a's: its requests never get an answer."""

    async def run() -> str:
        errors: list[str] = []

        async def error_cb(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            servers=[team_hub.url],
            allow_reconnect=False,
            max_reconnect_attempts=0,
            nkeys_seed_str=seed_of(team_hub, "a"),
            error_cb=error_cb,
        )
        try:
            await nc.jetstream().stream_info(STREAM)
        except Exception as exc:
            return f"{type(exc).__name__} {' | '.join(errors)}"
        finally:
            await nc.close()
        return "answered"

    with trio.fail_after(GUARD):
        outcome = await on_asyncio(run)
    assert violation(outcome, 'subscription to "_INBOX.'), outcome


@pytest.mark.parametrize("forged", ["t1.msg.a.*", "t1.msg.a.>", "t1.rcpt.a.*"])
async def test_a_wildcard_as_recipient_reaches_nobody(team_hub: Hub, forged: str) -> None:
    """a may publish t1.msg.a.<anything>; a literal wildcard there is stored (it is a's to send) but
    matches no machine's consumer, whose filters name the recipient literally."""
    await streams_made(team_hub)

    async def publish_raw(nc: Any) -> str:
        await nc.publish(forged, b"to everyone?")
        return "sent"

    async def run() -> None:
        errors: list[str] = []

        async def error_cb(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            servers=[team_hub.url],
            allow_reconnect=False,
            max_reconnect_attempts=0,
            nkeys_seed_str=seed_of(team_hub, "a"),
            error_cb=error_cb,
            inbox_prefix=subjects.inbox_prefix("a"),
            skip_subject_validation=True,
        )
        try:
            await publish_raw(nc)
            await nc.flush(timeout=2)
        finally:
            await nc.close()

    with trio.fail_after(GUARD):
        await on_asyncio(run)
        for machine in ("a", "b", "c"):
            async with open_transport(team_hub.machines[machine].settings(team_hub)) as t:
                for kind in subjects.KINDS:
                    assert await t.fetch(kind, timeout=0.3) == [], (machine, kind)


async def test_a_stream_made_first_with_another_config_is_reported_in_one_line(team_hub: Hub) -> None:
    """What a member can do with the create permission: make the team's stream first, with another
    config (docs/federation.md says so). Every other machine's ensure_streams then says it in one
    line instead of using it."""
    from agent_bridge.federation.errors import HubError

    async def create_short_lived(nc: Any) -> str:
        msg = await request(
            nc,
            f"$JS.API.STREAM.CREATE.{STREAM}",
            json.dumps(
                {
                    "name": STREAM,
                    "subjects": ["t1.msg.>", "t1.rcpt.>", "t1.dec.>"],
                    "storage": "memory",
                    "max_age": 1_000_000_000,
                }
            ).encode(),
        )
        return msg.data.decode()

    result, errors = await denied(team_hub, "a", create_short_lived)
    assert '"created"' in result and errors == "", (result, errors)
    with trio.fail_after(GUARD):
        async with open_transport(team_hub.machines["b"].settings(team_hub)) as b:
            with pytest.raises(HubError) as caught:
                await b.ensure_streams()
    text = str(caught.value)
    assert "\n" not in text and STREAM in text and "another configuration" in text, text

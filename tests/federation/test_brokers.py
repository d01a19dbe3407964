"""Two real brokers, each with its own home and bridge.db, federated through a real nats-server
started from the printed hub config (SPEC §10; no mock of NATS): remote peers listed, messages
and replies to `name@machine` arriving once, `sent` showing the remote receipts, a `message_id`
retry across machines answered as a duplicate, decisions of scope `all` replicated, and
`federation status`."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

from agent_bridge.ipc import blocking
from agent_bridge.ipc.client import open_bridge_client
from tests.conftest import BrokerProcess, run_cli, wait_for
from tests.federation.conftest import Hub, Machine

DEADLINE = 60
MID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def broker_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    env.update(AGENT_BRIDGE_HOME=str(home), AGENT_BRIDGE_WEB_PORT="0", PYTHONUNBUFFERED="1")
    return env


@contextmanager
def federated_broker(machine: Machine, hub: Hub) -> Iterator[BrokerProcess]:
    machine.settings(hub)  # its config.toml with [federation]
    broker = BrokerProcess(broker_env(machine.home), machine.home)
    try:
        yield broker.start()
    finally:
        broker.kill()


@asynccontextmanager
async def session(home: Path, name: str, project: str) -> AsyncIterator[tuple[Any, Any]]:
    record = json.loads((home / "broker.json").read_text())
    hello = {"agent": "claude", "project": project, "name": name, "hostSessionId": f"hs-{name}"}
    async with open_bridge_client(record["socket"], hello) as (client, pushes):
        yield client, pushes


async def next_message(pushes: Any) -> dict[str, Any]:
    async for frame in pushes:
        if frame.get("push") == "message":
            return frame["message"]  # type: ignore[no-any-return]
    raise AssertionError("the session's connection closed")


async def peers_named(client: Any, name: str) -> dict[str, Any] | None:
    for p in await client.request("peers"):
        if p["name"] == name:
            return p  # type: ignore[no-any-return]
    return None


async def test_two_machines_send_reply_and_see_their_receipts(team_hub: Hub) -> None:
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    with trio.fail_after(DEADLINE), federated_broker(a, team_hub), federated_broker(b, team_hub):
        async with session(a.home, "alice", "/w/a") as (alice, alice_pushes), \
                session(b.home, "bob", "/w/b") as (bob, bob_pushes):

            async def bob_listed() -> bool:
                found = await peers_named(alice, "bob@b")
                return found is not None and found["connected"] and found["machine"] == "b"

            await wait_for(bob_listed, timeout=DEADLINE, what="bob@b in alice's peers")
            mine = await peers_named(alice, "alice")
            assert mine is not None and mine["machine"] is None  # this machine's: machine null

            sent = await alice.request("send", to="bob@b", text="hello from a", message_id=MID)
            assert sent["relayed"] is False and sent["message"]["to"]["name"] == "bob@b"
            arrived = await next_message(bob_pushes)
            assert arrived["id"] == sent["message"]["id"] and arrived["text"] == "hello from a"
            assert arrived["from"]["name"] == "alice@a" and arrived["from"]["machine"] == "a"
            await bob.request("ack", ids=[arrived["id"]])

            async def acknowledged_there() -> bool:
                (receipt,) = await alice.request("sent", ids=[sent["message"]["id"]])
                return receipt["state"] == "acknowledged"

            await wait_for(acknowledged_there, timeout=DEADLINE, what="the remote acknowledgement in sent")
            (receipt,) = await alice.request("sent", ids=[sent["message"]["id"]])
            assert receipt["machine"] == "b" and receipt["unconfirmed"] is False
            assert receipt["relayedAt"] is not None and receipt["storedAt"] is not None

            again = await alice.request("send", to="bob@b", text="hello from a", message_id=MID)
            assert again.get("duplicate") is True and again["message"]["id"] == sent["message"]["id"]

            reply = await bob.request("send", to="alice@a", text="hi back", reply_to=arrived["id"])
            back = await next_message(alice_pushes)
            assert back["id"] == reply["message"]["id"] and back["text"] == "hi back"

            with trio.move_on_after(1):  # nothing more arrives at bob: the first message came once
                extra = await next_message(bob_pushes)
                raise AssertionError(f"a second delivery reached bob: {extra}")


async def test_a_decision_for_everyone_reaches_the_other_machine(team_hub: Hub) -> None:
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    with trio.fail_after(DEADLINE), federated_broker(a, team_hub), federated_broker(b, team_hub):
        decided = await trio.to_thread.run_sync(
            lambda: run_cli(broker_env(a.home), "decide", "db", "PostgreSQL", "--scope", "all", "--json"))
        assert decided.returncode == 0, decided.stderr

        async def known_on_b() -> bool:
            listed = await trio.to_thread.run_sync(
                lambda: run_cli(broker_env(b.home), "decisions", "db", "--json"))
            return listed.returncode == 0 and "PostgreSQL" in listed.stdout

        await wait_for(known_on_b, timeout=DEADLINE, what="the decision on machine b")


async def test_federation_status_says_connected_and_names_the_machines(team_hub: Hub) -> None:
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    with trio.fail_after(DEADLINE), federated_broker(a, team_hub), federated_broker(b, team_hub):
        async def connected() -> bool:
            status = await trio.to_thread.run_sync(lambda: blocking.call(a.home, "status", timeout=5.0))
            return bool(status.get("federation", {}).get("connected"))

        await wait_for(connected, timeout=DEADLINE, what="machine a connected to the hub")
        async with session(b.home, "bob", "/w/b"):
            async def heard_b() -> bool:
                shown = await trio.to_thread.run_sync(
                    lambda: run_cli(broker_env(a.home), "federation", "status", "--json"))
                return shown.returncode == 0 and any(
                    m["name"] == "b" for m in json.loads(shown.stdout).get("machines", []))

            await wait_for(heard_b, timeout=DEADLINE, what="machine b heard by a")
        shown = await trio.to_thread.run_sync(lambda: run_cli(broker_env(a.home), "federation", "status"))
        assert shown.returncode == 0 and "connected" in shown.stdout and "b" in shown.stdout


async def test_doctor_names_the_hub_it_reached_and_a_bad_setting_in_one_line(team_hub: Hub) -> None:
    a = team_hub.machines["a"]
    with trio.fail_after(DEADLINE), federated_broker(a, team_hub):
        async def connected() -> bool:
            done = await trio.to_thread.run_sync(lambda: run_cli(broker_env(a.home), "doctor"))
            return any(line.split()[:2] == ["ok", "federation"] and line.endswith(": connected")
                       for line in done.stdout.splitlines())

        await wait_for(connected, timeout=DEADLINE, what="doctor: federation connected")
    (a.home / "config.toml").write_text('[federation]\nurl = "nats://127.0.0.1:1"\nmachine = "A B"\n')
    for command in (["doctor"], ["federation", "status"], ["up"]):
        done = await trio.to_thread.run_sync(lambda c=command: run_cli(broker_env(a.home), *c))
        said = (done.stdout + done.stderr).splitlines()
        bad = [line for line in said if "machine" in line and "A B" in line]
        assert bad and "Traceback" not in done.stderr, (command, done.stdout, done.stderr)
    assert done.returncode == 2  # `up` refuses a bad [federation] value


def clone(folder: Path, origin: str) -> str:
    """A folder that git would call a clone of `origin` (its .git/config names the remote)."""
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "config").write_text(f'[remote "origin"]\n\turl = {origin}\n', encoding="utf-8")
    return str(folder)


async def test_a_project_decision_reaches_the_same_origin_only(team_hub: Hub, tmp_path: Path) -> None:
    """Scope project on machine a: on machine b a clone of the same origin (written another way)
    sees it, a folder with another origin does not."""
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    here = clone(tmp_path / "a" / "api", "git@github.com:acme/api.git")
    same = clone(tmp_path / "b" / "api-clone", "https://github.com/acme/api")
    other = clone(tmp_path / "b" / "web", "git@github.com:acme/web.git")
    with trio.fail_after(DEADLINE), federated_broker(a, team_hub), federated_broker(b, team_hub):
        async with session(a.home, "alice", here) as (alice, _), \
                session(b.home, "bob", same) as (bob, _), session(b.home, "carol", other) as (carol, _):
            decided = await alice.request("decide", topic="api style", text="REST, no GraphQL",
                                          scope={"project": here})
            assert decided["decision"]["text"] == "REST, no GraphQL"

            async def seen_by_bob() -> bool:
                return any(d["text"] == "REST, no GraphQL" for d in await bob.request("decisions"))

            await wait_for(seen_by_bob, timeout=DEADLINE, what="the project decision on b, same origin")
            assert await carol.request("decisions") == []
            await alice.request("decide", topic="db", text="PostgreSQL", scope="all")

            async def everyone() -> bool:
                return any(d["text"] == "PostgreSQL" for d in await carol.request("decisions"))

            await wait_for(everyone, timeout=DEADLINE, what="the decision for all on b")
            assert [d["text"] for d in await carol.request("decisions")] == ["PostgreSQL"]


async def test_the_dashboard_shows_the_team(team_hub: Hub) -> None:
    """/api/sessions lists the other machine's sessions with their machine; /api/status carries
    the hub connection and the machines heard (the status card's federation pill)."""
    import httpx

    from agent_bridge.dashboard import auth

    a, b = team_hub.machines["a"], team_hub.machines["b"]
    with trio.fail_after(DEADLINE), federated_broker(a, team_hub), federated_broker(b, team_hub):
        url = (a.home / "dashboard.url").read_text(encoding="utf-8").strip()
        base, token = url.split("/?", 1)[0], url.split(f"?{auth.TOKEN_PARAM}=", 1)[1]
        async with session(b.home, "bob", "/w/b"), session(a.home, "alice", "/w/a"):
            async def get(path: str) -> Any:
                def fetch() -> Any:
                    with httpx.Client(base_url=base, cookies={auth.COOKIE: token}) as client:
                        answer = client.get(path)
                        assert answer.status_code == 200, answer.text
                        return answer.json()

                return await trio.to_thread.run_sync(fetch)

            async def bob_shown() -> bool:
                sessions = (await get("/api/sessions"))["sessions"]
                return any(s["name"] == "bob@b" and s["machine"] == "b" and s["connected"] for s in sessions)

            await wait_for(bob_shown, timeout=DEADLINE, what="bob@b in the dashboard's sessions")
            alice = [s for s in (await get("/api/sessions"))["sessions"] if s["name"] == "alice"]
            assert alice and alice[0]["machine"] is None
            federation = (await get("/api/status"))["federation"]
            assert federation["machine"] == "a" and federation["connected"] is True
            assert [m["name"] for m in federation["machines"]] == ["b"]

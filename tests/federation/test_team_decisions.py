"""Another machine's decisions as local ones reach sessions (SPEC §10 "Decisions"), between two
real brokers and a real nats-server: a session that identifies later in a folder whose git origin
has a team decision's project key gets it in its catch-up and its SessionStart note, a folder of
another origin does not; a retraction recorded on the other machine gives the sessions in scope
the notice a local one gives; notes and notices name the recording machine; a decision's outbox
row ends on the other machine's receipt, not the PubAck; a machine silent past the bound has its
sessions forgotten."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from agent_bridge.core import federation as fed
from agent_bridge.store import reader
from tests.conftest import BrokerProcess, run_cli, wait_for
from tests.federation.conftest import Hub
from tests.federation.test_brokers import DEADLINE, broker_env, clone, federated_broker, session


async def texts_until(pushes: Any, wanted: str) -> list[str]:
    """The message texts pushed to a session up to and including the first containing `wanted`."""
    seen = []
    async for frame in pushes:
        if frame.get("push") == "message":
            seen.append(frame["message"]["text"])
            if wanted in seen[-1]:
                return seen
    raise AssertionError(f"the session's connection closed before {wanted!r}; saw {seen}")


def session_start_note(home: Path, cwd: str) -> str:
    """What the real SessionStart hook adds to a new session's context in `cwd`."""
    hook = {"session_id": f"hs-note-{Path(cwd).name}", "cwd": cwd, "hook_event_name": "SessionStart",
            "source": "startup"}
    done = run_cli(broker_env(home), "hook", "session-start", "--agent", "claude", input=json.dumps(hook))
    assert done.returncode == 0, done.stderr
    if not done.stdout.strip():
        return ""
    return str(json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"])


async def test_remote_decisions_reach_catch_up_notes_and_retractions(team_hub: Hub, tmp_path: Path) -> None:
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    here = clone(tmp_path / "a" / "api", "git@github.com:acme/api.git")
    same = clone(tmp_path / "b" / "api-clone", "https://github.com/acme/api")
    other = clone(tmp_path / "b" / "web", "git@github.com:acme/web.git")
    with trio.fail_after(DEADLINE * 2), federated_broker(a, team_hub), federated_broker(b, team_hub):
        async with session(a.home, "alice", here) as (alice, _), \
                session(b.home, "carol", other) as (_carol, carol_pushes):
            await alice.request("decide", topic="api style", text="REST, no GraphQL", scope={"project": here})
            await alice.request("decide", topic="db", text="PostgreSQL", scope="all")
            # carol (connected on b, another origin) gets the decision for all, naming machine a
            seen = await texts_until(carol_pushes, "PostgreSQL")
            assert seen[-1].endswith("db: PostgreSQL (recorded on a)"), seen
            assert not any("REST" in t for t in seen), seen

            async def both_on_b() -> bool:
                listed = await trio.to_thread.run_sync(
                    lambda: run_cli(broker_env(b.home), "decisions", "--json"))
                return "REST, no GraphQL" in listed.stdout and "PostgreSQL" in listed.stdout

            await wait_for(both_on_b, timeout=DEADLINE, what="both decisions on machine b")

            # bob identifies on b after they arrived, in a clone of a's origin: his catch-up has both
            async with session(b.home, "bob", same) as (_bob, bob_pushes):
                caught = await texts_until(bob_pushes, "(recorded on a)")  # both queued in one commit,
                caught += await texts_until(bob_pushes, "(recorded on a)")  # in the order b got them
                assert any(t.endswith("api style: REST, no GraphQL (recorded on a)") for t in caught), caught

                # the SessionStart note: the clone lists the project decision, the other origin not
                note = await trio.to_thread.run_sync(session_start_note, b.home, same)
                assert "api style: REST, no GraphQL (recorded on a)" in note, note
                assert "db: PostgreSQL (recorded on a)" in note, note
                note = await trio.to_thread.run_sync(session_start_note, b.home, other)
                assert "db: PostgreSQL (recorded on a)" in note and "REST" not in note, note

                # retracted on a: bob (in scope on b) gets the notice a local retraction gives
                done = await trio.to_thread.run_sync(
                    lambda: run_cli(broker_env(a.home), "retract", "api style", "--reason", "gRPC now"))
                assert done.returncode == 0, done.stderr
                gone = await texts_until(bob_pushes, "retracted")
                assert gone[-1] == ("Pinned owner decision retracted: api style: REST, no GraphQL "
                                    "(recorded on a) no longer applies. Reason: gRPC now"), gone
                done = await trio.to_thread.run_sync(lambda: run_cli(broker_env(a.home), "retract", "db"))
                assert done.returncode == 0, done.stderr
                gone = await texts_until(carol_pushes, "retracted")
                assert "db: PostgreSQL (recorded on a) no longer applies" in gone[-1], gone
                assert not any("REST" in t for t in gone), gone  # carol never had api style


def decision_row(home: Path) -> tuple[int, int | None] | None:
    """(rows of decisions in this home's outbox, relayed_at of the newest), None when empty."""
    with reader.reading(home / "bridge.db") as conn:
        assert conn is not None
        row = conn.execute("SELECT count(*), max(relayed_at) FROM outbox WHERE kind = 'dec'").fetchone()
        assert row is not None
        return None if row[0] == 0 else (int(row[0]), row[1])


async def test_a_decision_waits_for_the_other_machines_receipt_not_the_puback(team_hub: Hub) -> None:
    """Machine b heard, then killed: a's decision is relayed (PubAck) and its outbox row stays,
    since only b's receipt (b stored it) ends it; b back, it stores it and the row ends."""
    a, b = team_hub.machines["a"], team_hub.machines["b"]
    with trio.fail_after(DEADLINE * 2), federated_broker(a, team_hub):
        b.settings(team_hub)
        b_broker = BrokerProcess(broker_env(b.home), b.home)
        try:
            b_broker.start()
            async with session(b.home, "bob", "/w/b"), session(a.home, "alice", "/w/a") as (alice, _):
                async def b_heard() -> bool:
                    shown = await trio.to_thread.run_sync(
                        lambda: run_cli(broker_env(a.home), "federation", "status", "--json"))
                    return any(m["name"] == "b" for m in json.loads(shown.stdout).get("machines", []))

                await wait_for(b_heard, timeout=DEADLINE, what="machine b heard by a")
            b_broker.kill()
            decided = await trio.to_thread.run_sync(
                lambda: run_cli(broker_env(a.home), "decide", "db", "PostgreSQL", "--scope", "all"))
            assert decided.returncode == 0, decided.stderr

            seen: list[tuple[int, int | None]] = []

            async def relayed() -> bool:  # its row is queued at a's next look after the commit
                row = await trio.to_thread.run_sync(decision_row, a.home)
                if row is None:
                    assert not seen, "the decision's row ended at its PubAck, before b stored it"
                    return False
                seen.append(row)
                return row[1] is not None

            await wait_for(relayed, timeout=DEADLINE, what="the decision relayed by the hub")
            b_broker.start()

            async def confirmed() -> bool:
                return await trio.to_thread.run_sync(decision_row, a.home) is None

            await wait_for(confirmed, timeout=DEADLINE, what="b's receipt ending a's decision row")
            listed = await trio.to_thread.run_sync(lambda: run_cli(broker_env(b.home), "decisions", "db"))
            assert "PostgreSQL" in listed.stdout
        finally:
            b_broker.kill()


def as_if_silent_for_a_week(home: Path, machine: str) -> None:
    """Stands in for seven days of silence, which a test cannot wait: this home's record of when
    `machine` and its sessions were last heard moved back past FORGET_AFTER_MS (the broker's
    forgetting compares with the real clock)."""
    import apsw

    back = fed.FORGET_AFTER_MS + 60_000
    conn = apsw.Connection(str(home / "bridge.db"))
    conn.set_busy_timeout(5_000)
    with conn:
        conn.execute("UPDATE machines SET heard_at = heard_at - ? WHERE name = ?", (back, machine))
        conn.execute("UPDATE peers SET last_seen_at = last_seen_at - ? WHERE machine = ?", (back, machine))
    conn.close()


async def test_the_team_sessions_are_forgotten_as_local_ones(team_hub: Hub) -> None:
    """On b: `forget ann@a` once ann left a (refused while she is connected there); then alice
    leaves and machine a is killed, and once its sessions have not been announced for
    FORGET_AFTER_MS, b forgets alice@a by itself. Either way `sessions` and `federation status`
    stop listing them, and a send to them is refused in one line, as for a local forgotten
    session."""
    a, b = team_hub.machines["a"], team_hub.machines["b"]

    async def listed_on_b() -> dict[str, bool]:
        shown = await trio.to_thread.run_sync(lambda: run_cli(broker_env(b.home), "sessions", "--json"))
        return {s["name"]: s["connected"] for s in json.loads(shown.stdout) if s["machine"] is not None}

    async def cli_on_b(*args: str) -> Any:
        return await trio.to_thread.run_sync(lambda: run_cli(broker_env(b.home), *args))

    with trio.fail_after(DEADLINE * 2), federated_broker(b, team_hub):
        a.settings(team_hub)
        a_broker = BrokerProcess(broker_env(a.home), a.home)
        try:
            a_broker.start()
            async with session(a.home, "alice", "/w/a"):
                async with session(a.home, "ann", "/w/a"):
                    async def both_listed() -> bool:
                        return await listed_on_b() == {"alice@a": True, "ann@a": True}

                    await wait_for(both_listed, timeout=DEADLINE, what="alice@a and ann@a listed on b")
                    refused = await cli_on_b("forget", "ann@a")
                    assert refused.returncode != 0 and "connected on machine a" in refused.stderr

                async def ann_gone() -> bool:
                    return (await listed_on_b()).get("ann@a") is False

                await wait_for(ann_gone, timeout=DEADLINE, what="ann@a offline on b")
                done = await cli_on_b("forget", "ann@a")
                assert done.returncode == 0, done.stderr
                assert await listed_on_b() == {"alice@a": True}
                sent = await cli_on_b("send", "ann@a", "still there?")
                assert sent.returncode != 0 and "no session 'ann'" in sent.stderr, sent.stderr

            async def alice_gone() -> bool:  # a's last presence applied on b: no later one will come
                return await listed_on_b() == {"alice@a": False}

            await wait_for(alice_gone, timeout=DEADLINE, what="alice@a offline on b")
        finally:
            a_broker.kill()

        async def forgotten() -> bool:
            # moved back at every look: a presence of a's still on its way when a was killed may be
            # applied on b after an earlier look, and a machine killed a moment ago is still silent
            await trio.to_thread.run_sync(as_if_silent_for_a_week, b.home, "a")
            return await listed_on_b() == {}

        await wait_for(forgotten, timeout=DEADLINE, what="alice@a forgotten on b")
        shown = await cli_on_b("federation", "status", "--json")
        assert [m["name"] for m in json.loads(shown.stdout)["machines"]] == []
        sent = await cli_on_b("send", "alice@a", "still there?")
        assert sent.returncode != 0 and "no session 'alice'" in sent.stderr, (sent.stdout, sent.stderr)
        assert "Traceback" not in sent.stderr

"""Richer owner questions (SPEC §4.6, schema V_ASK): `ask_owner` with `context`, `recommended`,
`wait_seconds` and `withdraw`, on real SQLite files (the upgrade from every earlier version, the
append-only rules) and end to end through real `agent-bridge mcp` processes, the official MCP
client and the owner's CLI against a real broker."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import apsw
import pytest
import trio

from agent_bridge.common.domain import InputError, SessionView
from agent_bridge.store import question_queries
from agent_bridge.store.schema import CURRENT_VERSION, STEPS, V_ASK
from agent_bridge.store.writer import Store
from tests.conftest import call, call_error, mcp_session, run_cli
from tests.test_owner_commands import cli_json, cli_refused

ASK_VERSION = STEPS.index(V_ASK) + 1
PROJ = "/work/app"


def asker(store: Store, name: str) -> SessionView:
    peer = store.create_peer(agent="claude", name=name, project=PROJ, kind="interactive",
                             host_session_id=f"hs-{name}", now=1)
    return SessionView(peer.id, peer.name, peer.project)


def ask(store: Store, who: SessionView, **more):
    asked, _ = store.ask_question(asker=who, asker_agent="claude", question="Which queue?", topic="queue",
                                  options=("Redis", "SQS"), scope={"project": PROJ},
                                  caller_addresses=who.addresses, now=10, **more)
    assert asked is not None
    return asked


@pytest.mark.parametrize("old", range(ASK_VERSION))
def test_every_earlier_version_upgrades_to_richer_questions(tmp_path: Path, old: int) -> None:
    db = tmp_path / "bridge.db"
    conn = apsw.Connection(str(db))
    for step in STEPS[:old]:
        conn.execute(step)
    conn.close()
    store = Store.open(db)
    try:
        assert store.version() == CURRENT_VERSION
        q = ask(store, asker(store, "claude-a"), context="We run on AWS.", recommended=1)
        assert (q.context, q.recommended, q.state) == ("We run on AWS.", 1, "open")
        assert q.to_json()["context"] == "We run on AWS." and q.to_json()["recommended"] == 1
    finally:
        store.close()


def test_a_reader_of_a_database_before_the_upgrade_still_lists_its_questions(tmp_path: Path) -> None:
    """`agent-bridge questions` with the broker down, on a version-8 file: the old columns."""
    db = tmp_path / "bridge.db"
    conn = apsw.Connection(str(db))
    for step in STEPS[: ASK_VERSION - 1]:
        conn.execute(step)
    conn.execute("INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at) VALUES "
                 "('cli','cli','cli','/','interactive',1,1), "
                 "('p1','claude-a','claude','/w','interactive',1,1)")
    conn.execute("INSERT INTO messages(id, from_peer, to_peer, body, hop, reply_to, created_at) "
                 "VALUES ('q1','p1','cli','Which?',1,NULL,5)")
    conn.execute("INSERT INTO questions(id, question, topic, options, scope, created_at) "
                 "VALUES ('q1','Which?',NULL,'[]','{\"project\":\"/w\"}',5)")
    conn.execute("INSERT INTO question_askers(question_id, peer_id, name, agent, asked_at) "
                 "VALUES ('q1','p1','claude-a','claude',5)")
    [q] = question_queries.list_questions(conn)
    assert (q.id, q.state, q.context, q.recommended) == ("q1", "open", None, None)
    assert question_queries.open_count(conn) == 1
    conn.close()


def test_withdrawing_leaves_askedby_and_the_last_one_closes_the_question(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "bridge.db")
    try:
        a, b = asker(store, "claude-a"), asker(store, "claude-b")
        q = ask(store, a, context="asked with what it knew")
        assert ask(store, b).id == q.id
        after = store.withdraw_question(question_id=q.id, asker_id=a.id, now=20)
        assert ([x.name for x in after.asked_by], after.state) == (["claude-b"], "open")
        with pytest.raises(InputError, match="not one you asked"):
            store.withdraw_question(question_id=q.id, asker_id=a.id, now=21)
        gone = store.withdraw_question(question_id=q.id, asker_id=b.id, now=22)
        assert (gone.asked_by, gone.state) == ((), "withdrawn")
        assert question_queries.list_questions(store.conn) == []
        assert question_queries.open_count(store.conn) == 0
        with pytest.raises(InputError, match="withdrawn"):
            store.decline_question(question_id=q.id, reason="late", now=30)
        assert ask(store, a).id != q.id  # asked again: a new question, the withdrawn one stays closed
        for table in ("question_details", "question_withdrawals", "question_ends"):
            with pytest.raises(apsw.ConstraintError, match="append-only"):
                store.conn.execute(f"DELETE FROM {table}")
    finally:
        store.close()


async def test_ask_owner_with_context_a_recommendation_and_a_wait_through_real_sessions(broker, env, home):
    with trio.fail_after(180):
        async with AsyncExitStack() as stack:
            claude = await stack.enter_async_context(mcp_session(env, "--agent", "claude", "--project", PROJ))
            codex = await stack.enter_async_context(mcp_session(env, "--agent", "codex", "--project", PROJ))
            await call(claude, "whoami")
            await call(codex, "whoami")
            # bad input: one line each, nothing stored
            for args, said in (
                ({"recommended": 2, "options": ["a", "b"]}, "recommended: expected an option's index from 0"),
                ({"recommended": 0}, "recommended: the question offers no options"),
                ({"context": "x" * 2001}, "context: at most 2000 characters"),
                ({"wait_seconds": 51}, "wait_seconds: expected a number from 0 to 50"),
                ({"wait_seconds": -1}, "wait_seconds: expected a number from 0 to 50"),
            ):
                assert said in await call_error(claude, "ask_owner", question="Which queue?", **args)
            assert cli_json(env, "questions", "--json") == []

            asked = await call(claude, "ask_owner", question="Which queue?", topic="queue",
                               options=["Redis", "SQS"], recommended=1, context="We run on AWS already.",
                               wait_seconds=0.2)
            q = asked["question"]
            assert "answer" not in asked and q["state"] == "open"  # nobody answered in 0.2 s
            assert (q["context"], q["recommended"]) == ("We run on AWS already.", 1)
            text = run_cli(env, "questions").stdout
            assert "2. SQS (recommended)" in text and "We run on AWS already." in text, text
            assert "give exactly one of" in cli_refused(env, "answer", q["id"])  # still an explicit choice

            async with trio.open_nursery() as nursery:
                waited: dict = {}

                async def waits() -> None:
                    waited.update(await call(codex, "ask_owner", question="Redis or SQS?", topic="queue",
                                             wait_seconds=50))

                nursery.start_soon(waits)
                await _until_asked_by(env, q["id"], 2)
                await trio.to_thread.run_sync(
                    lambda: cli_json(env, "answer", q["id"], "--option", "2", "--json")
                )
            assert waited["question"]["id"] == q["id"] and waited["question"]["state"] == "answered"
            assert waited["answer"]["state"] == "answered" and waited["answer"]["decision"]["text"] == "SQS"
            # the asker's answer message still comes, as for any asker
            inbox = await call(codex, "inbox")
            assert any(m["kind"] == "answer" for m in inbox), inbox

            # withdraw: the caller leaves askedBy; the last one closes it; not someone else's
            other = (await call(claude, "ask_owner", question="Which region?", topic="region"))["question"]
            refused = await call_error(codex, "ask_owner", withdraw=other["id"])
            assert "not one you asked" in refused
            # a question, or withdraw, never neither nor both: one line, nothing changed
            for args in ({}, {"topic": "region"}, {"question": None, "withdraw": None}):
                said = await call_error(claude, "ask_owner", **args)
                assert said == ("Error executing tool ask_owner: ask_owner: give `question` to ask, "
                                "or `withdraw` with your question's id"), said
            said = await call_error(claude, "ask_owner", question="Which region?", withdraw=other["id"])
            assert said == ("Error executing tool ask_owner: ask_owner: give `question` to ask, "
                            "or `withdraw` (your question's id), not both"), said
            assert "withdraw: give the question's id and nothing else (not topic)" in await call_error(
                claude, "ask_owner", withdraw=other["id"], topic="region")
            assert [x["id"] for x in cli_json(env, "questions", "--json")] == [other["id"]]
            gone = (await call(claude, "ask_owner", withdraw=other["id"]))["question"]
            assert (gone["state"], gone["askedBy"]) == ("withdrawn", [])
            assert [x["id"] for x in cli_json(env, "questions", "--json")] == []
            assert "withdrawn" in cli_refused(env, "answer", other["id"], "eu-west-1")


async def _until_asked_by(env: dict[str, str], question_id: str, count: int) -> None:
    while True:
        found = await trio.to_thread.run_sync(lambda: cli_json(env, "questions", "--json"))
        if any(q["id"] == question_id and len(q["askedBy"]) == count for q in found):
            return
        await trio.sleep(0.05)

"""Owner questions end to end (SPEC §4.6): `ask_owner` through real `agent-bridge mcp` processes
driven by the official MCP client, `agent-bridge questions | answer | sessions` as the owner runs
them, against a real broker; the answer reaches the askers as an active message and every
session in scope as a decision notice and in its SessionStart note."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import pytest
import trio

from agent_bridge.store import reader
from tests.conftest import call, call_error, mcp_session, run_cli
from tests.test_owner_commands import CLI_AUTHOR, cli_json, cli_refused, session_start_note

pytestmark = pytest.mark.slow

PROJ, OTHER = "/work/app", "/work/other"


async def test_a_question_asked_twice_is_answered_once_for_every_asker(broker, env, home):
    with trio.fail_after(180):
        async with AsyncExitStack() as stack:
            job = await stack.enter_async_context(
                mcp_session(env, "--agent", "codex", "--project", PROJ, "--job")
            )
            claude = await stack.enter_async_context(mcp_session(env, "--agent", "claude", "--project", PROJ))
            other = await stack.enter_async_context(mcp_session(env, "--agent", "claude", "--project", OTHER))
            for s in (job, claude, other):
                await call(s, "whoami")
            asked = await call(
                job,
                "ask_owner",
                question="Which database for the queue service?",
                topic=" DB ",
                options=["PostgreSQL 16", "SQLite"],
            )
            q = asked["question"]
            assert asked["current"] is None
            assert set(q) == {"id", "question", "topic", "options", "scope", "askedBy", "createdAt", "state",
                              "decisionId", "reason"}
            assert (q["topic"], q["options"], q["scope"], q["state"]) == (
                "db", ["PostgreSQL 16", "SQLite"], {"project": PROJ}, "open")
            assert [a["name"] for a in q["askedBy"]] == ["codex-app"]
            # a second session asks the same: joined, not duplicated
            joined = (await call(claude, "ask_owner", question="Postgres or SQLite?", topic="db"))["question"]
            assert joined["id"] == q["id"] and [a["name"] for a in joined["askedBy"]] == [
                "codex-app",
                "claude-app",
            ]
            # bad input is a tool error, nothing stored
            assert "options: at most 10" in await call_error(
                claude, "ask_owner", question="x", options=["a"] * 11
            )
            assert "question: must not be empty" in await call_error(claude, "ask_owner", question="  ")

            listed = cli_json(env, "questions", "--json")
            assert [x["id"] for x in listed] == [q["id"]]
            text = run_cli(env, "questions").stdout
            assert q["id"] in text and "1. PostgreSQL 16" in text and "from codex-app, claude-app" in text
            assert "1 open question for you" in run_cli(env, "sessions").stdout
            assert isinstance(cli_json(env, "sessions", "--json"), list)  # SPEC §2 shape unchanged

            assert "expected a number from 1 to 2" in cli_refused(env, "answer", q["id"], "--option", "3")
            # a unique start of the id
            done = cli_json(env, "answer", q["id"][:13], "--option", "1", "--json")
            decision = done["decision"]
            assert decision["author"] == CLI_AUTHOR and decision["sourceMessageId"] == q["id"]
            assert (decision["topic"], decision["text"], decision["scope"]) == (
                "db",
                "PostgreSQL 16",
                {"project": PROJ},
            )
            assert (
                done["question"]["state"] == "answered" and done["question"]["decisionId"] == decision["id"]
            )
            assert done["deliveredTo"] == ["claude-app"]  # the job gets no notice; `other` is out of scope
            assert done["askersTold"] == ["claude-app", "codex-app"]
            assert "already answered" in cli_refused(env, "answer", q["id"], "MySQL")

            # each asker: one active message naming the question and the decision
            got = await call(job, "inbox", wait_seconds=10)
            (answer,) = [m for m in got if m["kind"] == "answer"]
            assert answer["hop"] == 1 and answer["from"] == CLI_AUTHOR and answer["replyTo"] == q["id"]
            assert q["id"] in answer["text"] and decision["id"] in answer["text"]
            assert answer["question"]["decisionId"] == decision["id"]
            kinds = []
            with trio.fail_after(20):
                while len(kinds) < 2:
                    kinds += [m["kind"] for m in await call(claude, "inbox", wait_seconds=5)]
            assert sorted(kinds) == ["answer", "decision"]  # the notice too: it is in scope
            assert await call(other, "inbox", peek=True) == []
            assert "db: PostgreSQL 16" in session_start_note(env, PROJ, "host-later")
            assert [d["id"] for d in await call(claude, "decisions")] == [decision["id"]]
            # asked again now: no question, the decision
            again = await call(claude, "ask_owner", question="Which database?", topic="db")
            assert again == {"question": None, "current": decision}
            assert cli_json(env, "questions", "--json") == []
            assert [x["state"] for x in cli_json(env, "questions", "--all", "--json")] == ["answered"]


async def test_a_question_without_topic_is_answered_with_text_or_declined(broker, env, home):
    with trio.fail_after(180):
        async with mcp_session(env, "--agent", "codex", "--project", PROJ) as s:
            first = (await call(s, "ask_owner", question="May I delete the old build/ folder?"))["question"]
            second = (await call(s, "ask_owner", question="Which API style?", scope="all"))["question"]
            assert first["topic"] is None and second["scope"] == "all"
            done = cli_json(env, "answer", first["id"], "Yes, delete it", "--scope", "all", "--json")
            assert done["decision"]["topic"] == "may i delete the old build/ folder"
            assert done["decision"]["scope"] == "all" and done["decision"]["text"] == "Yes, delete it"
            out = run_cli(env, "answer", second["id"], "--decline", "not yet decided; keep both")
            assert out.returncode == 0 and out.stdout.startswith("Declined "), out.stderr
            with reader.reading(home / "bridge.db") as conn:
                assert conn is not None
                assert conn.execute("SELECT count(*) FROM decisions").fetchone()[0] == 1
            got = []
            with trio.fail_after(20):
                while len([m for m in got if m["kind"] == "answer"]) < 2:
                    got += await call(s, "inbox", wait_seconds=5)
            declined = [m for m in got if m["kind"] == "answer" and m["question"]["state"] == "declined"]
            assert len(declined) == 1 and "not yet decided; keep both" in declined[0]["text"]
            assert json.loads(run_cli(env, "questions", "--json").stdout) == []


async def test_owner_argument_errors_are_one_line_and_exit_2(broker, env):
    for args, words in (
        (["answer", "x"], "give exactly one of TEXT"),
        (["answer", "x", "t", "--decline", "r"], "give exactly one of TEXT"),
        (["answer", "x", "--decline", "r", "--scope", "all"], "declined question records no decision"),
        (["answer", "x", "t", "--scope", "{bad"], "scope:"),
        (["answer", "nope", "t"], "no question has id"),
    ):
        done = run_cli(env, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


async def test_agent_text_in_questions_is_made_visible(broker, env):
    with trio.fail_after(60):
        async with mcp_session(env, "--agent", "codex", "--project", PROJ) as s:
            await call(s, "ask_owner", question="Pick \x1b[31mred\x1b[0m?", options=["\x07bell"])
    text = run_cli(env, "questions").stdout
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[31mred" in text and "\\x07bell" in text

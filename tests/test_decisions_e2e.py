"""Pinned owner decisions end to end: a real broker, real `agent-bridge mcp` processes driven
by the official MCP client over stdio (SPEC §4.1-4.4, §5)."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

import pytest
import trio

from agent_bridge.store import reader
from tests.conftest import call, call_error, mcp_session, run_cli
from tests.shapes import DECISION_FIELDS

pytestmark = pytest.mark.slow



async def inbox(session, **args):
    return await call(session, "inbox", **args)


async def open_sessions(stack: AsyncExitStack, env, specs):
    out = []
    for args in specs:
        out.append(await stack.enter_async_context(mcp_session(env, *args)))
    return out


def history_count(home) -> int:
    with reader.reading(home / "bridge.db") as conn:
        return conn.execute("SELECT count(*) FROM decisions").fetchone()[0]


def message_count(home) -> int:
    with reader.reading(home / "bridge.db") as conn:
        return conn.execute("SELECT count(*) FROM messages").fetchone()[0]


async def test_decide_notifies_exactly_the_connected_non_job_sessions_in_scope(broker, env, home, tmp_path):
    proj, other = "/work/app", "/work/other"
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            a, b, c, job = await open_sessions(
                stack,
                env,
                [
                    ("--agent", "claude", "--project", proj),
                    ("--agent", "codex", "--project", proj),
                    ("--agent", "claude", "--project", other),
                    ("--agent", "codex", "--project", proj, "--job"),
                ],
            )
            me = await call(a, "whoami")
            assert me["name"] == "claude-app" and me["project"] == proj and me["kind"] == "interactive"
            assert set(me) == {"id", "name", "agent", "project", "hostSessionId", "kind"}
            assert (await call(job, "whoami"))["kind"] == "job"
            # b has made a tool call: a real session (one that has not is a possible health
            # check and gets no notice until it does: tests/test_identity.py)
            await call(b, "whoami")

            before = int(time.time() * 1000)
            result = await call(a, "decide", topic=" Camera ", text="  Hold to look ")
            after = int(time.time() * 1000)
            decision = result["decision"]
            assert set(decision) == DECISION_FIELDS
            assert decision["topic"] == "camera" and decision["text"] == "Hold to look"
            assert decision["scope"] == {"project": proj}  # omitted scope = the caller's project
            assert decision["author"] == {"id": me["id"], "name": "claude-app", "agent": "claude"}
            assert before <= decision["createdAt"] <= after
            assert (
                decision["supersedes"] is None
                and decision["sourceMessageId"] is None
                and decision["current"] is True
            )
            # sorted; job and other project excluded
            assert result["deliveredTo"] == ["claude-app", "codex-app"]

            for session in (a, b):
                got = await inbox(session, wait_seconds=10)
                assert [m["kind"] for m in got] == ["decision"]
                assert got[0]["hop"] == 100 and got[0]["decision"]["id"] == decision["id"]
                assert got[0]["from"]["name"] == "claude-app"
                assert "camera: Hold to look" in got[0]["text"]
                assert await inbox(session) == []  # acknowledged by being returned
            for session in (c, job):
                assert await inbox(session, wait_seconds=0.5) == []

            everyone = await call(b, "decide", topic="lint", text="ruff", scope="all")
            assert everyone["deliveredTo"] == ["claude-app", "claude-other", "codex-app"]
            assert everyone["decision"]["author"]["agent"] == "codex"
            for session in (a, b, c):
                got = await inbox(session, wait_seconds=10)
                assert [m["decision"]["topic"] for m in got] == ["lint"]
            assert await inbox(job, wait_seconds=0.3) == []

            # sessions scope, by name, id and host session id (here: the other's id)
            c_id = (await call(c, "whoami"))["id"]
            targeted = await call(
                a, "decide", topic="style", text="tabs", scope={"sessions": ["codex-app", c_id]}
            )
            assert targeted["deliveredTo"] == ["claude-other", "codex-app"]
            assert (await inbox(b, wait_seconds=10))[0]["decision"]["topic"] == "style"
            assert (await inbox(c, wait_seconds=10))[0]["decision"]["topic"] == "style"
            assert await inbox(a, wait_seconds=0.3) == []  # the recorder is not in that scope

            # a job runner can decide and look up, and is never among the notified
            by_job = await call(job, "decide", topic="ci", text="nightly", scope="all")
            assert by_job["deliveredTo"] == ["claude-app", "claude-other", "codex-app"]
            assert [d["topic"] for d in await call(job, "decisions", scope="all")] == ["ci", "lint"]


async def test_supersede_history_provenance_and_lookups(broker, env, home):
    proj, other = "/work/app", "/work/other"
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            a, b, c = await open_sessions(
                stack,
                env,
                [
                    ("--agent", "claude", "--project", proj),
                    ("--agent", "codex", "--project", proj),
                    ("--agent", "claude", "--project", other),
                ],
            )
            a_me, c_me = await call(a, "whoami"), await call(c, "whoami")
            first = (await call(a, "decide", topic="db", text="SQLite"))["decision"]
            # supersedes across scopes, including a scope change
            second = (await call(c, "decide", topic="DB", text="PostgreSQL", scope="all"))["decision"]
            assert second["supersedes"] == first["id"] and second["current"] is True
            third = (
                await call(b, "decide", topic="db ", text="DuckDB", scope='{"project": "/work/other/"}')
            )["decision"]
            assert third["scope"] == {"project": other} and third["supersedes"] == second["id"]

            hist = await call(a, "decisions", scope="all", history=True)
            assert [d["text"] for d in hist] == ["PostgreSQL"]  # only revisions recorded for all
            full = await call(c, "decisions", history=True)
            assert [d["text"] for d in full] == ["DuckDB", "PostgreSQL"]
            assert [d["current"] for d in full] == [True, False]
            assert await call(a, "decisions") == []  # db's current revision is for /work/other

            # provenance: an existing bridge message is kept; anything else is null
            sent = (await call(b, "send", to="claude-app", text="which camera?"))["message"]
            with_source = (
                await call(a, "decide", topic="camera", text="hold", source_message_id=sent["id"])
            )["decision"]
            assert with_source["sourceMessageId"] == sent["id"]
            bogus = (
                await call(a, "decide", topic="camera", text="tap", source_message_id="no-such-message")
            )["decision"]
            assert bogus["sourceMessageId"] is None and bogus["supersedes"] == with_source["id"]

            # lookups
            await call(a, "decide", topic="global", text="be kind", scope="all")
            await call(
                c, "decide", topic="to-a", text="for claude-app only", scope={"sessions": [a_me["id"]]}
            )
            await call(
                c, "decide", topic="to-c", text="for claude-other only", scope={"sessions": [c_me["name"]]}
            )
            mine = [d["topic"] for d in await call(a, "decisions")]
            assert mine == ["to-a", "global", "camera"]  # project + global + addressed to the caller
            assert [d["topic"] for d in await call(b, "decisions")] == ["global", "camera"]
            assert [d["topic"] for d in await call(a, "decisions", scope="all")] == ["global"]
            # any project lookup through MCP includes decisions addressed to the caller (SPEC §4.2)
            assert [d["topic"] for d in await call(a, "decisions", scope={"project": other})] == [
                "to-a",
                "global",
                "db",
            ]
            assert [d["topic"] for d in await call(b, "decisions", scope={"project": other})] == [
                "global",
                "db",
            ]
            by_name = await call(b, "decisions", scope={"sessions": ["claude-app"]})
            # recorded under the id, looked up by name
            assert [d["topic"] for d in by_name] == ["to-a", "global"]
            assert [d["topic"] for d in await call(b, "decisions", query="KIND")] == ["global"]
            assert [d["topic"] for d in await call(b, "decisions", query="tap")] == ["camera"]
            assert await call(b, "decisions", query="nothing like this") == []
            assert [d["text"] for d in await call(b, "decisions", query="camera", history=True)] == [
                "tap",
                "hold",
            ]


async def test_windows_scope_and_bad_input_stores_nothing(broker, env, home):
    with trio.fail_after(120):
        async with mcp_session(env, "--agent", "claude", "--project", "/work/app") as a:
            win = (await call(a, "decide", topic="path", text="x", scope={"project": "C:\\Users\\Me\\Proj"}))[
                "decision"
            ]
            assert win["scope"] == {"project": "c:/users/me/proj"}
            found = await call(a, "decisions", scope='{"project": "c:/users/me/proj/"}')
            assert [d["id"] for d in found] == [win["id"]]
            await inbox(a)

            decisions_before, messages_before = history_count(home), message_count(home)
            bad_cases = [
                ({"topic": "   ", "text": "x"}, "topic"),
                ({"topic": "t" * 201, "text": "x"}, "200"),
                ({"topic": "t", "text": " "}, "text"),
                ({"topic": "t", "text": "x" * 4001}, "4000"),
                ({"topic": "t", "text": "x", "scope": {"folder": "/x"}}, 'unknown key "folder"'),
                (
                    {"topic": "t", "text": "x", "scope": {"project": "/x", "sessions": ["a"]}},
                    "exactly one key",
                ),
                ({"topic": "t", "text": "x", "scope": {"project": "relative/dir"}}, "relative"),
                ({"topic": "t", "text": "x", "scope": {"sessions": []}}, "empty list"),
                ({"topic": "t", "text": "x", "scope": {"sessions": [3]}}, "expected a string"),
                ({"topic": "t", "text": "x", "scope": "not json"}, "not JSON"),
                ({"topic": "t", "text": "x", "scope": "[1]"}, "a list"),
            ]
            for args, fragment in bad_cases:
                message = await call_error(a, "decide", **args)
                assert fragment in message, (args, message)
            assert "512" in await call_error(a, "decisions", query="q" * 513)
            assert "scope" in await call_error(a, "decisions", scope={"nope": 1})
            assert history_count(home) == decisions_before
            assert message_count(home) == messages_before
            assert await inbox(a, wait_seconds=0.3) == []


async def test_names_dedupe_and_peers(broker, env):
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            a, b = await open_sessions(stack, env, [("--project", "/w/site"), ("--project", "/w/site")])
            names = sorted([(await call(a, "whoami"))["name"], (await call(b, "whoami"))["name"]])
            assert names == ["claude-site", "claude-site-2"]
            listed = await call(a, "peers")
            assert {p["name"] for p in listed if p["connected"]} == {"claude-site", "claude-site-2"}
            assert all(
                set(p) == {"id", "name", "agent", "project", "hostSessionId", "kind", "connected", "state",
                           "stateSince"}
                for p in listed
            )
            assert [p["name"] for p in await call(a, "peers", project="/elsewhere")] == []


async def test_cli_reads_decisions_with_the_broker_down(broker, env, home):
    with trio.fail_after(60):
        async with mcp_session(env, "--project", "/w/cli") as a:
            await call(a, "decide", topic="db", text="PostgreSQL")
            await call(a, "decide", topic="db", text="SQLite")
            await call(a, "decide", topic="ui", text="dark", scope="all")
    broker.stop()
    out = run_cli(env, "decisions", "--json")
    assert out.returncode == 0, out.stderr
    import json

    assert [d["text"] for d in json.loads(out.stdout)] == ["dark", "SQLite"]
    hist = json.loads(run_cli(env, "decisions", "db", "--history", "--json").stdout)
    assert [d["text"] for d in hist] == ["SQLite", "PostgreSQL"]
    scoped = json.loads(run_cli(env, "decisions", "--scope", "all", "--json").stdout)
    assert [d["topic"] for d in scoped] == ["ui"]
    human = run_cli(env, "decisions")
    assert "db" in human.stdout and "SQLite" in human.stdout
    bad = run_cli(env, "decisions", "--scope", '{"folder": 1}')
    assert bad.returncode == 2 and 'unknown key "folder"' in bad.stderr

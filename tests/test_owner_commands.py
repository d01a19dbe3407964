"""The owner's commands end to end (SPEC §2): `agent-bridge decide | send | retract | sessions |
forget | --version` as a user runs them, against a real broker and real `agent-bridge mcp`
processes driven by the official MCP client over stdio, the real SessionStart hook and the
broker's real dashboard over HTTP."""

from __future__ import annotations

import json
import subprocess
from contextlib import AsyncExitStack
from urllib.parse import quote

import httpx
import pytest
import trio

from agent_bridge import __version__
from agent_bridge.common import paths
from agent_bridge.dashboard import auth
from agent_bridge.store import reader
from tests.conftest import CLI, BrokerProcess, call, mcp_session, run_cli, wait_for, wait_until

pytestmark = pytest.mark.slow

CLI_AUTHOR = {"id": "cli", "name": "cli", "agent": "cli"}


def cli_json(env, *args: str, cwd: str | None = None):
    done = subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cli_refused(env, *args: str) -> str:
    done = run_cli(env, *args)
    assert done.returncode != 0, done.stdout
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def counts(home) -> tuple[int, int]:
    with reader.reading(home / "bridge.db") as conn:
        if conn is None:
            return 0, 0
        return (conn.execute("SELECT count(*) FROM decisions").fetchone()[0],
                conn.execute("SELECT count(*) FROM messages").fetchone()[0])


def session_start_note(env, cwd: str, session_id: str) -> str:
    payload = {
        "session_id": session_id,
        "transcript_path": None,
        "cwd": cwd,
        "hook_event_name": "SessionStart",
        "source": "startup",
    }
    done = subprocess.run([*CLI, "hook", "session-start", "--agent", "claude"], input=json.dumps(payload),
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]


async def dashboard_history(home, topic: str) -> dict:
    record = paths.read_broker_json(home)
    assert record and record.get("web")
    token = (home / paths.DASHBOARD_URL).read_text(encoding="utf-8").strip().split("?t=", 1)[1]
    async with httpx.AsyncClient(headers={"Cookie": f"{auth.COOKIE}={token}"}) as client:
        response = await client.get(f"{record['web']}/api/decisions/{quote(topic, safe='')}/history")
    assert response.status_code == 200, response.text
    return response.json()


async def test_retraction_is_visible_in_every_reader(broker, env, home, tmp_path):
    proj, other = "/work/app", "/work/other"
    with trio.fail_after(180):
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(mcp_session(env, "--agent", "claude", "--project", proj))
            b = await stack.enter_async_context(mcp_session(env, "--agent", "codex", "--project", other))
            # sessions in use (one never used is a health check: tests/test_identity.py)
            for session in (a, b):
                await call(session, "whoami")
            first = cli_json(
                env,
                "decide",
                "Database",
                "PostgreSQL 16, no ORM",
                "--scope",
                json.dumps({"project": proj}),
                "--json",
            )
            assert first["decision"]["author"] == CLI_AUTHOR and first["deliveredTo"] == ["claude-app"]
            assert [d["topic"] for d in await call(a, "decisions")] == ["database"]
            assert "database: PostgreSQL 16" in session_start_note(env, proj, "host-x")

            done = cli_json(
                env, "retract", " DATABASE ", "--reason", "the demo pinned it by mistake", "--json"
            )
            retraction = done["retraction"]
            assert done["notified"] == ["claude-app"]  # in the revision's scope; b is in another folder
            assert retraction["topic"] == "database" and retraction["retracts"] == first["decision"]["id"]
            assert (
                retraction["reason"] == "the demo pinned it by mistake" and retraction["author"] == CLI_AUTHOR
            )

            # MCP `decisions` through a real `agent-bridge mcp`: gone; history: every revision, none current
            assert await call(a, "decisions") == []
            assert await call(a, "decisions", query="postgres") == []
            history = await call(a, "decisions", history=True)
            assert [d["id"] for d in history] == [first["decision"]["id"]] and history[0]["current"] is False
            # ... and beside the revisions (a second block; the first stays the array of decision objects),
            # the retraction with its time, author and reason
            blocks = (await a.call_tool("decisions", {"history": True})).content
            assert len(blocks) == 2 and json.loads(blocks[0].text) == history
            withdrawn = json.loads(blocks[1].text.partition(": ")[2])
            assert withdrawn == [retraction], blocks[1].text
            assert len((await a.call_tool("decisions", {})).content) == 1  # no history, no second block
            # one passive notice for the session in scope, framed as coming from a local command
            notices = [m for m in await call(a, "inbox", wait_seconds=10) if m["kind"] == "retraction"]
            assert len(notices) == 1 and notices[0]["hop"] == 100 and notices[0]["from"] == CLI_AUTHOR
            assert notices[0]["retraction"]["id"] == retraction["id"]
            assert not [m for m in await call(b, "inbox", peek=True) if m["kind"] == "retraction"]
            # CLI
            assert cli_json(env, "decisions", "--json") == []
            text = run_cli(env, "decisions", "--history").stdout
            # grouped under its topic: the retraction (when, by whom, why) just above the revision it withdrew
            lines = text.splitlines()
            assert lines[0] == "database  (no current decision; 1 revision)", text
            assert lines[1].startswith("  retracted ") and lines[1].endswith(
                " by cli: the demo pinned it by mistake"
            )
            assert lines[2].endswith(f"  for project {proj}  by cli  (retracted)")  # the revision, marked
            # SessionStart note
            assert "database" not in session_start_note(env, proj, "host-y")
            # dashboard history endpoint: the retraction beside the decisions, not inside them
            body = await dashboard_history(home, "database")
            assert body["retractions"] == [retraction]
            assert [d["current"] for d in body["decisions"]] == [False]
            assert set(body["decisions"][0]) == {"id", "topic", "text", "scope", "author", "createdAt",
                                                 "sourceMessageId", "supersedes", "current"}

            # a later decide starts the topic again; supersedes is the retracted revision
            again = cli_json(env, "decide", "database", "SQLite", "--scope", "all", "--json")
            assert again["decision"]["supersedes"] == first["decision"]["id"]
            assert sorted(again["deliveredTo"]) == ["claude-app", "codex-other"]
            assert [d["text"] for d in await call(b, "decisions")] == ["SQLite"]
            assert "database: SQLite" in session_start_note(env, proj, "host-z")

            before = counts(home)
            assert "already retracted" not in cli_refused(env, "retract", "nothing-here")
            assert "no decision" in cli_refused(env, "retract", "nothing-here")
            cli_json(env, "retract", "database", "--json")
            assert "already retracted" in cli_refused(env, "retract", "database")
            assert counts(home)[0] == before[0]


async def test_cli_decide_and_send_follow_the_tools_rules(broker, env, home, tmp_path):
    proj = str(tmp_path / "proj")
    (tmp_path / "proj").mkdir()
    logged: list[str] = []

    async def on_log(params) -> None:
        logged.append(str(params.data))

    with trio.fail_after(180):
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(
                mcp_session(env, "--agent", "claude", "--project", proj, logging_callback=on_log)
            )
            job = await stack.enter_async_context(
                mcp_session(env, "--agent", "codex", "--project", proj, "--job")
            )
            # a session in use (one never used is a health check: tests/test_identity.py)
            await call(a, "whoami")
            before = counts(home)
            for args, error in [
                (("decide", "   ", "text"), "topic: must not be empty"),
                (("decide", "t" * 201, "text"), "topic: at most 200"),
                (("decide", "topic", " "), "text: must not be empty"),
                (("decide", "topic", "x" * 4001), "text: at most 4000"),
                (("decide", "topic", "x", "--scope", '{"folder": "/x"}'), 'unknown key "folder"'),
                (("decide", "topic", "x", "--scope", '{"project": "rel/dir"}'), "relative"),
                (("send", "nobody-here", "hi"), "no session is addressed by 'nobody-here'"),
                (("send", "cli", "hi"), "no session is addressed by 'cli'"),
                (("send", "claude-proj", " "), "text: must not be empty"),
            ]:
                assert error in cli_refused(env, *args), args
            assert counts(home) == before  # nothing stored

            # omitted scope: the folder the command runs in, as the tool's is its session's project
            made = cli_json(env, "decide", "Camera", "hold to look", "--json", cwd=proj)
            assert made["decision"]["scope"] == {"project": proj} and made["decision"]["topic"] == "camera"
            assert made["decision"]["author"] == CLI_AUTHOR and made["deliveredTo"] == ["claude-proj"]
            assert set(made["decision"]) == {"id", "topic", "text", "scope", "author", "createdAt",
                                             "sourceMessageId", "supersedes", "current"}
            got = await call(a, "inbox", wait_seconds=10)
            assert [(m["kind"], m["from"]["id"], m["hop"]) for m in got] == [("decision", "cli", 100)]
            assert await call(job, "inbox", peek=True) == []  # a job runner is never notified

            sent = cli_json(env, "send", "claude-proj", "please rebase", "--json")
            assert sent["message"]["from"] == CLI_AUTHOR and sent["message"]["hop"] == 1
            result = await a.call_tool("inbox", {"wait_seconds": 10})
            got = json.loads(result.content[0].text)
            assert [(m["text"], m["from"]["id"]) for m in got] == [("please rebase", "cli")]
            assert "sender `cli`: a local `agent-bridge` command" in result.content[1].text
            await wait_for(
                lambda: _async(any("please rebase" in line for line in logged)), what="framed log line"
            )
            framed = next(line for line in logged if "please rebase" in line)
            assert "local command" in framed and "not from the user" in framed
            # the command line is not a session: never listed, and its name is never an agent's
            assert "cli" not in {p["name"] for p in await call(a, "peers")}
            assert "cli" not in {s["name"] for s in cli_json(env, "sessions", "--json")}


async def _async(value):
    return value


async def test_sessions_and_forget(env, home, tmp_path):
    broker = BrokerProcess(env, home).start()
    try:
        with trio.fail_after(180):
            async with AsyncExitStack() as stack:
                live = await stack.enter_async_context(
                    mcp_session(env, "--agent", "claude", "--project", "/w/live")
                )
                async with mcp_session(env, "--agent", "codex", "--project", "/w/gone") as gone:
                    gone_id = (await call(gone, "whoami"))["id"]
                wait_until(lambda: not [s for s in cli_json(env, "sessions", "--json") if s["connected"] and
                                        s["id"] == gone_id], what="the closed session to be gone")
                cli_json(env, "send", gone_id, "one", "--json")
                cli_json(env, "send", gone_id, "two", "--json")
                live_me = await call(live, "whoami")

                listed = cli_json(env, "sessions", "--json")
                assert [s["name"] for s in listed] == ["claude-live", "codex-gone"]  # connected first
                assert [s["connected"] for s in listed] == [True, False]
                assert listed[1]["unacknowledged"] == 2 and listed[0]["unacknowledged"] == 0
                assert set(listed[0]) == {
                    "id",
                    "name",
                    "agent",
                    "project",
                    "hostSessionId",
                    "kind",
                    "connected",
                    "state",
                    "stateSince",
                    "lastSeen",
                    "unacknowledged",
                }
                assert isinstance(listed[1]["lastSeen"], int) and listed[1]["lastSeen"] > 1_700_000_000_000
                # no hooks ran for the connected one; the gone one is offline since it was last seen
                assert (listed[0]["state"], listed[0]["stateSince"]) == (None, None)
                assert (listed[1]["state"], listed[1]["stateSince"]) == ("offline", listed[1]["lastSeen"])
                assert "gone, last seen" in run_cli(env, "sessions").stdout

                # a connected session is refused, by any of its addresses; nothing is forgotten
                for address in ("claude-live", live_me["id"]):
                    assert "is connected" in cli_refused(env, "forget", address, "codex-gone")
                assert len(cli_json(env, "sessions", "--json")) == 2
                assert "no session is addressed" in cli_refused(env, "forget", "no-such-session")
                assert "--gone-for" in cli_refused(env, "forget", "--gone-for", "soon")
                assert "not both" in cli_refused(env, "forget")

                done = cli_json(env, "forget", "codex-gone", "--json")
                (item,) = done["forgotten"]
                assert item["session"]["id"] == gone_id
                assert sorted(m["text"] for m in item["dropped"]) == ["one", "two"]
                assert [s["name"] for s in cli_json(env, "sessions", "--json")] == ["claude-live"]
                assert "no session is addressed" in cli_refused(env, "send", gone_id, "three")
                # --gone-for never touches a connected session
                assert cli_json(env, "forget", "--gone-for", "0s", "--json") == {"forgotten": []}
    finally:
        broker.stop()
    # with the broker down: read-only, nobody connected
    listed = cli_json(env, "sessions", "--json")
    assert [(s["name"], s["connected"]) for s in listed] == [("claude-live", False)]
    assert not (home / "broker.json").exists()


def test_writes_start_a_broker_when_none_runs(env, home):
    done = run_cli(env, "decide", "ci", "nox", "--scope", "all", "--json")
    try:
        assert done.returncode == 0, done.stderr
        assert "started a broker" in done.stderr
        assert json.loads(done.stdout)["decision"]["topic"] == "ci"
        wait_until(lambda: paths.read_broker_json(home), what="broker.json")
    finally:
        run_cli(env, "down")


def test_a_broker_that_cannot_start_is_refused_in_one_line(env, home):
    paths.ensure_home(home)
    (home / "config.toml").write_text("hop_limit = 'many'\n", encoding="utf-8")
    line = cli_refused(env, "decide", "ci", "nox", "--scope", "all")
    assert "none could be started" in line


async def test_version_on_the_command_line_and_in_mcp_initialize(env, home):
    done = run_cli(env, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"agent-bridge {__version__}"
    assert __version__
    with trio.fail_after(120):
        async with mcp_session(env, "--agent", "claude", "--project", "/w/v") as session:
            result = await session.initialize()  # the SDK keeps the server's answer
            assert result.server_info.name == "agent-bridge"
            assert result.server_info.version == __version__
    run_cli(env, "down")

"""The command line for people (issue 25, SPEC §2 and §8 "Terminal output"): one or two human
lines by default and the tool's JSON with `--json`, one exit code for bad arguments, help that
says what each command does, names shared by gone sessions refused with the candidates, and no
agent's text reaching the owner's terminal as control characters. Real broker, real
`agent-bridge mcp` processes, real command-line runs."""

from __future__ import annotations

import json
import re
import subprocess
from contextlib import AsyncExitStack

import pytest
import trio

from agent_bridge.common import display
from tests.conftest import CLI, BrokerProcess, call, mcp_session, run_cli, wait_until

ESC_TEXT = "Postgres\x1b]0;pwned\x07\x1b[2J\r\u202eevil\x9b"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # what a terminal obeys


def test_visible_writes_control_characters_out():
    assert display.visible("plain text, é, 😀") == "plain text, é, 😀"
    assert display.visible(ESC_TEXT) == "Postgres\\x1b]0;pwned\\x07\\x1b[2J\\r\\u202eevil\\x9b"
    assert display.visible("two\nlines\tand a bell\x07") == "two\\nlines\\tand a bell\\x07"
    assert display.visible("lone \udcff surrogate") == "lone \\udcff surrogate"
    assert not CONTROL.search(display.visible("".join(map(chr, range(0x00, 0xA0)))))
    assert display.scope_words("all") == "all sessions"
    assert display.scope_words({"project": "/w/app"}) == "project /w/app"
    assert display.scope_words({"sessions": ["a", "b\x1b"]}) == "sessions a, b\\x1b"


def cli(env, *args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def refused(done: subprocess.CompletedProcess, code: int = 2) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    return line


@pytest.mark.slow
async def test_owner_commands_speak_to_people_and_json_to_scripts(broker, env, home, tmp_path):
    proj = str(tmp_path / "pr\x1b[31moj")  # a project path is an agent's text too
    (tmp_path / "pr\x1b[31moj").mkdir()
    with trio.fail_after(180):
        async with mcp_session(env, "--agent", "claude", "--project", proj) as a:
            me = await call(a, "whoami")

            made = cli(env, "decide", "DB", ESC_TEXT, "--scope", "all")
            assert made.returncode == 0, made.stderr
            (line,) = made.stdout.splitlines()  # one line for people, not 20 lines of JSON
            assert line == f"Recorded db for all sessions; told {display.visible(me['name'])}.", line
            assert not CONTROL.search(made.stdout)

            again = cli(env, "decide", "db", "SQLite", "--scope", json.dumps({"project": proj}), "--json")
            result = json.loads(again.stdout)  # --json: the tool's JSON result, exactly
            assert set(result) == {"decision", "deliveredTo"} and result["deliveredTo"] == [me["name"]]
            assert result["decision"]["text"] == "SQLite" and result["decision"]["scope"] == {"project": proj}
            third = cli(env, "decide", "db", "MySQL", "--scope", "all")
            assert (
                "Recorded db for all sessions (supersedes \u201cSQLite\u201d by cli); told "
                f"{display.visible(me['name'])}."
                == third.stdout.strip()
            )

            # decisions: the scope in words; history grouped under its topic; agents' text made visible
            listed = cli(env, "decisions").stdout
            assert "db  for all sessions  by cli" in listed and "[" not in listed.splitlines()[0]
            history = cli(env, "decisions", "--history").stdout.splitlines()
            assert history[0] == "db  (current; 3 revisions)"
            assert [ln.split("  ")[-1] for ln in history if ln.startswith("  2")] == [
                "(current)",
                "(superseded)",
                "(superseded)",
            ]
            assert f"for project {display.visible(proj)}" in history[3]
            assert "Postgres\\x1b]0;pwned\\x07" in "\n".join(history) and not CONTROL.search(
                "\n".join(history)
            )
            exact = json.loads(cli(env, "decisions", "--history", "--json").stdout)
            assert exact[-1]["text"] == ESC_TEXT  # --json stays exact

            sessions = cli(env, "sessions").stdout
            assert "pr\\x1b[31moj" in sessions and not CONTROL.search(sessions)
            assert json.loads(cli(env, "sessions", "--json").stdout)[0]["project"] == proj

            sent = cli(env, "send", me["name"], "please rebase")
            assert sent.returncode == 0 and sent.stdout.startswith(
                f"Sent to {display.visible(me['name'])} (connected); message "), sent.stdout
            assert len(sent.stdout.splitlines()) == 1
            as_json = json.loads(cli(env, "send", me["name"], "again", "--json").stdout)
            assert set(as_json) == {"message", "recipientConnected", "recipientLastSeen"}

            gone = cli(env, "retract", "db", "--reason", "too early")
            assert gone.stdout.strip() == f"Retracted db (too early); told {display.visible(me['name'])}."
            assert set(json.loads(cli(env, "decide", "x", "y", "--scope", "all", "--json").stdout)) == {
                "decision", "deliveredTo"}
            assert set(json.loads(cli(env, "retract", "x", "--json").stdout)) == {"retraction", "notified"}


def test_exit_codes_and_help(env, home):
    # status: 3 with no broker, as service managers do; --json too
    none = run_cli(env, "status")
    assert none.returncode == 3 and "no broker running" in none.stdout
    assert run_cli(env, "status", "--json").returncode == 3
    # bad arguments: 2 everywhere, also for what the broker refuses; nothing is stored
    bad_scope = '{"folder": "/x"}'
    assert 'unknown key "folder"' in refused(run_cli(env, "decisions", "--scope", bad_scope))
    started = run_cli(env, "up", "--detach")
    try:
        assert started.returncode == 0, started.stderr
        assert "Ctrl-C" not in started.stdout  # it does nothing to a detached broker
        assert run_cli(env, "status").returncode == 0
        pid = json.loads((home / "broker.json").read_text())["pid"]
        again = run_cli(env, "up", "--detach")  # "make sure it is up"
        assert again.returncode == 0 and f"already running for {home} (pid {pid})" in again.stdout, again
        foreground = run_cli(env, "up")  # still refuses (SPEC §2)
        assert foreground.returncode == 1 and "already running" in foreground.stderr
        assert 'unknown key "folder"' in refused(run_cli(env, "decide", "t", "x", "--scope", bad_scope))
        assert "topic: must not be empty" in refused(run_cli(env, "decide", " ", "x"))
        assert "--gone-for" in refused(run_cli(env, "forget", "--gone-for", "soon"))
        assert "not both" in refused(run_cli(env, "forget"))
        line = refused(run_cli(env, "send", "nobody", "hi"))
        assert "`agent-bridge sessions`" in line and "peers" not in line
        assert run_cli(env, "decisions", "--json").stdout.strip() == "[]"
    finally:
        run_cli(env, "down")

    bare = subprocess.run(CLI, env=env, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 0 and bare.stdout.startswith("usage: agent-bridge") and "decide" in bare.stdout
    unknown = run_cli(env, "--frobnicate")
    assert unknown.returncode == 2 and "--frobnicate" in unknown.stderr
    for command in (
        "up",
        "down",
        "status",
        "mcp",
        "hook",
        "dashboard",
        "decisions",
        "install",
        "uninstall",
        "doctor",
        "decide",
        "send",
        "retract",
        "sessions",
        "forget",
        "demo",
    ):
        shown = run_cli(env, command, "--help").stdout
        body = shown.split("\n\n")
        assert len(body[1]) > 40 and not body[1].startswith(("positional", "options")), (command, shown)
        assert f"example:\n  {command_line(command)}" in shown, (command, shown)


def command_line(command: str) -> str:
    return "claude mcp add" if command == "mcp" else f"agent-bridge {command}"


@pytest.mark.slow
async def test_a_name_shared_by_gone_sessions_is_refused_with_the_candidates(env, home):
    broker = BrokerProcess(env, home).start()
    try:
        with trio.fail_after(180):
            ids = []
            for hsid in ("hs-old", "hs-new"):
                async with mcp_session(
                    env, "--agent", "codex", "--project", "/w/gone", "--host-session-id", hsid
                ) as s:
                    ids.append((await call(s, "whoami"))["id"])
                wait_until(
                    lambda: (
                        not any(x["connected"] for x in json.loads(run_cli(env, "sessions", "--json").stdout))
                    ),
                    what="the session to be gone",
                )
            listed = json.loads(run_cli(env, "sessions", "--json").stdout)
            assert sorted(x["name"] for x in listed) == ["codex-gone", "codex-gone"] and len(set(ids)) == 2

            for args in (("send", "codex-gone", "hi"), ("forget", "codex-gone")):
                line = refused(run_cli(env, *args))
                assert "'codex-gone' names 2 sessions" in line and all(i in line for i in ids), line
                assert "last seen" in line
            assert len(json.loads(run_cli(env, "sessions", "--json").stdout)) == 2  # nothing forgotten
            # nothing sent
            assert json.loads(run_cli(env, "sessions", "--json").stdout)[0]["unacknowledged"] == 0

            # exactly one of them connected: that one gets the message
            async with AsyncExitStack() as stack:
                back = await stack.enter_async_context(
                    mcp_session(
                        env, "--agent", "codex", "--project", "/w/gone", "--host-session-id", "hs-old"
                    )
                )
                assert (await call(back, "whoami"))["id"] == ids[0]
                sent = json.loads(run_cli(env, "send", "codex-gone", "to the live one", "--json").stdout)
                assert sent["message"]["to"]["id"] == ids[0] and sent["recipientConnected"] is True
            # an id names one
            done = run_cli(env, "forget", ids[1])
            assert done.returncode == 0 and f"Forgot codex-gone ({ids[1]})" in done.stdout
            assert [x["id"] for x in json.loads(run_cli(env, "sessions", "--json").stdout)] == [ids[0]]
    finally:
        broker.stop()

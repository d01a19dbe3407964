"""`agent-bridge hook session-start` with no broker running (SPEC §4.5):
the note comes straight from bridge.db; every failure exits 0 with no note and one log line."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from agent_bridge.common import domain, paths
from tests.hooks.conftest import build_db, hook_env, log_lines, note_of, run_hook

SID = "hs-7f3a"  # the host's session_id
HEAVY = (
    "trio",
    "mcp",
    "quart",
    "quart_trio",
    "hypercorn",
    "anyio",
    "pydantic",
    "starlette",
    "httpx",
    "tomlkit",
)


def payload(project: Path, **extra: object) -> dict[str, object]:
    return {"session_id": SID, "transcript_path": "/tmp/t.jsonl", "cwd": str(project),
            "hook_event_name": "SessionStart", "source": "startup", **extra}


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_note_shows_the_five_newest_applicable_topics_and_counts_the_rest(agent, hook_home, project):
    p = str(project)
    long_text = "Use PostgreSQL 16 for every service, " + "with logical replication and nightly dumps " * 8
    build_db(hook_home, [
        ("deploy", "Ship with Fly", {"project": "/work/other"}),            # another project: excluded
        ("lint", "ruff only", {"project": p + "/sub"}),                     # a subfolder: excluded
        ("license", "MIT for everything", "all"),                           # global: included
        ("review", "Ask codex-app before merging", {"sessions": [SID]}),    # addressed to this host session
        ("secret", "Not for you", {"sessions": ["someone-else"]}),          # addressed elsewhere: excluded
        ("camera", "Tap to look", {"project": p}),
        ("db", "SQLite", {"project": p}),
        ("db", "Moved away", {"project": "/work/other"}),                   # re-decided elsewhere: excluded
        ("p1", "one", {"project": p}),
        ("p2", long_text, {"project": p}),
        ("p3", "three", {"project": p}),
        ("camera", "Hold to look", {"project": p + "/"}),                   # supersedes; same folder
        ("p4", "four\n  with   spaces", {"project": p}),
    ])
    result = run_hook("session-start", agent, payload(project), hook_env(hook_home), cwd=project)
    lines = note_of(result).splitlines()

    assert lines[0].startswith("agent-bridge:") and f"{agent}-app" not in lines[0]  # no guessed name
    assert "MCP server connects" in lines[0] and lines[0].endswith("newest first:")
    shown = lines[1:-1]
    assert [s.split(":", 1)[0] for s in shown] == ["p4", "camera", "p3", "p2", "p1"]  # newest first
    assert shown[0] == "p4: four with spaces"
    assert shown[1] == "camera: Hold to look"
    cut = shown[3].removeprefix("p2: ")
    assert len(cut) == domain.NOTE_TEXT_MAX and cut.endswith("…") and long_text.startswith(cut[:-1])
    # The rest: review (addressed to this host session) and license (global); not deploy, lint,
    # secret, db, nor the superseded camera revision.
    assert lines[-1].startswith("2 more;") and "`decisions` tool" in lines[-1]
    assert not any(
        word in note_of(result) for word in ("Fly", "ruff", "Not for you", "SQLite", "Tap to look")
    )
    assert result.stderr == b""


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_global_and_session_addressed_decisions_are_in_the_note(agent, hook_home, project):
    p = str(project)
    build_db(
        hook_home,
        [
            ("license", "MIT for everything", "all"),
            ("deploy", "Ship with Fly", {"project": "/work/other"}),
            ("review", "Ask before merging", {"sessions": ["claude-app"]}),  # the known session's name
            ("camera", "Hold to look", {"project": p}),
        ],
        peers=[
            {
                "agent": agent,
                "name": "claude-app",
                "project": p,
                "kind": "interactive",
                "host_session_id": SID,
            }
        ],
    )
    result = run_hook("session-start", agent, payload(project), hook_env(hook_home), cwd=project)
    note = note_of(result)
    lines = note.splitlines()
    conn = apsw.Connection(str(paths.db_path(hook_home)), flags=apsw.SQLITE_OPEN_READONLY)
    peer_id = conn.execute("SELECT id FROM peers WHERE host_session_id = ?", (SID,)).fetchone()[0]
    conn.close()
    assert lines[0].startswith("agent-bridge: you are claude-app.")  # the known session's address
    assert peer_id  # the session the note names is the one bridge.db holds for this host session
    assert lines[1:-1] == [
        "camera: Hold to look",
        "review: Ask before merging",
        "license: MIT for everything",
    ]
    assert "Fly" not in note
    assert lines[-1].startswith("No more;") and "`decisions` tool" in lines[-1]


def test_no_decisions_gives_the_identity_line_only(hook_home, project):
    build_db(hook_home, [("deploy", "Ship with Fly", {"project": "/work/other"})])
    note = note_of(run_hook("session-start", "codex", payload(project), hook_env(hook_home), cwd=project))
    assert note.count("\n") == 0 and "`whoami`" in note and "codex-app" not in note  # no guessed name
    # SPEC §4.5: which tools reach other sessions, named as Codex shows them.
    assert "mcp__agent_bridge tools `send`, `inbox`, `decisions`" in note and "not running" in note


def test_the_note_names_the_bridge_tools_as_claude_code_lists_them(hook_home, project):
    build_db(hook_home, [])
    note = note_of(run_hook("session-start", "claude", payload(project), hook_env(hook_home), cwd=project))
    assert "`mcp__agent-bridge__send`, `…inbox`, `…decisions`" in note and "SendMessage" in note
    # The plugin's hook (Claude Code gives it CLAUDE_PLUGIN_ROOT): the names of the plugin's server.
    env = {**hook_env(hook_home), "CLAUDE_PLUGIN_ROOT": str(project)}
    note = note_of(run_hook("session-start", "claude", payload(project), env, cwd=project))
    assert "`mcp__plugin_agent-bridge_agent-bridge__send`, `…inbox`, `…decisions`" in note


def test_ten_thousand_decisions_count_exactly(hook_home, project):
    p = str(project)
    build_db(
        hook_home, [(f"topic {i}", f"text {i}", {"project": p} if i % 2 else "all") for i in range(10_000)]
    )
    lines = note_of(run_hook("session-start", "claude", payload(project), hook_env(hook_home))).splitlines()
    assert [line.split(":")[0] for line in lines[1:-1]] == [
        "topic 9999", "topic 9998", "topic 9997", "topic 9996", "topic 9995"
    ]
    assert lines[-1].startswith("9995 more;")


def _newer_db(home: Path) -> None:
    build_db(home, [("camera", "Hold to look", "all")])
    conn = apsw.Connection(str(paths.db_path(home)))
    conn.execute("PRAGMA user_version = 99")
    conn.close()


def _garbage_db(home: Path) -> None:
    paths.ensure_home(home)
    paths.db_path(home).write_bytes(b"this is not a database, just some bytes " * 200)


BAD_INPUTS = {
    "not json": b"{session_id: nope",
    "empty": b"",
    "a list": b'["session_id"]',
    "no session id": json.dumps({"cwd": "/work/app", "source": "startup"}).encode(),
    "session id not a string": json.dumps({"session_id": 42, "cwd": "/work/app"}).encode(),
    "relative cwd": json.dumps({"session_id": SID, "cwd": "work/app"}).encode(),
    "not utf-8": b'{"session_id": "\xff\xfe"}',
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_malformed_input_exits_0_without_a_note_and_logs_one_line(case, hook_home, project):
    build_db(hook_home, [("camera", "Hold to look", "all")])
    before = log_lines(hook_home)
    result = run_hook("session-start", "claude", BAD_INPUTS[case], hook_env(hook_home), cwd=project)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    new = log_lines(hook_home)[len(before):]
    assert len(new) == 1 and "session-start (claude)" in new[0] and "no note" in new[0]


@pytest.mark.parametrize("breakage", ["no database", "newer database", "not a database"])
def test_database_problems_exit_0_without_a_note_and_log_one_line(breakage, hook_home, project):
    if breakage == "newer database":
        _newer_db(hook_home)
    elif breakage == "not a database":
        _garbage_db(hook_home)
    before = log_lines(hook_home)
    result = run_hook("session-start", "codex", payload(project), hook_env(hook_home), cwd=project)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    new = log_lines(hook_home)[len(before):]
    assert len(new) == 1 and "session-start (codex)" in new[0], new
    if breakage == "newer database":
        assert "schema version 99" in new[0]


def test_a_locked_database_exits_0_without_a_note_and_logs_one_line(hook_home, project):
    build_db(hook_home, [("camera", "Hold to look", "all")])
    db = str(paths.db_path(hook_home))
    holder = apsw.Connection(db)  # (not `with`: for APSW that is a transaction)
    try:
        holder.execute("PRAGMA journal_mode = DELETE")  # a rollback journal: a writer locks readers out
        holder.execute("BEGIN EXCLUSIVE")
        result = run_hook("session-start", "claude", payload(project), hook_env(hook_home), cwd=project)
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    lines = log_lines(hook_home)
    assert len(lines) == 1 and "database is locked" in lines[0], lines
    # Unlocked again: the same hook gives its note.
    assert "camera: Hold to look" in note_of(
        run_hook("session-start", "claude", payload(project), hook_env(hook_home))
    )


def test_a_stale_broker_record_still_gives_the_note(hook_home, project):
    build_db(hook_home, [("camera", "Hold to look", "all")])
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (hook_home / paths.BROKER_JSON).write_text(
        json.dumps({"pid": int(gone.stdout), "socket": str(hook_home / "x.sock")})
    )
    note = note_of(run_hook("session-start", "claude", payload(project), hook_env(hook_home), cwd=project))
    assert "camera: Hold to look" in note
    assert log_lines(hook_home) == []


def test_identity_report_is_left_for_the_next_broker(hook_home, project):
    build_db(hook_home, [])
    env = hook_env(hook_home, AGENT_BRIDGE_HOST_PID=str(os.getpid()))
    note_of(run_hook("session-start", "claude", payload(project, source="clear"), env, cwd=project))
    folder = hook_home / paths.REPORTS_DIR
    report_file = folder / (hashlib.sha256(SID.encode()).hexdigest()[:32] + ".json")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(report_file.stat().st_mode) == 0o600
    report = json.loads(report_file.read_text())
    assert set(report) == {"hostSessionId", "agent", "host", "chain", "cwd", "source", "event"}
    assert report["hostSessionId"] == SID and report["agent"] == "claude"
    assert report["event"] == "SessionStart" and report["source"] == "clear" and report["cwd"] == str(project)
    me = next(p for p in report["chain"] if p[0] == os.getpid())  # the hook's parent is this test
    assert report["host"] == {"pid": os.getpid(), "start": me[1], "exe": me[2]}

    # A Stop report replaces it, keeping the SessionStart source (a /clear stays a new identity).
    stop = run_hook(
        "stop", "claude", {"session_id": SID, "cwd": str(project), "stop_hook_active": False}, env
    )
    assert (stop.returncode, stop.stdout) == (0, b"")
    report = json.loads(report_file.read_text())
    assert report["event"] == "Stop" and report["source"] == "clear"
    assert sorted(os.listdir(folder)) == [report_file.name]  # written atomically: no temp files left


IMPORT_PROBE = """
import json, sys
from agent_bridge.cli.main import main
rc = main(["hook", sys.argv[1], "--agent", "claude"])
with open(sys.argv[2], "w") as f:
    json.dump({"rc": rc, "modules": sorted(sys.modules)}, f)
"""


@pytest.mark.parametrize("event", ["session-start", "stop"])
@pytest.mark.parametrize("broker_record", [False, True])
def test_hooks_import_no_heavy_packages(event, broker_record, hook_home, project, tmp_path):
    build_db(hook_home, [("camera", "Hold to look", "all")])
    if broker_record:  # a record whose broker is gone: the hook loads its socket client and finds no one
        gone = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        )
        (hook_home / paths.BROKER_JSON).write_text(
            json.dumps({"pid": int(gone.stdout), "socket": "/nonexistent"})
        )
    out = tmp_path / "modules.json"
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, event, str(out)],
        input=json.dumps(payload(project)).encode(), env=hook_env(hook_home), capture_output=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode()
    probe = json.loads(out.read_text())
    assert probe["rc"] == 0
    loaded = {name.split(".")[0] for name in probe["modules"]}
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))
    assert "agent_bridge.hooks.session_start" in probe["modules"] or event == "stop"
    if event == "session-start":
        assert b"Hold to look" in result.stdout

"""The UserPromptSubmit hook shows the owner's open questions (SPEC §4.6): the real hook command
(the installed `agent-bridge`, JSON on stdin, no broker running) over a bridge.db written by the
broker's own Store: once per question per host session, never in a job runner's or a scripted
session, never a question only this session asked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_bridge.common import paths
from agent_bridge.common.domain import SessionView
from agent_bridge.store.peers import CLI_AUTHOR
from agent_bridge.store.writer import Store
from tests.hooks.conftest import HOOK, hook_env

PROJECT = "/work/app"


def prompt(home: Path, session_id: str, agent: str = "claude", **env: str) -> dict | None:
    payload = {
        "session_id": session_id,
        "cwd": PROJECT,
        "hook_event_name": "UserPromptSubmit",
        "prompt": "go on",
    }
    done = subprocess.run(
        [*HOOK, "hook", "user-prompt-submit", "--agent", agent],
        input=json.dumps(payload),
        env=hook_env(home, **{"CLAUDE_CODE_ENTRYPOINT": "cli", **env}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def context(answer: dict | None) -> str:
    assert answer is not None
    assert answer["hookSpecificOutput"]["hookEventName"] == "UserPromptSubmit"
    return answer["hookSpecificOutput"]["additionalContext"]


def setup(home: Path) -> tuple[Store, dict[str, SessionView]]:
    paths.ensure_home(home)
    store = Store.open(paths.db_path(home))
    views = {}
    for name, agent, host, kind in (("claude-app", "claude", "h-owner", "interactive"),
                                    ("codex-app", "codex", "h-codex", "interactive"),
                                    ("codex-job", "codex", "h-job", "job")):
        p = store.create_peer(agent=agent, name=name, project=PROJECT, kind=kind, host_session_id=host, now=1)
        views[name] = SessionView(p.id, p.name, PROJECT, host, kind)
    return store, views


def ask(store: Store, who: SessionView, question: str, **more):
    q, _ = store.ask_question(asker=who, asker_agent=who.name.split("-")[0], question=question,
                              topic=more.get("topic"), options=more.get("options", []),
                              scope={"project": PROJECT}, caller_addresses=who.addresses, now=10)
    assert q is not None
    return q


def test_open_questions_are_shown_once_per_host_session(tmp_path):
    home = tmp_path / "home"
    store, v = setup(home)
    try:
        mine = ask(store, v["claude-app"], "Only I asked this?")
        theirs = ask(store, v["codex-job"], "Which database?", topic="db", options=["PostgreSQL", "SQLite"])
    finally:
        store.close()
    note = context(prompt(home, "h-owner"))
    assert note.startswith("Open questions from your other sessions:")
    assert "not from the user" in note and "agent-bridge answer" in note
    assert (
        f"- {theirs.id} from codex-job (codex) [topic: db]: Which database? Options: 1. PostgreSQL; 2. SQLite"
        in note
    )
    assert mine.id not in note  # asked by this session only
    assert prompt(home, "h-owner") is None  # once
    assert mine.id in context(prompt(home, "h-codex"))  # another session: both, once
    assert prompt(home, "h-codex") is None

    store = Store.open(paths.db_path(home))
    try:
        later = ask(store, v["codex-app"], "May I delete build/?")
        joined = ask(store, v["codex-app"], "Only I asked this?")  # joins: now not only the owner's own
        store.answer_question(question_id=theirs.id, author=CLI_AUTHOR, topic="db", text="PostgreSQL",
                              scope={"project": PROJECT}, recipients=[], now=20)
    finally:
        store.close()
    assert joined.id == mine.id
    note = context(prompt(home, "h-owner"))
    assert later.id in note and mine.id in note and theirs.id not in note
    shown = json.loads(next((home / paths.PROMPTED_DIR).iterdir()).read_text())
    assert set(shown) == {"shown"}
    assert prompt(home, "h-owner") is None


def test_no_questions_for_jobs_scripts_or_without_a_database(tmp_path):
    home = tmp_path / "home"
    assert prompt(home, "h-owner") is None  # no database at all
    store, v = setup(home)
    try:
        ask(store, v["codex-app"], "Which database?")
    finally:
        store.close()
    assert prompt(home, "h-job", agent="codex") is None  # a job runner's session
    assert prompt(home, "h-owner", CLAUDE_CODE_ENTRYPOINT="sdk-cli") is None  # claude -p: a script typed it
    # a session not known yet: shown
    assert "Which database?" in context(prompt(home, "h-unknown", agent="codex"))
    assert "Which database?" in context(prompt(home, "h-owner"))


def test_many_questions_come_five_at_a_time(tmp_path):
    home = tmp_path / "home"
    store, v = setup(home)
    try:
        ids = [ask(store, v["codex-app"], f"Question {i}?").id for i in range(7)]
    finally:
        store.close()
    first = context(prompt(home, "h-owner"))
    assert [i for i in ids if i in first] == ids[:5] and "(2 more" in first
    second = context(prompt(home, "h-owner"))
    assert [i for i in ids if i in second] == ids[5:]
    assert prompt(home, "h-owner") is None


def test_the_hook_imports_no_heavy_packages(tmp_path):
    from tests.hooks.test_session_start import HEAVY, IMPORT_PROBE

    home = tmp_path / "home"
    store, v = setup(home)
    try:
        ask(store, v["codex-app"], "Which database?")
    finally:
        store.close()
    out = tmp_path / "modules.json"
    payload = {"session_id": "h-owner", "cwd": PROJECT, "hook_event_name": "UserPromptSubmit", "prompt": "hi"}
    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE, "user-prompt-submit", str(out)],
                          input=json.dumps(payload), env=hook_env(home, CLAUDE_CODE_ENTRYPOINT="cli"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Which database?" in done.stdout  # the questions were read: the path under test ran
    loaded = {name.split(".")[0] for name in json.loads(out.read_text())["modules"]}
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))

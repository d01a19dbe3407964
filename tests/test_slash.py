"""`agent-bridge slash NAME` (what the slash commands install writes run, SPEC §4.6) and
`agent-bridge inbox`: the typed arguments arrive on stdin as typed and become the ordinary
command's line; no shell reads them. Run as the owner runs them: real processes, a real
bridge.db. The slash commands inside a real Claude Code are in tests/hosts/test_slash_commands.py."""

from __future__ import annotations

import json
from pathlib import Path

import apsw
import pytest

from agent_bridge.common import paths
from agent_bridge.hosts import slash
from agent_bridge.store.writer import Store
from tests.conftest import run_cli

TRICKY = "use make, not \"cmake\"; it's $(touch pwned) `id` $HOME <<EOF"


@pytest.mark.parametrize(
    ("name", "typed", "expected"),
    [
        ("send", "codex-app please rebase", ["send", "--", "codex-app", "please rebase"]),
        ("send", f"codex-app {TRICKY}", ["send", "--", "codex-app", TRICKY]),
        ("send", "--json -x  two  spaces ", ["send", "--", "--json", "-x  two  spaces"]),
        ("decide", '"build system" make\nonly', ["decide", "--", "build system", "make\nonly"]),
        ("decide", "'db' PostgreSQL 16", ["decide", "--", "db", "PostgreSQL 16"]),
        ("answer", "0199ab --option 2", ["answer", "--option=2", "--", "0199ab"]),
        ("answer", "0199ab --decline not now", ["answer", "--decline=not now", "--", "0199ab"]),
        ("answer", "0199ab --decline 'not now'", ["answer", "--decline=not now", "--", "0199ab"]),
        ("answer", "0199ab Redis, as planned", ["answer", "--", "0199ab", "Redis, as planned"]),
        ("questions", "--all", ["questions", "--all"]),
        ("questions", "", ["questions"]),
        ("inbox", "  \n", ["inbox"]),
        ("jobs", "cancel 'codex-job-1a2b'", ["jobs", "cancel", "codex-job-1a2b"]),
    ],
)
def test_what_was_typed_becomes_the_commands_line(name: str, typed: str, expected: list[str]) -> None:
    assert slash.argv(name, typed) == expected


@pytest.mark.parametrize(
    ("name", "typed", "error"),
    [
        ("send", "", "give the recipient first"),
        ("send", "codex-app", "usage: /agent-bridge:send TO TEXT"),
        ("decide", '"build system make', 'the topic: the closing " is missing'),
        ("answer", "", "give the question's id first"),
        ("answer", "0199ab", "usage: /agent-bridge:answer"),
        ("answer", "0199ab --option two", "--option takes the option's number (from 1), not 'two'"),
        ("questions", "--all 'x", "cannot read"),
        ("retract", "db", "no slash command 'retract'"),
    ],
)
def test_what_cannot_be_a_command_line_is_refused_in_one_line(name: str, typed: str, error: str) -> None:
    with pytest.raises(slash.SlashError) as caught:
        slash.argv(name, typed)
    assert error in str(caught.value) and "\n" not in str(caught.value)


def test_the_typed_text_reaches_the_decision_verbatim_and_no_shell_runs_it(env, home, tmp_path) -> None:
    done = run_cli(env, "slash", "decide", input=f'"build system" {TRICKY}\n')
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Recorded build system for project ")  # decide's own summary
    listed = run_cli(env, "decisions", "build system", "--json")
    (decision,) = json.loads(listed.stdout)
    assert decision["text"] == TRICKY
    assert not list(tmp_path.rglob("pwned"))


def test_bad_input_is_one_line_exit_2_and_nothing_is_stored(env, home) -> None:
    for name, typed in (("decide", "db"), ("send", ""), ("answer", "x --option two")):
        done = run_cli(env, "slash", name, input=typed)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert not paths.db_path(home).exists()  # nothing ran that stores
    done = run_cli(env, "slash", "decide", input="x" * (slash.ARGS_MAX + 1))
    assert done.returncode == 2 and "longer than 20,000 characters" in done.stderr


def test_an_unfilled_placeholder_is_no_arguments(env, home) -> None:
    done = run_cli(env, "slash", "questions", input="$ARGUMENTS\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "No open questions.\n"


def _message_to_owner(home: Path, text: str) -> None:
    """A session's message to the owner, as the broker stores it (`send` to "owner")."""
    paths.ensure_home(home)
    Store.open(paths.db_path(home)).close()
    conn = apsw.Connection(str(paths.db_path(home)))
    with conn:
        conn.execute("INSERT OR IGNORE INTO peers(id, name, agent, project, kind, created_at, last_seen_at) "
                     "VALUES ('cli', 'cli', 'cli', '', 'job', 1, 1)")
        conn.execute("INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at) "
                     "VALUES ('p1', 'codex-app', 'codex', '/w', 'interactive', 1, 1)")
        conn.execute("INSERT INTO messages(id, from_peer, to_peer, body, hop, created_at) "
                     "VALUES ('m1', 'p1', 'cli', ?, 1, 1796300000000)", (text,))
    conn.close()


def test_inbox_lists_the_messages_to_the_owner_with_the_broker_down(env, home) -> None:
    done = run_cli(env, "inbox")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "No messages to the owner yet.\n"
    assert not paths.db_path(home).exists()  # read-only: nothing created

    _message_to_owner(home, "tests pass;\nmerge?")
    done = run_cli(env, "slash", "inbox", input="")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("m1  from codex-app (codex)  ")
    assert lines[1] == "    tests pass; merge?"
    (item,) = json.loads(run_cli(env, "inbox", "--json").stdout)
    assert item["from"] == {"id": "p1", "name": "codex-app", "agent": "codex"}
    assert item["text"] == "tests pass;\nmerge?" and item["createdAt"] == 1796300000000
    assert paths.running_broker(home) is None

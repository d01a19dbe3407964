"""`agent-bridge search QUERY [--json]` (SPEC §2, §4.6 "Search") as a real command-line run: what a
real broker recorded is found with the broker up and after it is down (read-only: it never starts
one), human lines with agents' control characters made visible, the same results as JSON, and one
clear line for a bad query or a database from before the search index."""

from __future__ import annotations

import json
from pathlib import Path

import apsw

from agent_bridge.common import paths
from agent_bridge.store.messages import Outgoing
from agent_bridge.store.schema import STEPS, V_SEARCH
from agent_bridge.store.writer import Store
from tests.conftest import BrokerProcess, run_cli

ESC = "\x1b]0;pwned\x07\x1b[2J"


def sessions_and_a_message(home: Path) -> tuple[str, str]:
    """Two sessions and one message between them, written by the broker's own Store (no broker
    runs yet); returns (the message's id, the recipient's name)."""
    paths.ensure_home(home)
    store = Store.open(paths.db_path(home))
    try:
        a = store.create_peer(agent="claude", name="claude-app", project="/w/app", kind="interactive",
                              host_session_id=None, now=1_000)
        b = store.create_peer(agent="codex", name=f"codex-app{ESC}", project="/w/app", kind="interactive",
                              host_session_id=None, now=1_000)
        text = f"the flamingo deploy {ESC}is green"
        [m] = store.send_messages(a.id, [Outgoing(b.id, text, 1, None)], 2_000)
    finally:
        store.close()
    return m.id, b.name


def test_search_finds_what_the_broker_recorded_with_the_broker_up_and_down(env, home: Path) -> None:
    message_id, recipient = sessions_and_a_message(home)
    broker = BrokerProcess(env, home).start()
    try:
        decided = run_cli(env, "decide", "deploys", "Flamingo deploys go out on Tuesdays", "--scope", "all",
                          "--json")
        assert decided.returncode == 0, decided.stderr
        decision_id = json.loads(decided.stdout)["decision"]["id"]
        up = run_cli(env, "search", "flamingo", "--json")
        assert up.returncode == 0, up.stderr
        assert [(r["kind"], r["id"]) for r in json.loads(up.stdout)["results"]] == [
            ("decision", decision_id), ("message", message_id)]
    finally:
        assert broker.stop() == 0
    assert paths.running_broker(home) is None
    down = run_cli(env, "search", "FLAMINGO", "--json")
    assert down.returncode == 0, down.stderr
    found = json.loads(down.stdout)
    assert found["query"] == "FLAMINGO" and found["more"] is False
    decision, message = found["results"]
    assert (decision["kind"], decision["id"], decision["topic"], decision["state"]) == (
        "decision", decision_id, "deploys", "current")
    assert decision["from"] == {"id": "cli", "name": "cli", "agent": "cli"}
    assert (message["id"], message["to"]["name"], message["createdAt"]) == (message_id, recipient, 2_000)
    assert message["snippet"] == f"the flamingo deploy {ESC}is green"  # JSON is the text as is
    assert [message["snippet"][s:e] for s, e in message["highlights"]] == ["flamingo"]
    human = run_cli(env, "search", "flamingo green")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    shown = "codex-app\\x1b]0;pwned\\x07\\x1b[2J"
    assert lines[0].endswith(f"message from claude-app to {shown}  id {message_id}")
    assert lines[1] == "    the flamingo deploy \\x1b]0;pwned\\x07\\x1b[2Jis green"
    assert "\x1b" not in human.stdout and len(lines) == 2
    both = run_cli(env, "search", "flamingo")
    assert f"decision deploys (current) by cli  id {decision_id}" in both.stdout.splitlines()[0]
    assert run_cli(env, "search", "pelican").stdout == "Nothing found.\n"
    assert paths.running_broker(home) is None  # searching never starts a broker


def test_a_bad_query_is_one_line_and_exit_2_and_stores_nothing(env, home: Path) -> None:
    sessions_and_a_message(home)
    before = paths.db_path(home).read_bytes()
    for query, says in (("", "at least one word"), ("!!! ???", "at least one word"),
                        ("x" * 513, "at most 512 characters")):
        done = run_cli(env, "search", query)
        assert done.returncode == 2 and done.stdout == "", done
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("agent-bridge search: query: ")
        assert says in done.stderr and "Traceback" not in done.stderr
    # FTS5's own syntax is plain text here, never an error.
    for query in ('"unbalanced', "NEAR(a b", "a OR", "body:x", "a*b", "x AND NOT"):
        done = run_cli(env, "search", query, "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["results"] == [], done
    assert paths.db_path(home).read_bytes() == before


def test_a_database_from_before_the_index_is_one_clear_line(env, home: Path) -> None:
    paths.ensure_home(home)
    conn = apsw.Connection(str(paths.db_path(home)))
    for step in STEPS[: STEPS.index(V_SEARCH)]:
        conn.execute(step)
    conn.close()
    done = run_cli(env, "search", "anything")
    assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1, done
    assert "has no search index yet" in done.stderr and "agent-bridge up --detach" in done.stderr
    with apsw.Connection(str(paths.db_path(home))) as conn:  # the reader did not upgrade it
        assert conn.execute("PRAGMA user_version").fetchone()[0] == STEPS.index(V_SEARCH)


def test_no_database_yet_finds_nothing(env, home: Path) -> None:
    done = run_cli(env, "search", "anything", "--json")
    assert done.returncode == 0 and json.loads(done.stdout) == {"query": "anything", "results": [],
                                                               "more": False}
    assert not paths.db_path(home).exists()

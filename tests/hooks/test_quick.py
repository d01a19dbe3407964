"""The PostToolUse hook as `install` registers it where it names this machine's interpreter:
`python -I -S .../agent_bridge/hooks/quick.py post-tool-use --agent HOST`, whose first look is
the broker's post box (`<home>/pending/`, broker.feeds.postbox) instead of bridge.db."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import agent_bridge
from agent_bridge.common import paths
from agent_bridge.hooks import quick
from agent_bridge.ipc.client import open_bridge_client
from tests.conftest import wait_for
from tests.hooks.conftest import hook_env
from tests.hooks.test_post_tool_use import acked, context_of, post_input

QUICK = Path(agent_bridge.__file__).parent / "hooks" / "quick.py"
INTERPRETER = sys.executable


def run_quick(agent: str, payload: Any, env: dict[str, str], cwd: Path,
              *options: str) -> subprocess.CompletedProcess[bytes]:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return subprocess.run([INTERPRETER, *options, "-I", "-S", str(QUICK), "post-tool-use", "--agent", agent],
                          input=raw, env=env, cwd=cwd, capture_output=True, timeout=60)


@asynccontextmanager
async def recipient_and_sender(home: Path, project: Path, host_session_id: str) -> AsyncIterator[Any]:
    """Once the broker keeps the post box: a bridge-protocol session of `project` known by
    `host_session_id` and one to send from, as (its client, its pushes, the sender's client)."""
    ready = home / paths.PENDING_DIR / paths.PENDING_READY
    await wait_for(lambda: trio.to_thread.run_sync(ready.exists), what="the box kept")
    record = paths.read_broker_json(home)
    async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                     "hostSessionId": host_session_id}) as (rx, pushes), \
            open_bridge_client(record["socket"], {"agent": "codex", "project": "/w/s",
                                                  "hostSessionId": "hs-sender"}) as (tx, _):
        yield rx, pushes, tx


@pytest.mark.parametrize("env", [
    {"AGENT_BRIDGE_HOME": "/srv/bridge"},
    {"AGENT_BRIDGE_HOME": "~/bridge"},
    {"AGENT_BRIDGE_HOME": "relative/bridge"},
    {"XDG_STATE_HOME": "/xdg/state"},
    {},
])
def test_the_script_finds_the_home_folder_as_the_package_does(env, monkeypatch):
    for key in ("AGENT_BRIDGE_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert Path(quick.home()) == paths.home()


@pytest.mark.parametrize("sid", ["8f2d6c1e-5b7a-4c3d-9e0f-1a2b3c4d5e6f", "thread ü 1", "x"])
def test_the_script_names_the_sessions_file_as_the_package_does(sid):
    assert quick.digest(sid) == paths.host_session_digest(sid)
    raw = json.dumps({"session_id": sid, "cwd": "/w", "hook_event_name": "PostToolUse"}, ensure_ascii=False)
    assert quick.session_id(raw.encode()) == sid
    escaped = json.dumps({"session_id": sid}).encode()  # "\u00fc": an escape, left to the whole hook
    assert quick.session_id(escaped) == (sid if sid.isascii() else None)
    assert quick.session_id(json.dumps({"session_id": sid}, ensure_ascii=False, indent=2).encode()) == sid


@pytest.mark.parametrize("raw", [
    b"not json",
    b'{"session_id": 3}',
    b'{"session_id": ""}',
    b'{"session_id": "a\\"b"}',  # an escape: left to the whole hook
    # a second "session_id" (a tool's input naming one): which is the session's is the JSON parser's to say
    b'{"tool_input": {"session_id": "other"}, "session_id": "mine"}',
])
def test_an_input_the_script_cannot_read_simply_goes_to_the_whole_hook(raw):
    assert quick.session_id(raw) is None and not quick.nothing_waits(raw)


def test_a_tool_response_that_quotes_a_session_id_does_not_confuse_it():
    raw = json.dumps({"session_id": "mine", "tool_response": {"stdout": '{"session_id": "other"}'}}).encode()
    assert quick.session_id(raw) == "mine"


async def test_the_post_box_follows_the_messages_and_the_script_follows_the_post_box(broker, home, project):
    """A send's answer comes once the recipient's file is in the post box; the script then runs
    the whole hook, which hands the message over; the acknowledgement takes the file away again;
    with no file and the box kept, the script says nothing and opens no database."""
    env = hook_env(home)
    with trio.fail_after(120):
        async with recipient_and_sender(home, project, "hs-quick") as (_, _pushes, tx):
            mark = paths.pending_path(home, "hs-quick")
            assert not mark.exists()
            idle = await trio.to_thread.run_sync(
                lambda: run_quick("claude", post_input("hs-quick", project), env, project, "-X", "importtime")
            )
            assert (idle.returncode, idle.stdout) == (0, b"")
            imported = {line.split("|")[-1].strip() for line in idle.stderr.decode().splitlines()}
            assert not {"agent_bridge", "apsw", "sqlite3", "json", "site", "os"} & imported, sorted(imported)
            sent = await tx.request("send", to="hs-quick", text="between your tool calls")
            assert mark.exists()  # the send's answer waited for the post box
            result = await trio.to_thread.run_sync(
                lambda: run_quick("claude", post_input("hs-quick", project), env, project))
            assert "between your tool calls" in context_of(result)
            assert acked(home, [sent["message"]["id"]])[0] is not None
            await wait_for(lambda: trio.to_thread.run_sync(lambda: not mark.exists()), what="the file gone")


async def test_a_post_box_that_cannot_be_written_fails_no_send(broker, home, project):
    """A send's message is committed before its recipient's file is added: a file that cannot
    be written (here the box is a file, not a folder) is the box's next pass's to try again,
    never an error for a message that is stored (its sender would send it twice)."""
    with trio.fail_after(120):
        async with recipient_and_sender(home, project, "hs-boxless") as (rx, pushes, tx):
            box = home / paths.PENDING_DIR
            for child in box.iterdir():
                child.unlink()
            box.rmdir()
            box.write_text("in the way")
            sent = await tx.request("send", to="hs-boxless", text="stored, whatever the box")
            async for frame in pushes:
                if frame.get("push") == "message":
                    assert frame["message"]["id"] == sent["message"]["id"]
                    break
            assert len(await tx.request("sent", ids=[sent["message"]["id"]])) == 1
            assert (await rx.request("whoami"))["name"]  # the broker goes on serving


async def test_a_starting_broker_brings_the_post_box_up_to_date(broker, home, project):
    """Files a previous broker left for sessions with nothing waiting go; a session with a
    message waiting gets its file back; `ready` is there once the broker is."""
    with trio.fail_after(120):
        record = paths.read_broker_json(home)
        async with open_bridge_client(record["socket"], {"agent": "claude", "project": str(project),
                                                         "hostSessionId": "hs-waits"}), \
                open_bridge_client(record["socket"], {"agent": "codex", "project": "/w/s",
                                                      "hostSessionId": "hs-sender"}) as (tx, _):
            await tx.request("send", to="hs-waits", text="still there after the restart")
    assert await trio.to_thread.run_sync(broker.stop) == 0
    waits, stale = paths.pending_path(home, "hs-waits"), paths.pending_path(home, "hs-nothing")
    waits.unlink()
    stale.touch()
    await trio.to_thread.run_sync(broker.start)
    assert waits.exists() and not stale.exists()
    assert (home / paths.PENDING_DIR / paths.PENDING_READY).exists()


@pytest.mark.parametrize("kept", [False, True])
def test_without_a_kept_post_box_the_script_looks_in_the_database(kept, hook_home, project):
    """A message waits in bridge.db and no broker runs. Without `ready` (no broker keeps the box,
    or one is starting) the whole hook looks, finds it and, with no broker to hand it over
    through, leaves its identity report for the next one, as before. With `ready` and no file for
    the session, the script trusts the box: no report, nothing opened."""
    from agent_bridge.store.messages import Outgoing
    from agent_bridge.store.writer import Store
    from tests.hooks.conftest import build_db

    (me,) = build_db(hook_home, [], peers=[{"agent": "claude", "name": "claude-app", "project": str(project),
                                            "kind": "interactive", "host_session_id": "hs-db"}])
    store = Store.open(paths.db_path(hook_home))
    try:
        sender = store.create_peer(agent="codex", name="codex-s", project="/w/s", kind="interactive",
                                   host_session_id="hs-s", now=3)
        store.send_messages(sender.id, [Outgoing(me.id, "waiting in the database", 1, None)], now=4)
    finally:
        store.close()
    if kept:
        (hook_home / paths.PENDING_DIR).mkdir(mode=0o700)
        (hook_home / paths.PENDING_DIR / paths.PENDING_READY).touch()
    result = run_quick("claude", post_input("hs-db", project), hook_env(hook_home), project)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert (hook_home / paths.REPORTS_DIR).exists() is not kept

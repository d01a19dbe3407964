"""Conversations agents can rely on (SPEC §3, §5), through real MCP stdio sessions and a real
broker: `send` with a `message_id` (a retry stores, queues and wakes nothing), `to` as an agent
kind or `*`, the `sent` tool's receipts (and `wait_seconds`), and `peers`' busy/idle/offline
state from the hooks' marks."""

from __future__ import annotations

import json
import subprocess
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.store import reader
from tests.conftest import CLI, call, call_error, mcp_session, wait_for
from tests.hooks.conftest import hook_env, run_hook

pytestmark = pytest.mark.slow

TIMEOUT = 120


def rows(home: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with reader.reading(home / "bridge.db") as conn:
        return [tuple(r) for r in conn.execute(sql, args)]


async def session(stack: AsyncExitStack, env: dict[str, str], agent: str, name: str, project: str) -> Any:
    args = ("--agent", agent, "--name", name, "--project", project, "--host-session-id", f"hs-{name}")
    return await stack.enter_async_context(mcp_session(env, *args))


async def read_all(s: Any, count: int) -> list[dict[str, Any]]:
    """Take `count` messages from the inbox (waiting for them), then check nothing more waits."""
    got: list[dict[str, Any]] = []
    with trio.fail_after(30):
        while len(got) < count:
            got += await call(s, "inbox", wait_seconds=5)
    assert await call(s, "inbox", peek=True) == []
    return got


# --- safe retry -----------------------------------------------------------------------------


async def test_a_retry_with_the_same_message_id_returns_the_stored_message_and_sends_nothing(
    broker, env, home
):
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            a = await session(stack, env, "claude", "alice", "/w/retry")
            b = await session(stack, env, "codex", "bob", "/w/retry")
            mid = str(uuid.uuid4())
            first = await call(a, "send", to="bob", text="deploy is green", message_id=mid)
            assert first["message"]["id"] == mid and "duplicate" not in first
            assert first["recipientConnected"] is True
            # the same id written another way (upper case, no hyphens) is the same id
            written_otherwise = mid.upper().replace("-", "")
            again = await call(a, "send", to="bob", text="deploy is green", message_id=written_otherwise)
            assert again["duplicate"] is True
            assert again["message"] == first["message"] and again["recipientConnected"] is True
            # another address of the same recipient is the same send
            b_id = (await call(b, "whoami"))["id"]
            by_id = await call(a, "send", to=b_id, text="deploy is green", message_id=mid)
            assert by_id["duplicate"] is True and by_id["message"]["id"] == mid
            assert rows(home, "SELECT count(*) FROM messages WHERE send_id = ?", mid) == [(1,)]
            assert rows(home, "SELECT count(*) FROM receipts WHERE message_id = ?", mid) == [(1,)]
            assert [m["id"] for m in await read_all(b, 1)] == [mid]  # queued once, shown once
            # after it was read, a retry still returns it and queues nothing
            late = await call(a, "send", to="bob", text="deploy is green", message_id=mid)
            assert late["duplicate"] is True
            assert await call(b, "inbox", peek=True) == []


async def test_a_message_id_reused_for_another_text_or_recipient_is_refused(broker, env, home):
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            a = await session(stack, env, "claude", "ann", "/w/reuse")
            await session(stack, env, "codex", "ben", "/w/reuse")
            await session(stack, env, "codex", "cid", "/w/reuse")
            c = await session(stack, env, "claude", "cat", "/w/reuse")
            mid = str(uuid.uuid4())
            await call(a, "send", to="ben", text="one", message_id=mid)
            before = rows(home, "SELECT count(*) FROM messages")
            other_text = await call_error(a, "send", to="ben", text="two", message_id=mid)
            assert "message_id" in other_text and "another text" in other_text and "\n" not in other_text
            other_to = await call_error(a, "send", to="cid", text="one", message_id=mid)
            assert "message_id" in other_to and "'ben'" in other_to and "'cid'" in other_to
            assert "message_id" in await call_error(a, "send", to="*", text="one", message_id=mid)
            # another session's message already has that id
            taken = await call_error(c, "send", to="ben", text="one", message_id=mid)
            assert "already another message's id" in taken
            for bad in ("msg-1", "", "0f8fad5b-d9cb-469f-a165-70867728950", 7, True, ["x"]):
                error = await call_error(a, "send", to="ben", text="x", message_id=bad)
                assert "message_id" in error and "\n" not in error, error
            assert rows(home, "SELECT count(*) FROM messages") == before


# --- addresses: an agent kind, or every session here --------------------------------------------


async def test_an_agent_kind_reaches_the_one_session_of_that_agent_in_the_project(broker, env, home):
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            a = await session(stack, env, "claude", "kim", "/w/kind")
            b = await session(stack, env, "codex", "lee", "/w/kind")
            elsewhere = await session(stack, env, "codex", "max", "/w/other")
            sent = await call(a, "send", to="codex", text="the Codex session here")
            assert sent["message"]["to"]["name"] == "lee"
            assert [m["text"] for m in await read_all(b, 1)] == ["the Codex session here"]
            assert await call(elsewhere, "inbox", peek=True) == []
            # the caller is never its own kind's one session
            none = await call_error(a, "send", to="claude", text="x")
            assert "no other claude session of /w/kind is connected" in none
            await session(stack, env, "codex", "ned", "/w/kind")
            before = rows(home, "SELECT count(*) FROM messages")
            several = await call_error(a, "send", to="codex", text="which one?")
            assert "2 codex sessions of /w/kind" in several and "lee" in several and "ned" in several
            assert rows(home, "SELECT count(*) FROM messages") == before


async def test_star_sends_one_message_to_every_other_connected_session_of_the_project(broker, env, home):
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            a = await session(stack, env, "claude", "ora", "/w/all")
            b = await session(stack, env, "codex", "pat", "/w/all")
            c = await session(stack, env, "claude", "quin", "/w/all")
            elsewhere = await session(stack, env, "codex", "rex", "/w/else")
            mid = str(uuid.uuid4())
            result = await call(a, "send", to="*", text="standup in 5", message_id=mid)
            assert result["recipients"] == ["pat", "quin"]
            assert [m["to"]["name"] for m in result["messages"]] == ["pat", "quin"]
            copies = {m["id"] for m in result["messages"]}
            assert len(copies) == 2 and mid not in copies  # each copy its own id
            assert [m["text"] for m in await read_all(b, 1)] == ["standup in 5"]
            assert [m["text"] for m in await read_all(c, 1)] == ["standup in 5"]
            assert await call(a, "inbox", peek=True) == [] and await call(elsewhere, "inbox", peek=True) == []
            # a retry returns both copies, stores and queues nothing
            again = await call(a, "send", to="*", text="standup in 5", message_id=mid)
            assert again["duplicate"] is True and again["messages"] == result["messages"]
            assert rows(home, "SELECT count(*) FROM messages WHERE send_id = ?", mid) == [(2,)]
            assert await call(b, "inbox", peek=True) == [] and await call(c, "inbox", peek=True) == []
            # `sent` finds both copies by the send's message_id
            assert {r["to"]["name"] for r in await call(a, "sent", ids=[mid])} == {"pat", "quin"}
            # hops per copy: a reply to a message at hop 1 is hop 2 in every copy
            reply = await call(b, "send", to="*", text="ok", reply_to=result["messages"][0]["id"])
            assert [(m["to"]["name"], m["hop"]) for m in reply["messages"]] == [("ora", 2), ("quin", 2)]


async def test_star_with_nobody_else_here_is_refused(broker, env, home):
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            a = await session(stack, env, "claude", "sol", "/w/alone")
            await session(stack, env, "codex", "tom", "/w/not-alone")
            error = await call_error(a, "send", to="*", text="anyone?")
            assert "reaches nobody" in error and "/w/alone" in error
            assert rows(home, "SELECT count(*) FROM messages") == [(0,)]


async def test_star_copies_are_passive_from_the_hop_limit(env, home):
    """Passive rules apply to each copy: with a hop limit of 2, a reply (hop 2) sent to `*`
    reaches every session but wakes none (its Stop hook hands nothing over)."""
    from tests.conftest import BrokerProcess

    broker = BrokerProcess(env, home).start({"AGENT_BRIDGE_HOP_LIMIT": "2"})
    try:
        with trio.fail_after(TIMEOUT):
            async with AsyncExitStack() as stack:
                a = await session(stack, env, "claude", "uma", "/w/hop")
                b = await session(stack, env, "codex", "val", "/w/hop")
                await session(stack, env, "codex", "wes", "/w/hop")
                first = (await call(b, "send", to="uma", text="q"))["message"]
                result = await call(a, "send", to="*", text="a", reply_to=first["id"])
                assert {m["hop"] for m in result["messages"]} == {2}
                stop = run_hook("stop", "codex", {"session_id": "hs-wes", "cwd": "/w/hop",
                                                  "hook_event_name": "Stop", "stop_hook_active": False},
                                hook_env(home))
                assert (stop.returncode, stop.stdout) == (0, b"")  # passive: not handed over
                assert [m["hop"] for m in await call(b, "inbox", peek=True)] == [2]  # but readable
    finally:
        broker.kill()


# --- the sender's receipts ------------------------------------------------------------------


async def test_sent_follows_a_message_from_queued_to_acknowledged_with_its_replies(broker, env, home):
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            a = await session(stack, env, "claude", "ada", "/w/sent")
            b = await session(stack, env, "codex", "bo", "/w/sent")
            first = (await call(a, "send", to="bo", text="question one"))["message"]
            second = (await call(a, "send", to="bo", text="question two"))["message"]
            listed = await call(a, "sent")
            assert [r["id"] for r in listed] == [second["id"], first["id"]]  # newest first
            assert listed[1] == {
                "id": first["id"], "to": first["to"], "kind": "message", "text": "question one",
                "replyTo": None, "createdAt": first["createdAt"], "state": "queued", "shownAt": None,
                "acknowledgedAt": None, "woken": None, "replies": [],
            }
            assert await call(b, "sent") == []  # only the caller's own
            await read_all(b, 2)

            async def acknowledged() -> bool:
                return all(r["state"] == "acknowledged" for r in await call(a, "sent"))

            await wait_for(acknowledged, what="both acknowledged once the inbox result was written")
            (one,) = await call(a, "sent", ids=[first["id"]])
            assert one["shownAt"] is not None and one["shownAt"] <= one["acknowledgedAt"]
            reply = (await call(b, "send", to="ada", text="answer", reply_to=first["id"]))["message"]
            (one,) = await call(a, "sent", ids=[first["id"]])
            assert one["replies"] == [reply["id"]]
            long = (await call(a, "send", to="bo", text="x" * 500))["message"]
            (cut,) = await call(a, "sent", ids=[long["id"]])
            assert len(cut["text"]) == 120 and cut["text"].endswith("…")


async def test_sent_refuses_bad_arguments_and_ids_the_caller_did_not_send(broker, env, home):
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            a = await session(stack, env, "claude", "cy", "/w/sentbad")
            b = await session(stack, env, "codex", "dee", "/w/sentbad")
            theirs = (await call(b, "send", to="cy", text="mine"))["message"]
            assert "this session sent no message" in await call_error(a, "sent", ids=[theirs["id"]])
            assert "this session sent no message" in await call_error(a, "sent", ids=["nope"])
            for args in ({"wait_seconds": 51}, {"wait_seconds": -1}, {"wait_seconds": "5"},
                         {"wait_seconds": True}, {"ids": []}, {"ids": "x"}, {"ids": [1]},
                         {"ids": ["x"] * 101}, {"peek": True}):
                error = await call_error(a, "sent", **args)
                assert "\n" not in error, error


async def test_sent_wait_seconds_returns_when_a_message_changes(broker, env, home):
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            a = await session(stack, env, "claude", "eve", "/w/wait")
            b = await session(stack, env, "codex", "fay", "/w/wait")
            sent = (await call(a, "send", to="fay", text="ping"))["message"]
            changed: list[Any] = []

            async def wait() -> None:
                changed.append(await call(a, "sent", ids=[sent["id"]], wait_seconds=50))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await trio.testing.wait_all_tasks_blocked()
                assert changed == []
                await read_all(b, 1)  # the recipient reads it
            # answered long before 50 s (the fail_after guard), with the change
            ((r,),) = changed
            assert r["state"] == "acknowledged"

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await trio.testing.wait_all_tasks_blocked()
                await call(b, "send", to="eve", text="pong", reply_to=sent["id"])  # a reply
            assert len(changed[1][0]["replies"]) == 1
            # nothing changes: it answers when the time is up, as it was
            assert await call(a, "sent", ids=[sent["id"]], wait_seconds=0.2) == changed[1]


async def test_the_command_line_sends_by_kind_and_shows_its_receipts(broker, env, home, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            b = await session(stack, env, "codex", "gus", str(project))
            mid = str(uuid.uuid4())
            out = await trio.to_thread.run_sync(
                lambda: _cli(env, project, "send", "codex", "hello", "--message-id", mid))
            assert out.returncode == 0 and mid in out.stdout and "gus" in out.stdout, out.stderr
            again = await trio.to_thread.run_sync(
                lambda: _cli(env, project, "send", "codex", "hello", "--message-id", mid, "--json"))
            assert json.loads(again.stdout)["duplicate"] is True
            await read_all(b, 1)

            def receipts() -> list[dict[str, Any]]:
                return json.loads(_cli(env, project, "sent", mid, "--json").stdout)

            async def acknowledged() -> bool:
                return (await trio.to_thread.run_sync(receipts))[0]["state"] == "acknowledged"

            await wait_for(acknowledged, what="the owner's message acknowledged")
            people = await trio.to_thread.run_sync(lambda: _cli(env, project, "sent"))
            assert people.returncode == 0 and f"{mid}  to gus  acknowledged" in people.stdout
            unknown = await trio.to_thread.run_sync(lambda: _cli(env, project, "sent", "no-such-id"))
            assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
            star = await trio.to_thread.run_sync(lambda: _cli(env, project, "send", "*", "all of you"))
            assert star.returncode == 0 and "Sent to gus" in star.stdout
            alone = await trio.to_thread.run_sync(lambda: _cli(env, tmp_path, "send", "*", "nobody"))
            assert alone.returncode == 2 and "reaches nobody" in alone.stderr


def _cli(env: dict[str, str], cwd: Path, *args: str) -> Any:
    return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


# --- session state ---------------------------------------------------------------------------


async def test_peers_and_sessions_carry_busy_idle_and_offline_from_the_hooks_marks(
    broker, env, home, tmp_path
):
    with trio.fail_after(TIMEOUT):
        async with AsyncExitStack() as stack:
            a = await session(stack, env, "claude", "hal", "/w/state")

            async def state_of(name: str) -> tuple[Any, Any]:
                (p,) = [p for p in await call(a, "peers") if p["name"] == name]
                return p["state"], p["stateSince"]

            # Claude Code 2.1.332 in its TUI (by its transcript and entrypoint): its hooks keep the marks
            transcript = tmp_path / "t.jsonl"
            transcript.write_text(json.dumps({"type": "assistant", "version": "2.1.332"}) + "\n")
            hooks_env = hook_env(home, CLAUDE_CODE_ENTRYPOINT="cli")
            turn = {"session_id": "hs-ivy", "cwd": "/w/state", "transcript_path": str(transcript),
                    "prompt_id": "p-1"}
            async with mcp_session(env, "--agent", "claude", "--name", "ivy", "--project", "/w/state",
                                   "--host-session-id", "hs-ivy"):
                assert await state_of("ivy") == (None, None)  # no hook has marked it yet
                prompt = {**turn, "hook_event_name": "UserPromptSubmit", "prompt": "go"}
                assert run_hook("user-prompt-submit", "claude", prompt, hooks_env).returncode == 0
                busy, since = await state_of("ivy")
                assert busy == "busy" and isinstance(since, int)
                stop = {**turn, "hook_event_name": "Stop", "stop_hook_active": False}
                assert run_hook("stop", "claude", stop, hooks_env).returncode == 0
                idle, idle_since = await state_of("ivy")
                assert idle == "idle" and idle_since >= since
                listed = json.loads(_cli(env, Path("/"), "sessions", "--json").stdout)
                assert {s["name"]: s["state"] for s in listed}["ivy"] == "idle"

            async def offline() -> bool:
                return (await state_of("ivy"))[0] == "offline"

            await wait_for(offline, what="the gone session offline")
            (gone,) = [p for p in await call(a, "peers") if p["name"] == "ivy"]
            listed = json.loads(_cli(env, Path("/"), "sessions", "--json").stdout)
            assert gone["stateSince"] == {s["name"]: s["lastSeen"] for s in listed}["ivy"]

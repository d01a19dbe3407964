"""The hooks against a real broker and real `agent-bridge mcp` sessions (SPEC §3 "Host session
identity", §4.5): identity reports pair a hook with the MCP server of the same host, whichever
starts first, also through a report left while no broker ran; the Stop hook
blocks once for an active message and never for decision notices or passive messages."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

from agent_bridge.common import paths
from tests.conftest import BrokerProcess, call, mcp_session, wait_for, wait_until
from tests.hooks.conftest import hook_env, note_of, run_hook

pytestmark = pytest.mark.slow


async def hook(event: str, agent: str, stdin: dict[str, Any], env: dict[str, str]) -> Any:
    return await trio.to_thread.run_sync(lambda: run_hook(event, agent, stdin, env))


def start_input(sid: str, project: Path, source: str = "startup") -> dict[str, Any]:
    return {
        "session_id": sid,
        "transcript_path": None,
        "cwd": str(project),
        "hook_event_name": "SessionStart",
        "source": source,
    }


def stop_input(sid: str, project: Path, active: bool = False) -> dict[str, Any]:
    return {"session_id": sid, "cwd": str(project), "hook_event_name": "Stop", "stop_hook_active": active,
            "last_assistant_message": "Done."}


async def peek(session: Any) -> list[dict[str, Any]]:
    return await call(session, "inbox", peek=True)


async def test_stop_blocks_once_for_an_active_message(broker, env, home, project, fake_host):
    host = {"AGENT_BRIDGE_HOST_PID": str(fake_host.pid)}
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(
                mcp_session(env, "--agent", "claude", "--project", str(project), extra_env=host)
            )
            b = await stack.enter_async_context(
                mcp_session(env, "--agent", "codex", "--project", str(project))
            )

            # The MCP server started first; the SessionStart hook of the same host pairs with it.
            note = note_of(
                await hook("session-start", "claude", start_input("hs-a", project), hook_env(home, **host))
            )
            me = await call(a, "whoami")
            assert me["hostSessionId"] == "hs-a"
            assert note.startswith(f"agent-bridge: you are {me['name']}.")  # the paired session's address

            assert (
                await hook("stop", "claude", stop_input("hs-a", project), hook_env(home, **host))
            ).stdout == b""

            sent = (await call(b, "send", to=me["name"], text="Please review PR 12"))["message"]
            first = await hook("stop", "claude", stop_input("hs-a", project), hook_env(home, **host))
            assert first.returncode == 0, first.stderr
            answer = json.loads(first.stdout)
            assert set(answer) == {"decision", "reason"} and answer["decision"] == "block"
            reason = answer["reason"]
            assert "Please review PR 12" in reason and sent["id"] in reason
            assert "codex-app" in reason and "not from the user" in reason

            # Claude Code's second Stop (stop_hook_active) with nothing new: no block.
            again = await hook(
                "stop", "claude", stop_input("hs-a", project, active=True), hook_env(home, **host)
            )
            assert (again.returncode, again.stdout) == (0, b"")

            # The broker acknowledged it: the session's inbox does not show it again.
            async def gone() -> bool:
                return all(m["id"] != sent["id"] for m in await peek(a))

            await wait_for(gone, what="the message shown by the Stop hook to be acknowledged")

            # Something new arrives while it continues: the next Stop blocks for that one only.
            later = (await call(b, "send", to=me["name"], text="One more thing"))["message"]
            third = json.loads(
                (
                    await hook("stop", "claude", stop_input("hs-a", project, True), hook_env(home, **host))
                ).stdout
            )
            assert "One more thing" in third["reason"] and later["id"] in third["reason"]
            assert "Please review PR 12" not in third["reason"]


async def test_stop_never_blocks_for_decision_notices_or_passive_messages(env, home, project, fake_host):
    host = {"AGENT_BRIDGE_HOST_PID": str(fake_host.pid)}
    b_proc = BrokerProcess({**env, "AGENT_BRIDGE_HOP_LIMIT": "2"}, home).start()
    try:
        with trio.fail_after(120):
            async with AsyncExitStack() as stack:
                a = await stack.enter_async_context(
                    mcp_session(env, "--agent", "codex", "--project", str(project), extra_env=host)
                )
                b = await stack.enter_async_context(
                    mcp_session(env, "--agent", "claude", "--project", str(project))
                )
                note_of(
                    await hook(
                        "session-start", "codex", start_input("hs-codex", project), hook_env(home, **host)
                    )
                )
                me = await call(a, "whoami")
                assert me["hostSessionId"] == "hs-codex"

                decided = (await call(b, "decide", topic="camera", text="Hold to look"))["decision"]
                stop = await hook("stop", "codex", stop_input("hs-codex", project), hook_env(home, **host))
                assert (stop.returncode, stop.stdout) == (0, b"")  # a decision notice (hop 100) never blocks

                question = (await call(a, "send", to="claude-app", text="Which camera?"))["message"]
                reply = (
                    await call(b, "send", to=me["name"], text="See the decision", reply_to=question["id"])
                )["message"]
                assert reply["hop"] == 2  # = the hop limit: passive
                stop = await hook("stop", "codex", stop_input("hs-codex", project), hook_env(home, **host))
                assert (stop.returncode, stop.stdout) == (0, b"")

                # Both are still delivered and readable, unacknowledged by the Stop hook.
                async def both_waiting() -> bool:
                    ids = {m["id"] for m in await peek(a)}
                    return reply["id"] in ids and any(
                        m.get("decision", {}).get("id") == decided["id"] for m in await peek(a)
                    )

                await wait_for(both_waiting, what="the decision notice and the passive reply in the inbox")

                active = (await call(b, "send", to=me["name"], text="Fresh question"))["message"]
                answer = json.loads(
                    (
                        await hook("stop", "codex", stop_input("hs-codex", project), hook_env(home, **host))
                    ).stdout
                )
                assert answer["decision"] == "block"
                assert active["id"] in answer["reason"]
                assert reply["id"] not in answer["reason"] and "Hold to look" not in answer["reason"]
    finally:
        b_proc.kill()


async def test_identity_pairs_with_an_mcp_server_started_after_the_hook(
    broker, env, home, project, fake_host
):
    host = {"AGENT_BRIDGE_HOST_PID": str(fake_host.pid)}
    note = note_of(
        await hook("session-start", "claude", start_input("hs-first", project), hook_env(home, **host))
    )
    # no guessed name
    assert "MCP server connects" in note and "`whoami`" in note and "claude-app" not in note
    with trio.fail_after(60):
        async with mcp_session(env, "--agent", "claude", "--project", str(project), extra_env=host) as a:
            async def learned() -> bool:
                return (await call(a, "whoami"))["hostSessionId"] == "hs-first"

            await wait_for(learned, what="the MCP server to learn the host session id the hook reported")


async def test_a_report_left_while_no_broker_ran_pairs_after_it_starts(env, home, project, fake_host):
    host = {"AGENT_BRIDGE_HOST_PID": str(fake_host.pid)}
    paths.ensure_home(home)
    result = await hook("session-start", "claude", start_input("hs-early", project), hook_env(home, **host))
    assert result.returncode == 0
    reports = home / paths.REPORTS_DIR
    assert len(list(reports.iterdir())) == 1
    b_proc = BrokerProcess(env, home).start()
    try:
        wait_until(lambda: not any(reports.iterdir()), what="the broker to take the identity report")
        with trio.fail_after(60):
            async with mcp_session(env, "--agent", "claude", "--project", str(project), extra_env=host) as a:
                async def learned() -> bool:
                    return (await call(a, "whoami"))["hostSessionId"] == "hs-early"

                await wait_for(learned, what="the MCP server to get the identity from the report")
    finally:
        b_proc.kill()


async def test_note_with_the_broker_up_names_the_paired_session_and_its_decisions(
    broker, env, home, project, fake_host
):
    host = {"AGENT_BRIDGE_HOST_PID": str(fake_host.pid)}
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(
                mcp_session(env, "--agent", "claude", "--project", str(project), extra_env=host)
            )
            for i in range(7):
                await call(a, "decide", topic=f"t{i}", text=f"answer {i}")
            await call(a, "decide", topic="global", text="everyone", scope="all")
            await call(a, "decide", topic="elsewhere", text="not here", scope={"project": "/work/other"})
            note = note_of(
                await hook("session-start", "claude", start_input("hs-note", project), hook_env(home, **host))
            )
            me = await call(a, "whoami")
            lines = note.splitlines()
            assert lines[0].startswith(f"agent-bridge: you are {me['name']}.")
            assert lines[1:-1] == [
                "global: everyone",
                "t6: answer 6",
                "t5: answer 5",
                "t4: answer 4",
                "t3: answer 3",
            ]
            assert lines[-1].startswith("3 more;") and "`decisions` tool" in lines[-1]

"""A relay's connection that goes silent (a dead relay: no line, no ping) is closed after
IDLE_TIMEOUT and its session detached; one that pings stays. The broker runs in this process on
Trio's mock clock (autojumping), so the 45 s of silence take no wall time: real store, real Unix socket,
the real relay handshake (`mcp`) as the relay speaks it (docs/ipc.md)."""

from __future__ import annotations

import json

import trio

from agent_bridge.broker.serving import IDLE_TIMEOUT
from agent_bridge.ipc.stream import FramedStream
from tests.test_absorb_offers import broker_in_process

MCP_HELLO = {"v": 1, "id": 1, "op": "mcp", "agent": "codex", "project": "/w/silent"}  # docs/ipc.md


async def open_relay(sock: str) -> tuple[FramedStream, str]:
    relay = FramedStream(await trio.open_unix_socket(sock))
    await relay.send(MCP_HELLO)
    hello = await relay.receive()
    assert hello is not None and hello["ok"], hello
    ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    await relay.send({"v": 1, "relay": "line", "line": ping})
    return relay, hello["result"]["session"]["id"]


async def test_a_silent_relay_is_closed_after_the_idle_timeout_and_a_pinging_one_is_not(home, mock_clock):
    # Virtual time jumps once every task has waited 0.5 s of real time: the store's thread
    # finishes its transactions before, so only the waits for silence are skipped. (At 50 ms, a
    # store starting on a loaded machine took longer once, and the jump went to the deadline.)
    mock_clock.autojump_threshold = 0.5
    with trio.fail_after(IDLE_TIMEOUT * 4):
        async with broker_in_process(home) as (broker, sock):
            silent, silent_id = await open_relay(sock)
            pinging, pinging_id = await open_relay(sock)
            start = trio.current_time()
            with trio.move_on_after(IDLE_TIMEOUT * 2):
                while True:  # the live relay pings every 15 s, as `agent-bridge mcp` does
                    await trio.sleep(15)
                    await pinging.send({"v": 1, "relay": "ping"})
            while (frame := await silent.receive()) is not None:
                assert frame.get("push") in ("line", "held", "identity"), frame  # then the end
            assert trio.current_time() - start >= IDLE_TIMEOUT, "closed before the idle timeout"
            assert silent_id not in broker.sessions
            assert pinging_id in broker.sessions, "a relay that pings was dropped"
            await silent.aclose()
            await pinging.aclose()

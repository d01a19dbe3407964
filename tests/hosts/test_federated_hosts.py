"""The real hosts across two machines (SPEC §10): Claude Code on machine a's home and Codex on
machine b's, each offline against its scripted model server, each machine its own broker and
bridge.db, federated through a real nats-server run from the printed hub config. A decision
Claude Code pins on a is in the Codex session's SessionStart note on b (naming machine a), and a
message Codex sends to `name@a` reaches Claude Code's model."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent_bridge.federation import identity, settings
from agent_bridge.store import reader
from tests.conftest import wait_until
from tests.federation.conftest import TEAM, Hub, Machine, nats_server_binary
from tests.hosts.conftest import GATE_STEP, World, codex_messages, open_world, plan
from tests.hosts.test_codex import thread_of

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # two worlds, two brokers and a hub at once

DEADLINE = 120.0


@contextmanager
def running_hub(folder: Path, machines: list[Machine]) -> Iterator[Hub]:
    """A real nats-server with the configuration `federation hub-config` prints for `machines`."""
    hub = Hub(folder, machines, TEAM)
    proc = subprocess.Popen([nats_server_binary(), "-c", str(hub.conf)], stdout=hub._log_fd,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def accepting() -> bool:
            assert proc.poll() is None, hub.log.read_text()
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", hub.port)) == 0

        wait_until(accepting, timeout=15, what="nats-server accepting")
        yield hub
    finally:
        proc.kill()
        proc.wait(timeout=30)
        os.close(hub._log_fd)


def federate(world: World, name: str) -> Machine:
    """The world's broker home as machine `name`: its seed made (0600), for the hub config."""
    made = identity.ensure(settings.default_seed(world.bridge_home))
    return Machine(name, world.bridge_home, made.public_key)


def db_count(world: World, sql: str) -> int:
    with reader.reading(world.bridge_home / "bridge.db") as conn:
        if conn is None:
            return 0
        row = conn.execute(sql).fetchone()
        return 0 if row is None else int(row[0])


def test_claude_on_a_and_codex_on_b_across_a_real_hub(host_bin: Path, tmp_path: Path) -> None:
    claude_id = str(uuid.uuid4())
    with open_world(host_bin) as on_a, open_world(host_bin) as on_b:
        a, b = federate(on_a, "a"), federate(on_b, "b")
        with running_hub(tmp_path / "hub", [a, b]) as hub:
            for machine, world in ((a, on_a), (b, on_b)):
                machine.settings(hub)  # [federation] in its config.toml
                world.restart_broker({})  # `up --detach` with it

            # Claude Code on a pins a decision for everyone, then keeps working (held at a gate).
            claude = on_a.claude(
                plan(("decide", {"topic": "deploy", "text": "Fly.io", "scope": "all"}),
                     GATE_STEP("claude-works")),
                session_id=claude_id, tag="claude")
            on_a.claude_model.wait_reached("claude-works")
            name = next(p["name"] for p in on_a.peers() if p["hostSessionId"] == claude_id)

            wait_until(lambda: db_count(on_b, "SELECT count(*) FROM decisions WHERE machine = 'a'") == 1,
                       timeout=DEADLINE, what="a's decision in b's bridge.db")
            wait_until(lambda: db_count(on_b, "SELECT count(*) FROM peers WHERE machine = 'a' "
                                               f"AND name = '{name}' AND remote_state != 'offline'") == 1,
                       timeout=DEADLINE, what=f"{name}@a announced to b")

            # Codex on b starts (its note has a's decision) and sends to Claude Code on a.
            codex = on_b.codex(plan(("send", {"to": f"{name}@a", "text": "codex on b: tests pass"}))).wait()
            first = on_b.codex_model.of_session(thread_of(codex))[0].body
            note = "\n".join(codex_messages(first, "developer"))
            assert "deploy: Fly.io (recorded on a)" in note, note

            wait_until(lambda: db_count(on_a, "SELECT count(*) FROM messages WHERE machine = 'b'") == 1,
                       timeout=DEADLINE, what="the message from b stored on a")
            on_a.claude_model.open_gate("claude-works")
            claude.wait()
            got = [r for r in on_a.claude_model.of_session(claude_id) if "codex on b: tests pass" in r.text]
            assert got, "the message from Codex on b never reached Claude Code's model on a"
            assert "Stop hook additional context" in got[0].text  # handed over by a's Stop hook
            assert "another agent session, codex-proj@b (codex)" in got[0].text  # its sender's address on b

"""SPEC §8 with a failing disk: the broker's own store runs on an APSW VFS shim that injects
SQLITE_IOERR and SQLITE_FULL on writes. The affected request gets a clear error, nothing is
half-written, the broker stays up and serves again once the fault clears.

The broker runs in this process (`run_broker`, the same root the `up` command runs), so the
shim, registered as the default VFS here, is what its store writes through."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio

from agent_bridge.broker.root import run_broker
from agent_bridge.common import paths
from agent_bridge.common.config import Settings
from agent_bridge.ipc.client import open_bridge_client
from agent_bridge.ipc.protocol import RemoteError
from tests.reliability.faultvfs import FaultyVFS
from tests.reliability.harness import rows

TABLES = ("peers", "messages", "receipts", "decisions", "decision_deliveries", "host_instances")


@pytest.fixture
def faulty_vfs():
    vfs = FaultyVFS(makedefault=True)
    try:
        yield vfs
    finally:
        vfs.unregister()


@asynccontextmanager
async def broker_in_process(home: Path) -> AsyncIterator[dict[str, Any]]:
    paths.ensure_home(home)
    record: dict[str, Any] = {}
    ready = trio.Event()

    def on_ready(r: dict[str, Any]) -> None:
        record.update(r)
        ready.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(run_broker, home, Settings(), web_port=0, on_ready=on_ready))
        await ready.wait()
        yield record
        nursery.cancel_scope.cancel()


def hello(name: str) -> dict[str, Any]:
    return {"agent": "codex", "project": "/w/disk", "name": name, "hostSessionId": name}


def snapshot(home: Path) -> dict[str, list[tuple]]:
    return {t: sorted(rows(home, f"SELECT * FROM {t}")) for t in TABLES}


async def expect_unavailable(request) -> str:
    with pytest.raises(RemoteError) as caught:
        await request
    assert caught.value.code == "unavailable", caught.value
    assert "storage error" in caught.value.message
    return caught.value.message


class Inbox:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.changed = trio.Event()

    async def collect(self, pushes) -> None:
        async for frame in pushes:
            if frame.get("push") == "message":
                self.ids.append(frame["message"]["id"])
                self.texts.append(frame["message"]["text"])
                self.changed.set()
                self.changed = trio.Event()

    async def until(self, predicate) -> None:
        while not predicate():
            await self.changed.wait()


@pytest.mark.parametrize("mode", ["ioerr", "full"])
# The fault strikes after this share of the writes one send takes (measured in the test): at its
# first write, and at several points inside its transaction.
@pytest.mark.parametrize("stage", [0.0, 0.2, 0.4, 0.6, 0.8, 0.95], ids=lambda f: f"at-{int(f * 100)}pct")
async def test_storage_faults_fail_the_request_and_the_broker_keeps_serving(
    home, faulty_vfs, caplog, mode, stage
):
    caplog.set_level(logging.INFO)
    with trio.fail_after(60):
        async with broker_in_process(home) as record, trio.open_nursery() as nursery:
            sock = record["socket"]
            async with (
                open_bridge_client(sock, hello("disk-a")) as (a, _),
                open_bridge_client(sock, hello("disk-b")) as (b, pushes),
            ):
                inbox = Inbox()
                nursery.start_soon(inbox.collect, pushes)
                first = (await a.request("send", to="disk-b", text="before"))["message"]
                pending = (await a.request("send", to="disk-b", text="shown, not yet acked"))["message"]
                await inbox.until(lambda: pending["id"] in inbox.ids)
                await b.request("ack", ids=[first["id"]])
                await a.request("decide", topic="disk", text="healthy", scope="all")
                writes = faulty_vfs.writes
                await a.request("send", to="disk-a", text="measuring")  # to itself: nothing pushed to b
                per_send = faulty_vfs.writes - writes
                assert per_send >= 2
                before = snapshot(home)

                faulty_vfs.arm(mode, after_writes=int(per_send * stage))
                errors = [
                    await expect_unavailable(a.request("send", to="disk-b", text="during the fault")),
                    await expect_unavailable(a.request("decide", topic="disk", text="full", scope="all")),
                    await expect_unavailable(b.request("ack", ids=[pending["id"]])),
                ]
                with pytest.raises(RemoteError) as refused:
                    async with open_bridge_client(sock, hello("disk-c")):
                        pass
                assert refused.value.code == "unavailable" and "storage error" in refused.value.message
                assert (await a.request("status"))["sessions"] == 2  # the refused hello left no ghost
                expected = "disk I/O error" if mode == "ioerr" else "disk is full"
                assert all(expected in e for e in errors), errors
                # reads and pings still work; nothing was half-written
                assert await a.request("ping") == "pong"
                assert [d["text"] for d in await a.request("decisions", scope="all")] == ["healthy"]
                assert snapshot(home) == before
                assert faulty_vfs.failed > 0

                faulty_vfs.clear()
                after = (await a.request("send", to="disk-b", text="after the fault"))["message"]
                await inbox.until(lambda: after["id"] in inbox.ids)
                assert await b.request("ack", ids=[pending["id"], after["id"]]) == {"acked": 2}
                decided = await a.request("decide", topic="disk", text="recovered", scope="all")
                assert decided["deliveredTo"] == ["disk-a", "disk-b"]
                async with open_bridge_client(sock, hello("disk-c")) as (c, _):
                    assert (await c.request("whoami"))["name"] == "disk-c"
                assert "during the fault" not in inbox.texts
                assert inbox.texts.count("shown, not yet acked") == 1
            nursery.cancel_scope.cancel()
    assert rows(home, "PRAGMA integrity_check") == [("ok",)]
    assert rows(home, "SELECT text FROM decisions ORDER BY seq") == [("healthy",), ("recovered",)]
    handler_failures = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert handler_failures == [], "a storage error escaped as a crash of a connection handler"
    assert any("storage error" in r.getMessage() or "failed" in r.getMessage() for r in caplog.records)


def test_the_shim_really_fails_sqlite_writes(tmp_path):
    """The shim itself: SQLite reports the injected errors, and a transaction that hit one is
    rolled back entirely."""
    vfs = FaultyVFS("faulty-direct")
    try:
        conn = apsw.Connection(str(tmp_path / "x.db"), vfs="faulty-direct")
        conn.execute("PRAGMA journal_mode = wal")
        conn.execute("CREATE TABLE t (x)")
        for mode, error in (("ioerr", apsw.IOError), ("full", apsw.FullError)):
            vfs.arm(mode, after_writes=1)
            with pytest.raises(error):
                with conn:
                    conn.execute("INSERT INTO t VALUES (1)")
                    conn.execute("INSERT INTO t SELECT randomblob(50000)")
            vfs.clear()
            assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
        with conn:
            conn.execute("INSERT INTO t VALUES (2)")
        conn.close()
    finally:
        vfs.unregister()


@pytest.mark.parametrize("after_writes", [0, 3, 12])
async def test_pipelined_sends_hit_by_a_storage_fault_store_exactly_what_was_answered(
    home, faulty_vfs, after_writes
):
    """Sends in flight together share a transaction: a fault fails every send of the batch it
    hits, and what the database holds is exactly the sends answered with success."""
    with trio.fail_after(60):
        async with broker_in_process(home) as record:
            sock = record["socket"]
            async with (
                open_bridge_client(sock, hello("pipe-a")) as (a, _),
                open_bridge_client(sock, hello("pipe-b")),
            ):
                await a.request("send", to="pipe-b", text="warm-up")
                answered: dict[str, str] = {}
                failed: list[str] = []

                async def send(text: str) -> None:
                    try:
                        answered[text] = (await a.request("send", to="pipe-b", text=text))["message"]["id"]
                    except RemoteError as exc:
                        assert exc.code == "unavailable" and "storage error" in exc.message, exc
                        failed.append(text)

                faulty_vfs.arm("ioerr", after_writes=after_writes)
                async with trio.open_nursery() as nursery:
                    for i in range(40):
                        nursery.start_soon(send, f"p{i}")
                faulty_vfs.clear()
                assert failed, "the fault failed no send"
                stored = dict(rows(home, "SELECT body, id FROM messages WHERE body LIKE 'p%'"))
                assert stored == answered
                assert (await a.request("send", to="pipe-b", text="after"))["message"]["text"] == "after"
    assert rows(home, "PRAGMA integrity_check") == [("ok",)]

"""The dashboard reads bridge.db read-only, whatever state it is in (SPEC §6, §7)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import apsw
import pytest
import trio
from webfixtures import TIMEOUT, Running, build_database, build_old_database, start_dashboard

EMPTY = {
    "/api/decisions": {"decisions": []},
    "/api/decisions?q=x&scope=all": {"decisions": []},
    "/api/decisions/camera/history": {"topic": "camera", "decisions": [], "retractions": []},
    "/api/decisions/build%20%2F%20ci/history": {"topic": "build / ci", "decisions": [], "retractions": []},
    "/api/sessions": {"sessions": []},
    "/api/messages": {"messages": []},
}
READ_PATHS = [
    "/api/decisions",
    "/api/decisions?q=nox&scope=" + json.dumps({"project": "/work/proj"}),
    "/api/decisions/build%20%2F%20ci/history",
    "/api/sessions",
    "/api/messages?limit=5",
]


LOOKUP_PRAGMAS = {"table_info", "table_xinfo", "index_list", "index_info"}  # an argument, but reads


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def answers(running: Running, paths: list[str]) -> dict[str, tuple[int, object]]:
    async with running.client() as client:
        return {p: ((r := await client.get(p)).status_code, r.json()) for p in paths}


async def test_no_database_reads_as_empty(nursery: trio.Nursery, web_home: Path) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_dashboard(nursery, web_home)
        got = await answers(running, [*EMPTY, "/api/status"])
    assert {p: got[p] for p in EMPTY} == {p: (200, body) for p, body in EMPTY.items()}
    assert got["/api/status"] == (200, {"mode": "broker", "home": str(web_home), "database": False,
                                        "readOnly": False, "hopLimit": 10})  # the owner's actions: SPEC §6
    assert not (web_home / "bridge.db").exists()  # reading never creates the database


@pytest.mark.parametrize("version", [1, 2])
async def test_old_schema_database_is_read_as_it_is(
    nursery: trio.Nursery, web_home: Path, version: int
) -> None:
    build_old_database(web_home, version)
    before = digest(web_home / "bridge.db")
    with trio.fail_after(TIMEOUT):
        running = await start_dashboard(nursery, web_home, live={"p2"})
        got = await answers(running, list(EMPTY))
    for path in ("/api/decisions", "/api/decisions?q=x&scope=all", "/api/decisions/camera/history",
                 "/api/decisions/build%20%2F%20ci/history"):
        assert got[path] == (200, EMPTY[path])
    status, sessions = got["/api/sessions"]
    assert status == 200
    assert [(s["name"], s["hostSessionId"], s["connected"]) for s in sessions["sessions"]] == [
        ("claude-old", None, False), ("codex-old", None, True),
    ]
    status, messages = got["/api/messages"]
    assert status == 200
    if version == 1:
        assert messages == {"messages": []}  # v1 has no receipts: nothing the reader can attribute
    else:
        assert [(m["from"]["name"], m["to"]["name"], m["text"], m["kind"]) for m in messages["messages"]] == [
            ("claude-old", "codex-old", "hi", "message"),
        ]
    # Not migrated, not touched.
    assert digest(web_home / "bridge.db") == before
    conn = apsw.Connection(str(web_home / "bridge.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == version
    finally:
        conn.close()


async def test_newer_schema_is_a_clear_error_not_a_crash(nursery: trio.Nursery, web_home: Path) -> None:
    build_database(web_home)
    conn = apsw.Connection(str(web_home / "bridge.db"))
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with trio.fail_after(TIMEOUT):
        running = await start_dashboard(nursery, web_home)
        got = await answers(running, READ_PATHS)
        async with running.client() as client:
            assert (await client.get("/api/status")).status_code == 200
            assert (await client.get("/")).status_code == 200  # the page still loads and says why
    for path, (status, body) in got.items():
        assert status == 503, path
        assert list(body) == ["error"]
        assert "schema version 99" in body["error"] and "newer" in body["error"]


async def test_unreadable_database_is_a_clear_error(nursery: trio.Nursery, web_home: Path) -> None:
    (web_home / "bridge.db").write_bytes(b"this is not an SQLite database, just some bytes" * 100)
    with trio.fail_after(TIMEOUT):
        running = await start_dashboard(nursery, web_home)
        got = await answers(running, READ_PATHS)
    for path, (status, body) in got.items():
        assert status == 503, path
        assert body["error"].startswith("bridge.db could not be read: NotADBError")


async def test_handlers_open_only_read_only_connections(nursery: trio.Nursery, web_home: Path) -> None:
    """Every connection opened while the endpoints answer is checked as it opens: it must be
    read-only, and an authorizer denies (and records) any write it would attempt."""
    build_database(web_home)
    before = digest(web_home / "bridge.db")
    opened: list[int] = []
    attempts: list[tuple] = []
    writes = {
        getattr(apsw, name)
        for name in dir(apsw)
        if name.startswith(
            (
                "SQLITE_INSERT",
                "SQLITE_UPDATE",
                "SQLITE_DELETE",
                "SQLITE_CREATE_",
                "SQLITE_DROP_",
                "SQLITE_ALTER_TABLE",
                "SQLITE_ATTACH",
                "SQLITE_REINDEX",
                "SQLITE_ANALYZE",
            )
        )
        and isinstance(getattr(apsw, name), int)
    }

    def authorizer(op: int, p1, p2, db, trigger) -> int:
        setting = op == apsw.SQLITE_PRAGMA and p2 is not None and p1 not in LOOKUP_PRAGMAS
        if op in writes or setting:
            attempts.append((op, p1, p2))
            return apsw.SQLITE_DENY
        return apsw.SQLITE_OK

    def check(conn: apsw.Connection) -> None:
        opened.append(conn.open_flags)
        conn.authorizer = authorizer

    apsw.connection_hooks.append(check)
    try:
        with trio.fail_after(TIMEOUT):
            running = await start_dashboard(nursery, web_home, live=set())
            got = await answers(running, READ_PATHS)
    finally:
        apsw.connection_hooks.remove(check)
    assert all(status == 200 for status, _ in got.values()), got
    assert got["/api/decisions"][1]["decisions"], "the endpoints did read the data"
    assert len(opened) >= len(READ_PATHS)
    for flags in opened:
        assert flags & apsw.SQLITE_OPEN_READONLY and not flags & (
            apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
        )
    assert attempts == []
    assert digest(web_home / "bridge.db") == before


async def test_a_locked_database_does_not_block_the_event_loop(nursery: trio.Nursery, web_home: Path) -> None:
    """SQLite runs on worker threads: while one request waits for a lock held by a writer, the
    app keeps answering, and the waiting request ends in a clear 503, not a hang."""
    build_database(web_home)
    writer = apsw.Connection(str(web_home / "bridge.db"))
    writer.execute("PRAGMA journal_mode = DELETE")  # a rollback journal: an exclusive lock stops readers
    writer.execute("BEGIN EXCLUSIVE")
    try:
        with trio.fail_after(TIMEOUT):
            running = await start_dashboard(nursery, web_home)
            order: list[str] = []
            async with running.client() as client, trio.open_nursery() as inner:
                blocked = {}

                async def read_decisions() -> None:
                    blocked["response"] = await client.get("/api/decisions")
                    order.append("decisions")

                inner.start_soon(read_decisions)
                status = await client.get("/api/status")
                order.append("status")
                page = await client.get("/static/app.js")
                order.append("static")
            assert status.status_code == 200 and page.status_code == 200
            assert order == ["status", "static", "decisions"]
            response = blocked["response"]
            assert response.status_code == 503
            assert response.json()["error"].startswith("bridge.db could not be read: BusyError")
    finally:
        writer.execute("ROLLBACK")
        writer.close()

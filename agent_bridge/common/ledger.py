"""The acknowledgement ledger: what a process showed its host and no broker has recorded yet,
kept in the home folder (SPEC §3 "One ledger of showing").

An MCP relay or Stop hook that showed messages while no broker could confirm them writes the
unconfirmed part of its showing machine (agent_bridge.core.showing: what it offered, what it
wrote) to `<home>/acks/<peer id>.<pid>-<start>.json`, before it writes to the host (the offer)
and after (the acknowledgement). The writer is named by its pid **and** its start time, so a
pid the system gave to another process since does not pass for the writer. The process that
wrote a file sends it itself when a broker is back, then removes it; the broker applies the
files of writers that are gone (killed, or a hook that ended) before it serves that session
again. No id is ever dropped from a file: an acknowledgement survives a broker outage and the
death of its writer, and a message shown before is known to be a repeat.

Anything in the folder this module did not write (a bad name, a FIFO, a symlink, a file too
large, garbage) is moved aside into `<home>/acks.ignored/` with one log line, never read past
READ_MAX, never waited on: it never blocks a session.

Light on purpose: the relay and the Stop hook use it (standard library, `paths`, `procinfo`).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from agent_bridge.common import paths, procinfo

FOLDER = "acks"
IGNORED = "acks.ignored"  # files of FOLDER this module did not write, moved aside
IDS_MAX = 10_000  # ids per request when a list is handed to the broker (its ack op takes as many)
READ_MAX = 64 << 20  # bytes: a ledger of 1.5 million ids; a larger file is not one of ours
NUMBER_MAX = 1 << 62  # a pid or start time past this is not one


class Writer(NamedTuple):
    pid: int
    start: int  # procinfo.Proc.start: with the pid, names one process for as long as the machine runs


class Record(NamedTuple):
    path: Path
    peer_id: str
    offered: list[str]
    acked: list[str]


_me: Writer | None = None


def me() -> Writer:
    """This process, as a ledger names its writer."""
    global _me
    if _me is None:
        found = procinfo.describe(os.getpid())
        _me = Writer(os.getpid(), found[0].start if found else 0)
    return _me


def writer_of(pid: int) -> Writer:
    """The process running as `pid` now (start 0 when there is none, or it cannot be told)."""
    found = procinfo.describe(pid)
    return Writer(pid, found[0].start if found else 0)


def alive(writer: Writer) -> bool:
    """The writer still runs: same pid and same start time (a reused pid is someone else)."""
    found = procinfo.describe(writer.pid)
    if found is not None:
        return found[0].start == writer.start
    if sys.platform == "win32":  # no start times there (procinfo.describe): the pid alone
        return paths.pid_alive(writer.pid)
    return False


def path_for(home: Path, peer_id: str, writer: Writer | None = None) -> Path:
    who = writer or me()
    safe = "".join(ch for ch in peer_id if ch.isascii() and (ch.isalnum() or ch in "-_"))[:80] or "unknown"
    return home / FOLDER / f"{safe}.{who.pid}-{who.start}.json"


def save(home: Path, peer_id: str, offered: list[str], acked: list[str], *, writer: Writer | None = None,
         pid: int | None = None) -> Path:
    """Write (atomically) what the writer (default: this process; `pid`: the process running as
    that pid now) offered and acknowledged for session `peer_id` and no broker has recorded yet,
    every id of it; nothing left: remove the file."""
    who = writer or (writer_of(pid) if pid is not None else me())
    target = path_for(home, peer_id, who)
    if not offered and not acked:
        target.unlink(missing_ok=True)
        return target
    (home / FOLDER).mkdir(mode=0o700, parents=True, exist_ok=True)
    record = {
        "peerId": peer_id,
        "pid": who.pid,
        "start": who.start,
        "offered": list(offered),
        "acked": list(acked),
    }
    paths.write_private(target, json.dumps(record, separators=(",", ":")))
    return target


def remove(home: Path, peer_id: str, *, writer: Writer | None = None, pid: int | None = None) -> None:
    path_for(home, peer_id, writer or (writer_of(pid) if pid is not None else None)).unlink(missing_ok=True)


def parse_name(name: str) -> Writer | None:
    """`<peer>.<pid>-<start>.json` -> its writer; None for any other name."""
    parts = name.split(".")
    if len(parts) != 3 or parts[2] != "json":
        return None
    numbers = parts[1].split("-")
    if len(numbers) != 2 or not all(n.isascii() and n.isdigit() and 0 < len(n) <= 19 for n in numbers):
        return None
    pid, start = int(numbers[0]), int(numbers[1])
    if not 0 < pid < NUMBER_MAX or start >= NUMBER_MAX:
        return None
    return Writer(pid, start)


def orphans(home: Path, log: Callable[[str], None] = lambda line: None) -> list[Record]:
    """The records whose writer is gone. What is not a record of ours is moved aside, with one
    `log` line each; what cannot be moved is skipped, also with its line."""
    folder = home / FOLDER
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out: list[Record] = []
    for name in names:
        target = folder / name
        writer = parse_name(name)
        if writer is not None and alive(writer):
            continue  # its writer sends it itself
        record, why = (None, "not a ledger file name") if writer is None else _read(target)
        if record is not None:
            out.append(record)
            continue
        try:
            aside = home / IGNORED
            aside.mkdir(mode=0o700, exist_ok=True)
            os.replace(target, paths.free_path(aside, name))
            log(f"moved {name!r} out of {FOLDER}/ into {IGNORED}/: {why}")
        except OSError as exc:
            log(f"skipped {name!r} in {FOLDER}/: {why}; could not move it aside: {exc.strerror or exc}")
    return out


def _read(target: Path) -> tuple[Record | None, str]:
    """The record in `target`: a regular file (no symlink, no FIFO), at most READ_MAX bytes,
    read without waiting; else (None, why)."""
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        return None, f"cannot be opened as a file: {exc.strerror or exc}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > READ_MAX:
            return None, f"larger than {READ_MAX} bytes"
        data = b""
        while len(data) <= READ_MAX:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}"
    finally:
        os.close(fd)
    if len(data) > READ_MAX:
        return None, f"larger than {READ_MAX} bytes"
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):  # (UnicodeDecodeError included)
        return None, "not JSON"
    if not _valid(record):
        return None, "not a ledger record"
    return Record(target, record["peerId"], record["offered"], record["acked"]), ""


def _valid(record: Any) -> bool:
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("peerId"), str)
        or len(record["peerId"]) > 200
    ):
        return False
    return all(
        isinstance(record.get(key), list) and all(isinstance(i, str) and len(i) <= 200 for i in record[key])
        for key in ("offered", "acked")
    )

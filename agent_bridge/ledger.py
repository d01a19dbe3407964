"""Offers and acknowledgements that could not reach the broker, kept in the home folder.

An MCP server or Stop hook that has shown messages to its host while no broker answered
writes what it offered and what it acknowledged to `<home>/acks/<peer id>.<pid>.json`, before
it writes to the host (the offer) and after (the acknowledgement). The process that wrote a
file sends it itself when the broker is back, then removes it; the broker applies the files of
processes that are gone (killed, or a hook that ended) before it serves that session again. So
an acknowledgement survives a broker outage and the death of the process that held it, and a
message shown before is known to be a repeat.

Light on purpose: the Stop hook uses it (standard library and `paths` only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agent_bridge import paths

FOLDER = "acks"
IDS_MAX = 10_000  # ids per list in one file (the broker's ack request takes as many)


def path_for(home: Path, peer_id: str, pid: int) -> Path:
    safe = "".join(ch for ch in peer_id if ch.isalnum() or ch in "-_")[:80] or "unknown"
    return home / FOLDER / f"{safe}.{pid}.json"


def save(home: Path, peer_id: str, offered: list[str], acked: list[str], *, pid: int | None = None) -> Path:
    """Write (atomically) what this process offered and acknowledged for session `peer_id`
    and the broker has not recorded yet; nothing left: remove the file."""
    target = path_for(home, peer_id, os.getpid() if pid is None else pid)
    if not offered and not acked:
        target.unlink(missing_ok=True)
        return target
    folder = home / FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    record = {"peerId": peer_id, "pid": os.getpid() if pid is None else pid,
              "offered": offered[-IDS_MAX:], "acked": acked[-IDS_MAX:]}
    paths.write_private(target, json.dumps(record, separators=(",", ":")))
    return target


def remove(home: Path, peer_id: str, *, pid: int | None = None) -> None:
    path_for(home, peer_id, os.getpid() if pid is None else pid).unlink(missing_ok=True)


def orphans(home: Path) -> list[tuple[Path, dict[str, Any] | None]]:
    """The files whose writer is gone: (path, record), record None when unreadable."""
    try:
        names = sorted(os.listdir(home / FOLDER))
    except OSError:
        return []
    out: list[tuple[Path, dict[str, Any] | None]] = []
    for name in names:
        parts = name.split(".")
        if len(parts) != 3 or parts[2] != "json" or not parts[1].isdigit():
            continue
        if paths.pid_alive(int(parts[1])):
            continue  # its writer sends it itself
        target = home / FOLDER / name
        try:
            record = json.loads(target.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = None
        out.append((target, record if _valid(record) else None))
    return out


def _valid(record: object) -> bool:
    if not isinstance(record, dict) or not isinstance(record.get("peerId"), str):
        return False
    return all(
        isinstance(record.get(key), list) and all(isinstance(i, str) and len(i) <= 200 for i in record[key])
        for key in ("offered", "acked")
    )

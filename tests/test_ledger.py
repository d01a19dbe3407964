"""The acknowledgement ledger's file handling (agent_bridge.common.ledger): who wrote a file, and what
is not a file of ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from agent_bridge.common import ledger


def test_a_file_names_its_writer_by_pid_and_start_time(tmp_path):
    me = ledger.me()
    path = ledger.save(tmp_path, "peer-1", ["a"], ["b"])
    assert path.name == f"peer-1.{me.pid}-{me.start}.json"
    assert ledger.parse_name(path.name) == me
    assert json.loads(path.read_text())["start"] == me.start
    assert ledger.alive(me)
    assert ledger.orphans(tmp_path) == []  # its writer runs: it sends it itself


def test_a_pid_now_running_something_else_is_not_the_writer(tmp_path):
    """The file's pid runs, but started at another time: the writer is gone, the file applies."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = ledger.writer_of(sleeper.pid)
        assert running.start and ledger.alive(running)
        earlier = ledger.Writer(sleeper.pid, running.start - 1)
        ledger.save(tmp_path, "peer-2", [], ["m1"], writer=earlier)
        (record,) = ledger.orphans(tmp_path)
        assert (record.peer_id, record.acked) == ("peer-2", ["m1"])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_every_id_is_kept_however_many(tmp_path):
    ids = [f"01a2-{i:08d}" for i in range(25_000)]
    ledger.save(tmp_path, "peer-3", ids, ids, writer=ledger.Writer(1 << 30, 1))
    (record,) = ledger.orphans(tmp_path)
    assert record.offered == ids and record.acked == ids


def test_names_that_are_not_ours_are_refused_without_arithmetic():
    for name in ("x.²³.json", "x.99999999999999999999.json", "x.1.json", "x.-1-2.json", "x.1-2.txt",
                 "x.0-2.json", "a.b.1-2.json", "x.1-99999999999999999999.json"):
        assert ledger.parse_name(name) is None, name


def test_what_is_not_a_ledger_record_is_moved_aside_with_one_line_each(tmp_path):
    folder = tmp_path / ledger.FOLDER
    folder.mkdir()
    os.mkfifo(folder / "p.11-1.json")
    os.symlink("/dev/zero", folder / "p.12-1.json")
    (folder / "p.13-1.json").write_text("[" * 100_000)
    (folder / "p.14-1.json").write_text(json.dumps({"peerId": "p", "offered": [1], "acked": []}))
    (folder / "note.txt").write_text("hello")
    lines: list[str] = []
    assert ledger.orphans(tmp_path, lines.append) == []
    assert os.listdir(folder) == []
    assert sorted(os.listdir(tmp_path / ledger.IGNORED)) == ["note.txt", "p.11-1.json", "p.12-1.json",
                                                              "p.13-1.json", "p.14-1.json"]
    assert len(lines) == 5 and all(line.startswith("moved ") for line in lines)

"""The relay's wait between two looks for its broker (relay.connector.wait_for_broker): the
keeper's backoff, ended early once broker.json is written anew, on a real state folder and real
files (paths.write_private, as a broker writes its record); the clock is a mock, advanced by the
sleeps, so nothing here waits."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from agent_bridge.common import paths
from agent_bridge.relay import connector
from agent_bridge.relay.connector import BROKER_LOOK, wait_for_broker


class Clock:
    """A mock clock whose sleeps advance it, and an action to run at one of them."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.at: dict[int, Callable[[], None]] = {}  # sleep number (1-based) -> what happens during it

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        action = self.at.get(len(self.sleeps))
        if action is not None:
            action()

    def __call__(self) -> float:
        return self.now


def register(home: Path, pid: int) -> None:
    paths.write_private(home / paths.BROKER_JSON, json.dumps({"pid": pid, "socket": str(home / "s")}))


def test_a_broker_registering_during_the_backoff_ends_it_at_the_next_look(tmp_path: Path) -> None:
    """The old broker's record is removed as it stops; the new one's appears during the third
    look's sleep: the wait ends there, not at the backoff's end (2 s, BACKOFF_MAX)."""
    register(tmp_path, 111)
    clock = Clock()
    clock.at[1] = lambda: (tmp_path / paths.BROKER_JSON).unlink()
    clock.at[3] = lambda: register(tmp_path, 222)
    wait_for_broker(tmp_path, 2.0, clock.sleep, clock)
    assert clock.sleeps == [BROKER_LOOK] * 3
    assert clock.now - 1000.0 < 2.0


def test_a_record_rewritten_in_place_is_new_too(tmp_path: Path) -> None:
    """A new broker's record replacing one left behind (a killed broker never removes it)."""
    register(tmp_path, 111)
    clock = Clock()
    clock.at[2] = lambda: register(tmp_path, 222)
    wait_for_broker(tmp_path, 2.0, clock.sleep, clock)
    assert len(clock.sleeps) == 2


def test_without_a_new_record_the_backoff_runs_out_and_no_further(tmp_path: Path) -> None:
    """No record, the same record, or a record removed: the whole backoff, its last sleep cut
    to what was left of it."""
    for setup in (lambda: None, lambda: register(tmp_path, 111)):
        setup()
        clock = Clock()
        clock.at[4] = lambda: (tmp_path / paths.BROKER_JSON).unlink(missing_ok=True)
        wait_for_broker(tmp_path, 0.45, clock.sleep, clock)
        assert abs(sum(clock.sleeps) - 0.45) < 1e-9, clock.sleeps
        assert len(clock.sleeps) == 5 and max(clock.sleeps) <= BROKER_LOOK


def test_the_identity_changes_with_every_write_of_the_record(tmp_path: Path) -> None:
    """What the look compares: a write replaces the file (a new inode, os.replace), so even a
    record of the same size written within the same clock tick differs."""
    assert connector._broker_json_identity(tmp_path) is None
    register(tmp_path, 111)
    first = connector._broker_json_identity(tmp_path)
    register(tmp_path, 222)
    assert first is not None and connector._broker_json_identity(tmp_path) not in (None, first)

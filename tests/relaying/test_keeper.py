"""The connection keeper's decisions (agent_bridge.relay.keeper) under a mock clock: when to
start a broker, how long to wait between tries, what a refusal and a failed start leave behind."""

from __future__ import annotations

import pytest

from agent_bridge.relay import keeper as k
from agent_bridge.relay.keeper import Keeper

FILES = ((1, 2, 3), None)  # the start files' identity, as paths.start_files_identity gives it


def test_no_broker_registered_starts_one_at_once_and_waits_longer_after_each_miss():
    keeper = Keeper()
    assert keeper.start_due(now=100.0, found=False)
    waits = [keeper.missed(100.0 + i) for i in range(8)]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]  # doubling up to BACKOFF_MAX
    keeper.joined()
    assert keeper.missed(200.0) == k.BACKOFF_START


def test_a_registered_broker_that_stays_silent_is_restarted_after_restart_after():
    keeper = Keeper()
    assert not keeper.start_due(now=10.0, found=True)  # never missed yet: connect first
    keeper.missed(10.0)
    assert not keeper.start_due(now=10.0 + k.RESTART_AFTER, found=True)
    assert keeper.start_due(now=10.0 + k.RESTART_AFTER + 0.01, found=True)
    keeper.missed(13.0)  # a later miss does not move when it went down
    assert keeper.down_since == 10.0


def test_failed_starts_back_off_then_give_up_and_say_why():
    keeper = Keeper()
    now = 0.0
    for attempt in range(1, k.START_ATTEMPTS + 1):
        assert keeper.start_due(now, found=False), attempt
        keeper.start_failed("the database is newer than this agent-bridge", now, None)
        assert keeper.known
        delay = k.START_BACKOFF_FIRST * 2 ** (attempt - 1)
        assert not keeper.start_due(now + delay - 0.01, found=False)
        now += delay
        assert "trying again" in keeper.unreachable() or attempt == k.START_ATTEMPTS
    assert not keeper.start_due(now + 3600, found=False)  # gave up
    assert keeper.unreachable() == (
        "the agent-bridge broker cannot start: the database is newer than this agent-bridge; gave up "
        f"after {k.START_ATTEMPTS} attempts: fix that, then run `agent-bridge up` (this session connects "
        "once it runs)")
    keeper.joined()  # someone ran `agent-bridge up`
    assert not keeper.known and keeper.unreachable() == k.NOT_REACHABLE
    assert keeper.start_due(now, found=False)


def test_a_permanent_refusal_holds_until_the_files_it_was_about_change():
    keeper = Keeper()
    keeper.start_failed("cannot write the state folder (permanent: fix it)", 0.0, FILES)
    assert "gave up until that changes" in keeper.unreachable()
    assert keeper.still_blocked(FILES)
    assert keeper.still_blocked(FILES)  # asking does not wear it out
    changed = ((1, 2, 4), None)
    assert not keeper.still_blocked(changed)
    assert keeper.blocked_until_changed is None and keeper.start_attempts == 0
    assert keeper.start_due(0.0, found=False)  # tried again as if for the first time


def test_a_refusal_waits_longer_each_time_and_restarts_nothing():
    keeper = Keeper()
    keeper.missed(0.0)
    first, wait = keeper.refused_by("another connection serves host session hs-1")
    assert first and wait == k.REFUSED_BACKOFF_START
    assert keeper.down_since is None  # the broker is up: nothing to restart
    assert not keeper.start_due(100.0, found=True)
    waits = [keeper.refused_by("again")[1] for _ in range(8)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert not keeper.refused_by("again")[0]  # logged once
    assert keeper.unreachable() == "agent-bridge: this session is not connected: again"
    keeper.joined()
    assert keeper.refused is None and keeper.refused_by("x")[1] == k.REFUSED_BACKOFF_START


@pytest.mark.parametrize("found", [True, False])
def test_a_joined_keeper_starts_nothing_until_it_misses_again(found):
    keeper = Keeper()
    keeper.start_failed("x", 0.0, None)
    keeper.joined()
    assert keeper.start_due(0.0, found=False)  # nothing registered: start
    assert not keeper.start_due(0.0, found=True)  # registered and answering

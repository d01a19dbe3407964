"""The `initialize` replay rule (agent_bridge.relay.replay): what a joining broker hears
first, and which answers are not the host's."""

from __future__ import annotations

import json

from agent_bridge.core import showing
from agent_bridge.relay.replay import Replay

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {"experimental": {"claude/channel": {}}}}}


def test_an_initialize_not_answered_yet_is_not_replayed_its_answer_is_the_hosts():
    replay = Replay()
    replay.host_request("initialize", INIT)
    assert replay.lines() == []
    assert not replay.swallowed(showing.key(1))


def test_an_answered_initialize_is_replayed_with_what_followed_and_those_answers_are_dropped_once():
    replay = Replay()
    replay.host_request("initialize", INIT)
    replay.answered("initialize")
    replay.host_notification("notifications/initialized")
    replay.host_request("logging/setLevel", {"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel",
                                             "params": {"level": "debug"}})
    lines = [json.loads(line) for line in replay.lines()]
    assert [m["method"] for m in lines] == ["initialize", "notifications/initialized", "logging/setLevel"]
    assert lines[0]["params"] == INIT["params"] and lines[2]["params"] == {"level": "debug"}
    ids = [m["id"] for m in lines if "id" in m]
    assert all(isinstance(i, str) and i.startswith("agent-bridge-replay-") for i in ids)
    assert 1 not in ids
    for rid in ids:
        assert replay.swallowed(showing.key(rid))
        assert not replay.swallowed(showing.key(rid))  # once
    again = [json.loads(line)["id"] for line in replay.lines() if '"id"' in line]
    assert set(again).isdisjoint(ids)  # each replay has ids of its own


def test_an_initialize_the_relay_refused_alone_is_not_replayed():
    replay = Replay()
    replay.host_request("initialize", INIT)
    replay.answered("initialize", ok=False)
    assert replay.lines() == []


def test_an_initialize_answered_alone_as_a_broker_joins_is_handed_to_it():
    """The race a slow first connection allows: the relay notes its own answer first, then the
    joining broker asks for the replay, and gets the initialize."""
    replay = Replay()
    replay.host_request("initialize", INIT)
    replay.answered("initialize", ok=True)
    assert json.loads(replay.lines()[0])["method"] == "initialize"


def test_a_lost_broker_takes_the_swallowed_answers_with_it():
    replay = Replay()
    replay.host_request("initialize", INIT)
    replay.answered("initialize")
    rid = json.loads(replay.lines()[0])["id"]
    replay.lost()
    assert not replay.swallowed(showing.key(rid))


def test_a_bad_log_level_is_not_replayed():
    replay = Replay()
    replay.host_request("initialize", INIT)
    replay.answered("initialize")
    replay.host_request("logging/setLevel", {"jsonrpc": "2.0", "id": 3, "method": "logging/setLevel",
                                             "params": "loud"})
    assert [json.loads(line)["method"] for line in replay.lines()] == ["initialize"]

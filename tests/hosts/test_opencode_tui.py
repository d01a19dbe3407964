"""The interactive opencode (its TUI, in tmux) on the bridge, offline as in test_opencode.py: an
idle session is woken by a message with no keystroke (the plugin's `promptAsync` at
`session.idle`, and while idle, watching the broker's post box), and a turn cut short with Esc
(opencode 1.18.33: "esc again to interrupt", then the turn says "interrupted") counts as idle
and loses nothing: a message that came during the turn is not acknowledged before opencode
took it, and the idle that follows the abort hands it over. One TUI process for all of it (a
start costs 8-14 s here)."""

from __future__ import annotations

import json
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts.conftest import GATE_STEP, Tui, plan, poll_until
from tests.hosts.test_opencode import OFFLINE_ENV, OpencodeWorld, open_opencode_world, state_of

# serial: a TUI under tmux, read from its screen as a person would (nox runs these in its second pass)
pytestmark = [pytest.mark.slow, pytest.mark.serial]


@pytest.fixture
def oc(host_bin: Path) -> Iterator[OpencodeWorld]:
    with open_opencode_world(host_bin) as ow:
        yield ow


def opencode_tui(oc: OpencodeWorld) -> Tui:
    """`opencode` (its TUI) in the project folder, in a private tmux server."""
    w = oc.world
    env = {**w.base_env(), **OFFLINE_ENV, "TERM": "xterm-256color"}
    script = w.root / f"opencode-tui-{uuid.uuid4().hex[:8]}.sh"
    script.write_text(
        "#!/bin/sh\n"
        + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        + f"cd {shlex.quote(str(w.project))}\n"
        + shlex.join(["exec", str(w.host_bin / "opencode")]) + "\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    tui = Tui(f"ab-oc-{uuid.uuid4().hex[:8]}", w.root / "opencode-tui.log")
    w.tuis.append(tui)
    tui.start(str(script))
    poll_until(lambda: "ctrl+p commands" in tui.screen(), "the opencode TUI", timeout=90)
    return tui


def test_the_tui_is_woken_when_idle_and_an_esc_loses_nothing(oc: OpencodeWorld) -> None:
    w = oc.world
    tui = opencode_tui(oc)
    tui.type(plan(("whoami", {})))
    [peer] = poll_until(lambda: [p for p in w.peers() if p["agent"] == "opencode" and p["hostSessionId"]],
                        "the TUI session's identity", timeout=60)
    session = peer["hostSessionId"]
    poll_until(lambda: state_of(w, peer["id"]) == "idle", "the session idle after its turn", timeout=60)

    # Idle: a message starts a turn, no keystroke; acknowledged once opencode took it, wake confirmed.
    before = len(oc.model.of_session(session))
    text = "claude here: the TUI is idle, look"
    w.bridge("send", peer["name"], text)
    woken = poll_until(lambda: [r for r in oc.model.of_session(session)[before:] if text in r.text],
                       "the woken turn's request", timeout=60)
    users = [m for m in woken[0].body["messages"] if m.get("role") == "user" and text in json.dumps(m)]
    assert users and "not from the user" in json.dumps(users[-1])
    poll_until(lambda: [r for r in w.receipts(session) if r["ackedAt"]], "the acknowledgement", timeout=30)
    poll_until(lambda: [r["woken"] for r in json.loads(w.bridge("sent", "--json").stdout)] == ["confirmed"],
               "the wake confirmed in the sender's receipt")
    poll_until(lambda: state_of(w, peer["id"]) == "idle", "idle again after the woken turn", timeout=60)

    # Esc mid-turn: the turn is held at the model; a message comes meanwhile and waits, unacknowledged.
    tui.type(plan(("whoami", {}), GATE_STEP("esc"), ("whoami", {})))
    oc.model.wait_reached("esc")
    poll_until(lambda: state_of(w, peer["id"]) == "busy", "the session marked busy")
    later = "codex here: sent while you worked"
    w.bridge("send", peer["name"], later)
    held = [r for r in w.receipts(session) if r["ackedAt"] is None]
    assert len(held) == 1 and not any(later in r.text for r in oc.model.of_session(session))
    tui.tmux("send-keys", "Escape")
    poll_until(lambda: "esc again to interrupt" in tui.screen(), "opencode asking for a second Esc")
    tui.tmux("send-keys", "Escape")
    poll_until(lambda: "interrupted" in tui.screen(), "the turn cut short")
    oc.model.open_gate("esc")  # the held request's client is gone: nothing more comes of it
    # the abort ends in idle: the plugin hands the waiting message over in a new turn, once
    shown = poll_until(lambda: [r for r in oc.model.of_session(session) if later in r.text],
                       "the message after the Esc", timeout=60)
    assert sum(later in json.dumps(m) for m in shown[0].body["messages"] if m.get("role") == "user") == 1
    poll_until(lambda: all(r["ackedAt"] for r in w.receipts(session)), "acknowledged once opencode took it",
               timeout=30)
    assert tui.running()

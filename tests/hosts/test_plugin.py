"""agent-bridge as a plugin (hosts/plugin.py), installed by `agent-bridge install --plugin` through
the real hosts' own plugin commands from the package's folder, and used by real sessions offline:
Claude Code (`claude -p`), Codex (`codex exec`, with no hook-trust bypass) and GitHub Copilot CLI.
One world per host, each run checking several things (each host run costs seconds)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_bridge.hosts import plugin
from tests.hosts.conftest import (
    BRIDGE_TOOLS,
    World,
    claude_note,
    claude_system_texts,
    codex_messages,
    codex_outputs,
    open_world,
    plan,
    poll_until,
)
from tests.hosts.models import GATE, ChatServer

pytestmark = pytest.mark.slow

DECISION = ("db", "PostgreSQL 16 for every service")
# What Claude Code keeps in ~/.claude for itself whatever is installed (seen with 2.1.332): a
# backup of ~/.claude.json, telemetry it could not send offline, its sessions' transcripts and
# shell snapshots, its built-in plugins' store. `uninstall --plugin` leaves every other byte of
# ~/.claude as it was.
CLAUDE_OWN = ("backups/", "telemetry/", "projects/", "shell-snapshots/", "session-env/", "todos/",
              "statsig/", "debug/", "file-history/", "paste-cache/", "plans/", "tasks/", "plugins/store/",
              ".last-cleanup")


@pytest.fixture
def plugin_world(host_bin: Path) -> Iterator[World]:
    with open_world(host_bin, plugin=True) as w:
        yield w


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def doctor_lines(world: World) -> list[str]:
    return world.bridge("doctor", check=False).stdout.splitlines()


def test_claude_code_plugin(plugin_world: World) -> None:
    """Installed from the package's folder by the host's own commands, twice (the second says
    nothing to change); doctor names it, and flags the config-edit install beside it. In `claude
    -p`: the session joins the bridge under the plugin's tool names, its SessionStart note carries
    the owner's decision, a message sent mid-turn is in the next request (PostToolUse), one sent
    at the turn's end is handed over by the Stop hook. Uninstall leaves ~/.claude as it was."""
    world = plugin_world
    claude_dir = world.home / ".claude"
    claude_dir.mkdir()
    (claude_dir / "settings.json").write_text('{\n  "theme": "dark"\n}\n', encoding="utf-8")
    before = snapshot(claude_dir)

    first = world.bridge("install", "--plugin", "--claude").stdout
    assert "installed and enabled the plugin agent-bridge@agent-bridge" in first, first
    again = world.bridge("install", "--plugin", "--claude").stdout
    assert again.startswith("agent-bridge install: nothing to change"), again
    settings = json.loads((claude_dir / "settings.json").read_text(encoding="utf-8"))
    assert settings["extraKnownMarketplaces"]["agent-bridge"]["source"]["path"] == str(plugin.FOLDER)
    doctor = doctor_lines(world)
    assert any("Claude Code plugin" in line and "ok" in line and plugin.ID in line for line in doctor), (
        "\n".join(doctor))

    world.bridge("decide", *DECISION)
    sid = str(uuid.uuid4())
    run = world.claude(plan(("whoami", {}), (GATE, {"gate": "mid"}), ("peers", {}), (GATE, {"gate": "end"})),
                       session_id=sid)
    world.claude_model.wait_reached("mid")
    known = len(world.claude_model.turns_of(sid))
    world.bridge("send", sid, "mid-turn: rebase first")
    world.claude_model.open_gate("mid")
    world.claude_model.wait_reached("end")
    world.bridge("send", sid, "at the end: the schema changed")
    world.claude_model.open_gate("end")
    run.wait()

    requests = world.claude_model.turns_of(sid)
    note = claude_note(requests[0].body)
    assert note.startswith("agent-bridge:") and DECISION[1] in note, claude_system_texts(requests[0].body)
    assert "mcp__plugin_agent-bridge_agent-bridge__send" in note, note  # the tools by the names it sees
    assert all(f"mcp__plugin_agent-bridge_agent-bridge__{t}" in requests[0].text for t in ("send", "inbox"))
    assert "mcp__agent-bridge__" not in requests[0].text  # no second server: only the plugin's
    assert [(p["hostSessionId"], p["project"]) for p in world.peers() if p["hostSessionId"]] == [
        (sid, str(world.project))]
    mid = next(r for r in requests if "rebase first" in r.text)
    assert requests.index(mid) == known  # the very next request, after the next tool call
    assert any(t.startswith("PostToolUse:") for t in claude_system_texts(mid.body) if "rebase first" in t)
    assert "schema changed" not in mid.text
    end = next(r for r in requests if "schema changed" in r.text)
    assert "Stop hook additional context" in end.text
    poll_until(lambda: all(r["ackedAt"] for r in world.receipts(sid)) and len(world.receipts(sid)) == 2,
               "both messages acknowledged")

    # Both ways at once: the host would run every hook twice.
    plain = world.bridge("install", "--claude").stderr
    assert "Claude Code also has agent-bridge as a plugin" in plain, plain
    doctor = doctor_lines(world)
    both = [line for line in doctor if "installed twice" in line]
    assert both and both[0].lstrip().startswith("warn"), doctor
    world.bridge("uninstall", "--claude")

    gone = world.bridge("uninstall", "--plugin", "--claude").stdout
    assert "uninstalled the plugin agent-bridge@agent-bridge" in gone, gone
    assert "removed the marketplace" in gone, gone
    after = {k: v for k, v in snapshot(claude_dir).items() if not k.startswith(CLAUDE_OWN)}
    assert after == before, sorted(set(after) ^ set(before)) or [k for k in after if after[k] != before[k]]
    assert "nothing to change" in world.bridge("uninstall", "--plugin", "--claude").stdout


def test_codex_plugin(plugin_world: World) -> None:
    """`codex plugin add` from the package's folder; install trusts the plugin's hooks, so `codex
    exec` runs them with no bypass flag: the SessionStart note carries the decision, a message
    sent mid-turn is in the next request, one sent at the turn's end comes at its Stop. Uninstall
    leaves config.toml as it was; install twice says nothing to change."""
    world = plugin_world
    config = world.codex_home / "config.toml"
    before = config.read_text(encoding="utf-8")
    first = world.bridge("install", "--plugin", "--codex").stdout
    assert "trusted the plugin's 5 hooks" in first, first
    installed = config.read_text(encoding="utf-8")
    config.write_text(installed[: installed.index("\n[hooks.state.")] + "\n", encoding="utf-8")  # untrusted
    doctor = doctor_lines(world)
    assert any("Codex plugin" in line and "does not trust 5" in line for line in doctor), doctor
    assert "trusted the plugin's 5 hooks" in world.bridge("install", "--plugin", "--codex").stdout
    assert config.read_text(encoding="utf-8") == installed
    assert world.bridge("install", "--plugin", "--codex").stdout.startswith("agent-bridge install: nothing")
    doctor = doctor_lines(world)
    assert any("Codex plugin" in line and "ok" in line for line in doctor), doctor

    world.bridge("decide", *DECISION)
    run = world.codex(plan(("whoami", {}), (GATE, {"gate": "mid"}), ("peers", {}), (GATE, {"gate": "end"})))
    world.codex_model.wait_reached("mid")
    thread = next(p["hostSessionId"] for p in world.peers() if p["hostSessionId"])
    known = len(world.codex_model.of_session(thread))
    world.bridge("send", thread, "mid-turn: rebase first")
    world.codex_model.open_gate("mid")
    world.codex_model.wait_reached("end")
    world.bridge("send", thread, "at the end: the schema changed")
    world.codex_model.open_gate("end")
    run.wait()
    assert "--dangerously-bypass-hook-trust" not in run.proc.args  # type: ignore[operator]

    requests = world.codex_model.of_session(thread)
    notes = [t for t in codex_messages(requests[0].body, "developer") if t.startswith("agent-bridge:")]
    assert notes and DECISION[1] in notes[0], codex_messages(requests[0].body, "developer")
    assert json.loads(codex_outputs(requests[-1].body)[0][0])["hostSessionId"] == thread
    assert [p["project"] for p in world.peers() if p["hostSessionId"]] == [str(world.project)]
    mid = next(r for r in requests if "rebase first" in r.text)
    assert requests.index(mid) == known and "schema changed" not in mid.text
    assert any("schema changed" in r.text for r in requests)
    poll_until(lambda: len([r for r in world.receipts(thread) if r["ackedAt"]]) == 2, "both acknowledged")

    gone = world.bridge("uninstall", "--plugin", "--codex").stdout
    assert "removed the plugin agent-bridge@agent-bridge" in gone and "trust entries" in gone, gone
    assert config.read_text(encoding="utf-8") == before
    assert not (world.codex_home / "plugins" / "cache" / plugin.NAME).exists()


COPILOT_ENV = {"COPILOT_OFFLINE": "true", "COPILOT_MODEL": "fake-model"}


def test_copilot_cli_plugin(plugin_world: World) -> None:
    """GitHub Copilot CLI installs the same plugin with its own commands from the package's
    folder, and its model gets every bridge tool (`agent-bridge-<tool>`), which answers. Its hooks
    run (SessionStart, UserPromptSubmit, PostToolUse, Stop: Copilot's own events), but with
    Copilot's input (`sessionId`, not `session_id`) and answers it does not pass on: no note, no
    message reaches its model; messages wait, not acknowledged, for `inbox`. It starts the server
    in the plugin's folder, which the session takes for its project. The README's reach table
    says this of Copilot CLI."""
    world = plugin_world
    env = {**world.base_env(), **COPILOT_ENV}
    copilot = str(world.host_bin / "copilot")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([copilot, *args], env=env, cwd=world.project, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr + done.stdout
        return done

    run("plugin", "marketplace", "add", str(plugin.FOLDER))
    assert "installed successfully" in run("plugin", "install", plugin.ID).stdout
    model = ChatServer().start()
    model.separator = "-"
    try:
        env["COPILOT_PROVIDER_BASE_URL"] = f"{model.url}/v1"
        world.bridge("decide", *DECISION)
        steps = plan(("whoami", {}), (GATE, {"gate": "mid"}), ("peers", {}), (GATE, {"gate": "end"}))
        proc = subprocess.Popen([copilot, "-p", steps, "--allow-all-tools"], env=env, cwd=world.project,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        world.procs.append(proc)
        model.wait_reached("mid")
        session = next(p for p in world.peers() if p["agent"] == "claude")
        world.bridge("send", session["id"], "mid-turn: rebase first")
        model.open_gate("mid")
        model.wait_reached("end")
        world.bridge("send", session["id"], "at the end: the schema changed")
        model.open_gate("end")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err + out
    finally:
        model.close()
    listed = {t.get("function", {}).get("name") for t in model.requests[0].body.get("tools") or ()}
    assert {f"agent-bridge-{t}" for t in BRIDGE_TOOLS} <= listed, listed
    answers = [m for m in model.requests[-1].body.get("messages") or () if m.get("role") == "tool"]
    assert len(answers) == 2 and json.loads(answers[0]["content"])["name"] == session["name"], answers
    assert session["project"] == str(plugin.FOLDER / plugin.NAME)  # where Copilot starts the server
    texts = " ".join(r.text for r in model.requests)
    assert DECISION[1] not in texts and "rebase first" not in texts and "schema changed" not in texts
    sent = json.loads(world.bridge("sent", "--json").stdout)
    assert [m["state"] for m in sent] == ["queued", "queued"], sent  # nothing acknowledged unseen
    events = [json.loads(line) for f in (world.home / ".copilot" / "session-state").glob("*/events.jsonl")
              for line in f.read_text(encoding="utf-8").splitlines()]
    ran = {e["data"]["hookType"] for e in events if e.get("type") == "hook.end" and e["data"].get("success")}
    assert ran == {"sessionStart", "userPromptSubmitted", "postToolUse", "agentStop"}, ran
    inputs = [e["data"]["input"] for e in events if e.get("type") == "hook.start"]
    assert all("sessionId" in i and "session_id" not in i for i in inputs), inputs


@pytest.mark.serial  # a TUI under tmux
def test_claude_code_plugin_wakes_an_idle_tui(plugin_world: World) -> None:
    """The plugin's idle-wake waiter (its asyncRewake Stop hook) wakes an idle Claude Code TUI:
    a message sent after the turn ended runs a new turn with no keystroke."""
    from tests.hosts.test_claude_tui import exit_tui, ready, session_mark, waiters_held

    world = plugin_world
    world.bridge("install", "--plugin", "--claude")
    sid = str(uuid.uuid4())
    tui = world.claude_tui(sid)
    poll_until(lambda: ready(world, tui, sid), "the TUI's prompt and its MCP server")
    tui.type(plan(("whoami", {})))
    poll_until(lambda: waiters_held(world) == 1 and session_mark(world, sid).startswith("idle "),
               "the turn's Stop, the waiter armed")
    before = len(world.claude_model.turns_of(sid))
    world.bridge("send", sid, "idle wake: are you there?")
    woke = poll_until(lambda: next((r for r in world.claude_model.turns_of(sid)[before:]
                                    if "are you there?" in r.text), None), "the idle session woken")
    assert "not from the user" in woke.text
    poll_until(lambda: all(r["ackedAt"] for r in world.receipts(sid)), "the wake acknowledged")
    woken = {r["text"]: r["woken"] for r in json.loads(world.bridge("sent", "--json").stdout)}
    assert woken == {"idle wake: are you there?": "confirmed"}, woken
    exit_tui(world, tui)

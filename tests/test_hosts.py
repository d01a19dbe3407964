"""The hosts registry: every host module answers everything the rest of the code asks of a host,
and the CLI, install and the process matcher take their hosts from it."""

from __future__ import annotations

import inspect
import json

import pytest

from agent_bridge import hosts
from agent_bridge.cli import main as cli
from agent_bridge.hooks.common import HookInput
from agent_bridge.hosts import claude
from agent_bridge.hosts.base import Host

# Host's defaults: the form both hosts document
HOOK_ANSWERS = {
    "session_start_output",
    "stop_output",
    "post_tool_use_output",
    "runs_waiter",
    "user_prompt_output",
}
HOST_METHODS = sorted(
    name for name, value in vars(Host).items()
    if inspect.isfunction(value) and not name.startswith("_") and name not in HOOK_ANSWERS
)
DOCUMENTED_HOOK_ANSWERS = {"claude", "codex"}  # hosts whose hook answers were checked against their docs


@pytest.mark.parametrize("host", hosts.ALL, ids=hosts.NAMES)
def test_every_host_module_implements_the_whole_interface(host):
    missing = [name for name in HOST_METHODS if getattr(type(host), name) is getattr(Host, name)]
    assert not missing, f"{host.name} lacks {missing}"
    for attribute in ("name", "title", "process_prefixes", "exclusive"):
        assert hasattr(host, attribute), attribute


def test_names_are_unique_and_usable_as_flags():
    assert len(set(hosts.NAMES)) == len(hosts.NAMES)
    assert all(name.isidentifier() and name.islower() for name in hosts.NAMES)


@pytest.mark.parametrize("host", hosts.ALL, ids=hosts.NAMES)
def test_cli_offers_every_registered_host(host):
    parser = cli.build_parser()
    assert parser.parse_args(["hook", "stop", "--agent", host.name]).agent == host.name
    assert getattr(parser.parse_args(["install", f"--{host.name}"]), host.name) is True
    assert getattr(parser.parse_args(["uninstall", f"--{host.name}"]), host.name) is True


def test_process_names_map_to_their_host():
    assert hosts.for_process("claude") is hosts.by_name("claude")
    assert hosts.for_process("node", "codex") is hosts.by_name("codex")
    assert hosts.for_process("node", "sh", "") is None
    assert hosts.by_name("gemini") is None


def test_every_host_had_its_hook_answers_checked():
    assert set(hosts.NAMES) == DOCUMENTED_HOOK_ANSWERS, "check the new host's hook answers against its docs"


@pytest.mark.parametrize("host", hosts.ALL, ids=hosts.NAMES)
def test_hook_outputs_are_the_documented_shapes(host):
    # Claude Code "Hooks reference" and Codex's *.command.output.schema.json document the same two shapes.
    assert host.session_start_output("note") == {
        "hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "note"}
    }
    assert host.stop_output("why") == {"decision": "block", "reason": "why"}
    assert host.post_tool_use_output("mail") == {
        "hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "mail"}
    }
    assert host.user_prompt_output("asked") == {
        "hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": "asked"}
    }


def test_only_a_person_types_claude_codes_prompts_outside_p():
    assert claude.HOST.owner_types({"CLAUDE_CODE_ENTRYPOINT": "cli"}) is True
    assert claude.HOST.owner_types({"CLAUDE_CODE_ENTRYPOINT": "sdk-cli"}) is False


def transcript(tmp_path, *entries: object, junk: bytes = b"") -> str:
    path = tmp_path / "session.jsonl"
    path.write_bytes(junk + b"".join(json.dumps(e).encode() + b"\n" for e in entries))
    return str(path)


def stop_hook_input(transcript_path: str) -> HookInput:
    return HookInput("sid", "/w/app", "", False, transcript_path)


@pytest.mark.parametrize(("version", "answer"), [
    ("2.1.332", "context"), ("2.1.163", "context"), ("3.0.0", "context"),
    ("2.1.162", "block"), ("2.0.99", "block"), ("1.9.999", "block"),
    (None, "block"), ("2.1", "block"), ("v2.1.332", "block"), (2.1, "block"),
])
def test_claude_stop_answer_follows_the_version_in_the_transcript(tmp_path, version, answer):
    """Claude Code 2.1.163 and later take additionalContext on Stop (shown without an error
    label, checked with 2.1.332 in tests/hosts); older or unknown versions get the block
    decision, which every version takes. The version is the newest transcript entry's."""
    entries: list[object] = [{"type": "user", "version": "1.0.0"}, {"type": "assistant", "version": version},
                             {"type": "last-prompt", "lastPrompt": "hi"}]
    if version is None:
        entries[1] = {"type": "assistant"}
    path = transcript(tmp_path, *entries)
    got = hosts.by_name("claude").stop_output("why", stop_hook_input(path))
    if answer == "context":
        assert got == {"hookSpecificOutput": {"hookEventName": "Stop", "additionalContext": "why"}}
    else:
        assert got == {"decision": "block", "reason": "why"}


def test_claude_transcript_version_reads_only_the_tail_and_skips_bad_lines(tmp_path):
    big = {"type": "user", "version": "2.0.0", "text": "x" * (200 << 10)}  # a line longer than one tail step
    path = transcript(tmp_path, big, {"type": "assistant", "version": "2.1.332"}, junk=b"garbage\n")
    assert claude.transcript_version(path) == (2, 1, 332)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(json.dumps(big).encode() + b'\n{"type": "assistant", "version": "2.1.3')  # being written
    assert claude.transcript_version(str(cut)) == (2, 0, 0)
    assert claude.transcript_version(str(tmp_path / "missing.jsonl")) is None
    assert claude.transcript_version("") is None
    assert hosts.by_name("claude").stop_output("why") == {"decision": "block", "reason": "why"}


def test_codex_stop_answer_is_always_the_block_decision(tmp_path):
    """Codex 0.171 documents no additionalContext on Stop (stop.command.output.schema.json)."""
    path = transcript(tmp_path, {"type": "assistant", "version": "2.1.332"})
    assert hosts.by_name("codex").stop_output("why", stop_hook_input(path)) == {
        "decision": "block",
        "reason": "why",
    }


def test_codex_wakes_by_default_only_in_its_tui_unless_told(tmp_path, monkeypatch):
    """Codex's idle wake (a waiter running `codex queue`) is on by default, and then only while the
    TUI runs (an interactive Codex's daemon outlives its TUI and would run a queued message's turn
    unwatched); AGENT_BRIDGE_CODEX_WAKE=0 turns it off, =1 wakes where no TUI is known too."""
    (tmp_path / "codex").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "codex").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    codex = hosts.by_name("codex")
    hook = HookInput("thread-1", "/w/app", "", False)
    assert codex.spawned_waiter and not hosts.by_name("claude").spawned_waiter
    assert codex.runs_waiter(hook, {}) and codex.wakes_only_in_front({})
    assert codex.runs_waiter(hook, {"AGENT_BRIDGE_CODEX_WAKE": "yes"})
    assert not codex.runs_waiter(hook, {"AGENT_BRIDGE_CODEX_WAKE": "0"})
    assert codex.runs_waiter(hook, {"AGENT_BRIDGE_CODEX_WAKE": "1"})
    assert not codex.wakes_only_in_front({"AGENT_BRIDGE_CODEX_WAKE": "1"})
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert not codex.runs_waiter(hook, {})  # no codex to queue with


def test_claude_queued_prompts_counts_the_transcripts_queue_operations(tmp_path):
    """A prompt typed while a turn runs: "enqueue" once its UserPromptSubmit hook has run,
    "dequeue" when it runs (Claude Code 2.1.332 TUI)."""
    path = tmp_path / "t.jsonl"

    def write(*ops: str) -> str:
        lines = [json.dumps({"type": "assistant", "version": "2.1.332"}), "not json {\"queue-operation\""]
        lines += [json.dumps({"type": "queue-operation", "operation": op, "content": "x"}) for op in ops]
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    assert claude.queued_prompts(write()) == 0
    assert claude.queued_prompts(write("enqueue")) == 1
    assert claude.queued_prompts(write("enqueue", "dequeue")) == 0
    assert claude.queued_prompts(write("dequeue", "enqueue")) == 1  # a dequeue of what came before the tail
    assert claude.queued_prompts(write("enqueue", "enqueue", "remove")) == 1
    assert claude.queued_prompts(str(tmp_path / "missing.jsonl")) == 0
    assert claude.queued_prompts("") == 0


def test_doctor_says_codex_wakes_by_default_and_when_it_does_not():
    from agent_bridge.hosts.codex_doctor import codex_wake_text

    default = codex_wake_text(None)
    assert "on by default" in default and "does not fire" in default and "codex exec" in default
    assert codex_wake_text("0").startswith("off")
    assert "no TUI is known" in codex_wake_text("1")

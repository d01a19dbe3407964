"""The hosts registry: every host module answers everything the rest of the code asks of a host,
and the CLI, install and the process matcher take their hosts from it."""

from __future__ import annotations

import inspect

import pytest

from agent_bridge import cli, hosts
from agent_bridge.hosts.base import Host

HOOK_ANSWERS = {"session_start_output", "stop_output"}  # Host's defaults: the form both hosts document
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

"""The `agent-bridge` command (SPEC §2).

Light on purpose: nothing heavy at import time, and `hook` and `mcp` skip argparse altogether. Each command
imports what it needs when it runs, so `agent-bridge hook …` never loads trio, mcp, quart or hypercorn.

This module is the entry point (`main`), the two fast paths and what each command runs; the command
line's shape and help texts are cli.parser.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING

from agent_bridge import hosts
from agent_bridge.cli import parser as command_line

if TYPE_CHECKING:
    import argparse

    from agent_bridge.relay.main import Handed


def _run_slash(ns: argparse.Namespace) -> int:
    """`agent-bridge slash NAME`: the owner command for the arguments on stdin, as typed."""
    from agent_bridge.hosts import slash

    try:
        args = slash.typed_argv(ns.name, sys.stdin.read(slash.ARGS_MAX + 1))
    except slash.SlashError as exc:
        print(f"agent-bridge {ns.name}: {exc}", file=sys.stderr)
        return 2
    return _main(args)


def _up(ns: argparse.Namespace) -> int:
    from agent_bridge.broker import control

    return control.up(detach=ns.detach)


def _down(ns: argparse.Namespace) -> int:
    from agent_bridge.broker import control

    return control.down()


def _status(ns: argparse.Namespace) -> int:
    from agent_bridge.broker import control

    return control.status(as_json=ns.json)


def _mcp(ns: argparse.Namespace) -> int:
    from agent_bridge.relay import main as relay

    return relay.command(ns, ns.handed)


# Commands that use the state folder named by AGENT_BRIDGE_HOME (or the default): each refuses a
# folder another user owns before touching anything in it (paths.check_home). `demo` checks the
# folder it is given itself; `doctor` reports such a folder and reads nothing in it; `install` and
# `uninstall` keep their backups and record there.
HOME_COMMANDS = frozenset(
    {
        "up",
        "down",
        "status",
        "mcp",
        "hook",
        "dashboard",
        "decisions",
        "search",
        "decide",
        "send",
        "sent",
        "retract",
        "sessions",
        "forget",
        "questions",
        "answer",
        "inbox",
        "slash",
        "jobs",
        "install",
        "uninstall",
        "machine",
    }
)


def _refuse_foreign_home(command: str) -> int | None:
    """None when the state folder may be used; else the exit code, after one line on stderr.
    A hook exits 0 even then: a hook never breaks its host's session."""
    from agent_bridge.common import paths

    try:
        paths.check_home(paths.home())
    except paths.HomeError as exc:
        print(f"agent-bridge {command}: {exc}", file=sys.stderr)
        return 0 if command == "hook" else 1
    return None


def _hook(ns: argparse.Namespace) -> int:
    refused = _refuse_foreign_home("hook")
    if refused is not None:
        return refused
    if ns.event == "session-start":
        from agent_bridge.hooks import session_start

        return session_start.main(ns.agent)
    if ns.event == "post-tool-use":
        from agent_bridge.hooks import post_tool_use

        return post_tool_use.main(ns.agent)
    if ns.event == "wake":
        from agent_bridge.hooks import wake

        return wake.main(ns.agent)
    if ns.event == "user-prompt-submit":
        from agent_bridge.hooks import user_prompt_submit

        return user_prompt_submit.main(ns.agent)
    if ns.event == "interrupt":
        from agent_bridge.hooks import interrupt

        return interrupt.main(ns.agent)
    from agent_bridge.hooks import stop

    return stop.main(ns.agent)


def _dashboard(ns: argparse.Namespace) -> int:
    from agent_bridge.dashboard import standalone

    return standalone.main(open_browser=ns.open)


def _decisions(ns: argparse.Namespace) -> int:
    from agent_bridge.cli import reads

    return reads.decisions_command(ns.query, ns.scope, ns.history, ns.json)


def _search(ns: argparse.Namespace) -> int:
    from agent_bridge.cli import reads

    return reads.search_command(ns.query, ns.json)


def _install(ns: argparse.Namespace) -> int:
    from agent_bridge.cli import install

    return install.main(ns)


def _uninstall(ns: argparse.Namespace) -> int:
    from agent_bridge.cli import install

    return install.uninstall_main(ns)


def _doctor(ns: argparse.Namespace) -> int:
    from agent_bridge.cli import doctor

    return doctor.main()


def _demo(ns: argparse.Namespace) -> int:
    from agent_bridge.cli import demo

    return demo.main(ns)


def build_parser() -> argparse.ArgumentParser:
    """The command line (cli.parser), each command running its function here."""
    return command_line.build_parser(
        {
            "up": _up,
            "down": _down,
            "status": _status,
            "mcp": _mcp,
            "hook": _hook,
            "dashboard": _dashboard,
            "decisions": _decisions,
            "search": _search,
            "install": _install,
            "uninstall": _uninstall,
            "doctor": _doctor,
            "demo": _demo,
            "slash": _run_slash,
        }
    )


HOOK_EVENTS = ("session-start", "post-tool-use", "stop", "wake", "user-prompt-submit", "interrupt")


def _hook_fast_path(args: Sequence[str]) -> int | None:
    """`agent-bridge hook EVENT [--agent HOST]` runs at every session start and stop:
    dispatch it without building the parser (argparse's setup costs several milliseconds).
    Anything else (help, a typo) goes through argparse for its usual messages."""
    if len(args) < 2 or args[0] != "hook" or args[1] not in HOOK_EVENTS:
        return None
    rest = list(args[2:])
    if len(rest) == 1 and rest[0].startswith("--agent="):
        rest = ["--agent", rest[0].split("=", 1)[1]]
    if rest and (len(rest) != 2 or rest[0] != "--agent" or rest[1] not in hosts.NAMES):
        return None
    return _hook(SimpleNamespace(event=args[1], agent=rest[1] if rest else hosts.DEFAULT.name))  # type: ignore[arg-type]


def _mcp_fast_path(args: Sequence[str]) -> argparse.Namespace | None:
    """`agent-bridge mcp …` as hosts and jobs start it, parsed without building the parser
    (relay.quick.parse_mcp); anything else goes through argparse for its usual messages."""
    if not args or args[0] != "mcp":
        return None
    from agent_bridge.relay.quick import parse_mcp

    options = parse_mcp(list(args))
    return None if options is None else SimpleNamespace(**options, func=_mcp)  # type: ignore[return-value]


def main(argv: Sequence[str] | None = None, handed: Handed | None = None) -> int:
    """`handed`: what relay_quick answered and read before an `mcp` command ran (relay.main)."""
    try:
        try:
            code = _main(sys.argv[1:] if argv is None else list(argv), handed)
        finally:
            # so that a reader gone early (`| head -1`) shows here, not at interpreter exit
            sys.stdout.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 1
    return code


def _main(args: list[str], handed: Handed | None = None) -> int:
    fast = _hook_fast_path(args)
    if fast is not None:
        return fast
    ns = _mcp_fast_path(args)
    if ns is None:
        parser = build_parser()
        ns = parser.parse_args(args)
    ns.handed = handed
    if ns.command is None:  # bare `agent-bridge`: what it can do, not an error
        build_parser().print_help()
        return 0
    if ns.command in HOME_COMMANDS and ns.command not in ("hook", "mcp"):  # these check for themselves
        refused = _refuse_foreign_home(ns.command)
        if refused is not None:
            return refused
    from agent_bridge.common.paths import HomeError

    try:
        return int(ns.func(ns) or 0)
    except HomeError as exc:  # the folder changed hands after the check above
        print(f"agent-bridge {ns.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Regenerate the parts of docs/ that are read from the code, or check that they are current.

    python docs/generate.py           # rewrite the generated parts in place
    python docs/generate.py --check   # exit 1 naming every stale part (tests/test_docs.py runs this)

A generated part sits between `<!-- generated: NAME -->` and `<!-- end: NAME -->` in a docs/*.md
file; only the text between the two markers is replaced, everything around it is written by hand.
It also writes the plugin's files (agent_bridge/hosts/plugin.py: the marketplace at the
repository's root and in agent_bridge/marketplace/). The parts come from the objects the program
itself uses: the CLI's argparse parser, the MCP
server's advertised tools, the dashboard's URL map, the schema's migration steps, the host modules'
hook answers, and the state folder's file names in `agent_bridge.common.paths`. (The CLI part is built
from the parser's actions rather than from `--help`, whose layout differs between Python versions
and terminal widths.)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MARKED = re.compile(r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.S)


# --- the parts --------------------------------------------------------------------------


def _usage(prog: str, parser: argparse.ArgumentParser) -> str:
    words = [prog]
    for action in parser._actions:  # argparse keeps its actions here; there is no public list
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            if isinstance(action, argparse._SubParsersAction):
                words.append("EVENT" if prog.endswith(" hook") else "COMMAND")
            continue
        words.append(_usage_word(action))
    return " ".join(words)


def _usage_word(action: argparse.Action) -> str:
    if not action.option_strings:
        name = action.metavar or action.dest.upper()
        return {"?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} [{name} ...]"}.get(
            str(action.nargs), str(name)
        )
    flag = action.option_strings[-1]
    if action.nargs == 0:
        word = flag
    elif action.choices:
        word = f"{flag} {'|'.join(map(str, action.choices))}"
    else:
        word = f"{flag} {action.metavar or action.dest.upper()}"
    return word if action.required else f"[{word}]"


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        word = _usage_word(action).strip("[]")
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += f" (default: {action.default})"
        rows.append(f"| `{word}` | {text.replace('|', chr(92) + '|')} |")
    return rows


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def cli_reference() -> str:
    from agent_bridge.cli import main as cli

    parser = cli.build_parser()
    out = [f"`{_usage('agent-bridge', parser)}`", "", *_table(_argument_rows(parser))]
    for name, text, sub in _subcommands(parser):
        prog = f"agent-bridge {name}"
        out += ["", f"### `{prog}`", "", text[:1].upper() + text[1:] + ".", "", f"`{_usage(prog, sub)}`"]
        out += ["", *_table(_argument_rows(sub))] if _argument_rows(sub) else []
        for event, event_text, event_parser in _subcommands(sub):
            event_prog = f"{prog} {event}"
            out += [
                "",
                f"#### `{event_prog}`",
                "",
                event_text + ".",
                "",
                f"`{_usage(event_prog, event_parser)}`",
                "",
            ]
            out += _table(_argument_rows(event_parser))
    return "\n".join(out) + "\n"


def _table(rows: list[str]) -> list[str]:
    return ["| argument | meaning |", "| --- | --- |", *rows] if rows else []


def mcp_tools() -> str:
    """The tools as `tools/list` advertises them (name, description, input schema): the tool
    table (agent_bridge.common.tools), which the server lists as it is."""
    from agent_bridge.common import tools

    out = []
    for tool in tools.TOOLS.values():
        out += [f"### `{tool.name}`", "", tool.description, "", "```json",
                json.dumps(tool.schema, indent=2, ensure_ascii=False, sort_keys=True), "```", ""]
    return "\n".join(out)


def http_routes() -> str:
    from agent_bridge.dashboard.app import create_app

    app = create_app(Path("/nonexistent"), port=0, token="x")
    rows = []
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        methods = ", ".join(sorted(m for m in rule.methods or () if m not in ("HEAD", "OPTIONS")))
        rows.append(f"| {methods} | `{rule.rule}` |")
    return "\n".join(["| method | path |", "| --- | --- |", *rows]) + "\n"


def schema_versions() -> str:
    from agent_bridge.store import schema

    out = [f"Current version: **{schema.CURRENT_VERSION}** (`PRAGMA user_version`).", ""]
    for number, step in enumerate(schema.STEPS, start=1):
        out += [f"### Version {number} (from {number - 1})", "", "```sql", step.strip(), "```", ""]
    return "\n".join(out)


def hook_answers() -> str:
    import tempfile

    from agent_bridge import hosts
    from agent_bridge.hooks.common import HookInput

    def dumped(answer: object) -> str:
        return json.dumps(answer, ensure_ascii=False)

    out = []
    with tempfile.TemporaryDirectory() as folder:
        transcript = Path(folder) / "t.jsonl"
        transcript.write_text(json.dumps({"version": "2.1.332"}) + "\n", encoding="utf-8")
        newest = HookInput("s", "/", "", False, str(transcript))
        for host in hosts.ALL:
            framed = "<the messages, framed>"
            stop, stop_new = host.stop_output(framed), host.stop_output(framed, newest)
            out += [f"- {host.title} (`--agent {host.name}`):",
                    f"  - SessionStart: `{dumped(host.session_start_output('<the note>'))}`",
                    f"  - PostToolUse: `{dumped(host.post_tool_use_output(framed))}`"]
            if stop_new != stop:
                out += [
                    "  - Stop, on a version that takes it (the transcript's `version`): "
                    f"`{dumped(stop_new)}`",
                    f"  - Stop, otherwise: `{dumped(stop)}`",
                ]
            else:
                out.append(f"  - Stop: `{dumped(stop)}`")
    return "\n".join(out) + "\n"


def home_files() -> str:
    from agent_bridge.cli import install
    from agent_bridge.common import ledger, paths
    from agent_bridge.hosts import edits

    names = [
        (f"paths.{name}", value)
        for name, value in vars(paths).items()
        if name.isupper()
        and isinstance(value, str)
        and name not in ("APP_NAME", "ALREADY_RUNNING", "PERMANENT")
    ]
    names.append(("ledger.FOLDER", ledger.FOLDER))
    names.append(("ledger.IGNORED", ledger.IGNORED))
    names.extend([("install.BACKUPS", install.BACKUPS), ("hosts.edits.RECORD", edits.RECORD)])
    from agent_bridge.federation import settings as federation_settings

    names.append(("federation.settings.SEED_NAME", federation_settings.SEED_NAME))
    rows = [f"| `{value}` | `{name}` |" for name, value in names]
    return "\n".join(["| name in the state folder | constant |", "| --- | --- |", *rows]) + "\n"


def limits() -> str:
    from agent_bridge.common import domain, jsonlimit
    from agent_bridge.ipc import protocol

    rows = [
        ("decision topic", f"{domain.TOPIC_MAX} characters (compared trimmed and lowercased)"),
        ("decision text", f"{domain.TEXT_MAX} characters"),
        ("message text", f"{domain.MESSAGE_TEXT_MAX} characters"),
        ("search query", f"{domain.QUERY_MAX} characters"),
        ("hop limit", f"default {domain.HOP_LIMIT_DEFAULT}, at most {domain.HOP_MAX}"),
        ("SessionStart note", f"{domain.NOTE_TOPICS} decisions, {domain.NOTE_TEXT_MAX} characters of each"),
        ("wire frame", f"{protocol.MAX_FRAME} bytes"),
        (
            "JSON nesting",
            f"{jsonlimit.MAX_DEPTH} levels of arrays and objects, on every surface that reads JSON",
        ),
    ]
    return "\n".join(["| what | limit |", "| --- | --- |", *(f"| {a} | {b} |" for a, b in rows)]) + "\n"


def ipc_summary() -> str:
    from agent_bridge.ipc import protocol

    return "```text\n" + (protocol.__doc__ or "").strip() + "\n```\n"


# The package's folders in the order of the layers (pyproject.toml's import-linter contract):
# the processes of SPEC §1 first, the shared parts they stand on beneath them.
FOLDER_ORDER = ("cli", "broker", "dashboard", "relay", "hooks", "federation", "store", "ipc", "core", "hosts",
                "common")
SUMMARY_MAX = 88  # characters of a module's first docstring sentence shown in the tree


def _summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line, cut to SUMMARY_MAX."""
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    cut = re.split(r"(?<=\.)\s", first, maxsplit=1)[0].rstrip(".")
    return cut if len(cut) <= SUMMARY_MAX else cut[: SUMMARY_MAX - 1].rstrip() + "…"


def _tree(folder: Path, depth: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    modules = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
    folders = sorted((p for p in folder.iterdir() if (p / "__init__.py").exists()),
                     key=lambda p: (FOLDER_ORDER.index(p.name) if depth == 0 and p.name in FOLDER_ORDER
                                    else len(FOLDER_ORDER), p.name))
    for module in modules:
        rows.append(("  " * (depth + 1) + module.name, _summary(module)))
    for sub in folders:
        rows.append(("  " * (depth + 1) + sub.name + "/", _summary(sub / "__init__.py")))
        rows += _tree(sub, depth + 1)
    return rows


def package_tree() -> str:
    """The package as it is on disk: every folder and module with the first sentence of its
    docstring (docs/architecture.md: the picture of the layout is the tree itself)."""
    rows = [("agent_bridge/", _summary(REPO / "agent_bridge" / "__init__.py"))]
    rows += _tree(REPO / "agent_bridge", 0)
    width = max(len(name) for name, _ in rows) + 2
    return "```text\n" + "".join(f"{name:<{width}}{text}".rstrip() + "\n" for name, text in rows) + "```\n"


PARTS: dict[str, Callable[[], str]] = {
    "layout": package_tree,
    "limits": limits,
    "ipc": ipc_summary,
    "cli": cli_reference,
    "mcp-tools": mcp_tools,
    "http-routes": http_routes,
    "schema": schema_versions,
    "hook-answers": hook_answers,
    "home-files": home_files,
}


# --- rewriting ---------------------------------------------------------------------------


def render(text: str, parts: dict[str, str]) -> str:
    """`text` with every generated part replaced by its current content."""

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in parts:
            raise KeyError(f"unknown generated part {name!r}")
        return match.group(1) + parts[name] + match.group(4)

    return MARKED.sub(replace, text)


def stale(docs: Path = DOCS) -> list[str]:
    """The docs files whose generated parts differ from what the code gives now (and why)."""
    parts = {name: make() for name, make in PARTS.items()}
    found = []
    seen: set[str] = set()
    for path in sorted(docs.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        seen.update(m["name"] for m in MARKED.finditer(text))
        if render(text, parts) != text:
            found.append(f"{path.name}: generated parts are stale")
    found += [f"no docs file has the generated part {name!r}" for name in PARTS if name not in seen]
    return found


def main(argv: list[str]) -> int:
    from agent_bridge.hosts import plugin  # the plugin's files (tests/test_plugin.py checks them)

    if argv == ["--check"]:
        problems = stale() + [f"the plugin's {path} is stale" for path in plugin.stale(REPO)]
        for problem in problems:
            print(f"docs/generate.py: {problem}; run python docs/generate.py", file=sys.stderr)
        return 1 if problems else 0
    if argv:
        print("usage: python docs/generate.py [--check]", file=sys.stderr)
        return 2
    parts = {name: make() for name, make in PARTS.items()}
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        updated = render(text, parts)
        if updated != text:
            path.write_text(updated, encoding="utf-8")
            print(f"updated {path.relative_to(REPO)}")
    for written in plugin.write(REPO):
        print(f"updated {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

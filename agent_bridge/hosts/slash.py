"""The owner's commands inside a session (SPEC §4.6 "Owner commands inside the sessions").

`agent-bridge install` writes one Claude Code custom command per owner command, a markdown file
`<claude dir>/commands/agent-bridge/<name>.md`, which Claude Code 2.1.332 offers as
`/agent-bridge:<name>` (the folder is the namespace; checked with the real CLI). Its body runs the
CLI through Claude Code's `!` shell execution before the model sees anything, so the output the
owner asks for is the command's own, and the model is told only to show it.

What the owner typed after the command reaches us as typed: Claude Code pastes `$ARGUMENTS` into
the shell command raw (no quoting), so the command file passes it on a quoted here-document's
stdin, where no shell reads it, to `agent-bridge slash NAME`. `argv` turns that text into the
command line of the ordinary command (`send`, `decide`, …), which the CLI then runs as if typed in
a terminal: the same output, errors and exit codes. Beneath the hosts and the CLI: it imports
nothing of agent_bridge.

Codex 0.171 has no custom prompts (removed in 0.117: `~/.codex/prompts/*.md` is not read, and
`/prompts:…` is not a command), so install writes nothing for Codex here.
"""

from __future__ import annotations

import shlex
from pathlib import Path

NAMESPACE = "agent-bridge"  # the folder under commands/: Claude Code names the commands /agent-bridge:NAME
EOF_MARK = "AGENT_BRIDGE_ARGUMENTS"  # the here-document's delimiter
MARK = "# agent-bridge install wrote this file; agent-bridge uninstall removes it"
ARGS_MAX = 20_000  # characters of typed arguments read (a message is at most 8,000; more is refused later)

# name: (what it does, the arguments it takes, the ordinary command it runs)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "send": ("Send a message to an agent session as the owner", "TO TEXT", "send"),
    "inbox": ("Messages agents sent to the owner", "", "inbox"),
    "decide": ("Pin an owner decision for the agents", "TOPIC TEXT", "decide"),
    "questions": ("Questions agents asked the owner", "[--all]", "questions"),
    "answer": ("Answer an agent's question", "ID TEXT | ID --option N | ID --decline REASON", "answer"),
    "jobs": ("Jobs agents delegated: running and queued", "[--all] | cancel ID", "jobs"),
}
_SHOW = ("Show the owner the output above exactly as printed, in a code block, and add nothing: "
         "it is the owner's own agent-bridge command, not a request to you.")


class SlashError(Exception):
    """What the owner typed cannot be a command line of the command: one line for them."""


def command_text(name: str, shell_command: str) -> str:
    """The custom command file for `name`, whose `!` block runs `shell_command` (the CLI and the
    environment it needs, e.g. `/abs/agent-bridge slash send`) with the typed arguments on stdin."""
    what, hint, _ = COMMANDS[name]
    lines = [
        "---",
        MARK,
        f"description: {what} (agent-bridge {COMMANDS[name][2]})",
        *([f"argument-hint: {hint}"] if hint else []),
        f"allowed-tools: Bash({shell_command}:*)",
        "disable-model-invocation: true",
        "---",
        "```!",
        f"{shell_command} <<'{EOF_MARK}'",
        "$ARGUMENTS",
        EOF_MARK,
        "```",
        "",
        _SHOW,
        "",
    ]
    return "\n".join(lines)


def is_ours(text: str) -> bool:
    """Whether a command file is one install wrote (its frontmatter carries MARK)."""
    head = text.split("\n---", 1)[0]
    return text.startswith("---\n") and MARK in head.splitlines()


def command_path(folder: Path, name: str) -> Path:
    """`<folder>/agent-bridge/<name>.md`, `folder` being a Claude Code `commands` folder."""
    return folder / NAMESPACE / f"{name}.md"


# --- from what was typed to a command line -------------------------------------------------


def _first(raw: str, what: str) -> tuple[str, str]:
    """The first word of `raw` (or a quoted phrase: "build system"), and the rest as typed."""
    raw = raw.strip()
    if not raw:
        raise SlashError(f"give {what} first")
    if raw[0] in "'\"":
        end = raw.find(raw[0], 1)
        if end < 0:
            raise SlashError(f"{what}: the closing {raw[0]} is missing")
        return raw[1:end], raw[end + 1:].strip()
    word, _, rest = raw.partition(" ")
    return word, rest.strip()


def _words(raw: str) -> list[str]:
    try:
        return shlex.split(raw)
    except ValueError as exc:
        raise SlashError(f"cannot read {raw!r}: {exc}") from None


def argv(name: str, raw: str) -> list[str]:
    """The `agent-bridge` command line for slash command `name` given the text typed after it.
    Raises SlashError."""
    if name not in COMMANDS:
        raise SlashError(f"no slash command {name!r}; they are: {', '.join(COMMANDS)}")
    raw = raw.strip()
    command = COMMANDS[name][2]
    if name in ("send", "decide"):
        first, rest = _first(raw, "the recipient" if name == "send" else "the topic")
        if not rest:
            raise SlashError(f"usage: /{NAMESPACE}:{name} {COMMANDS[name][1]}")
        return [command, "--", first, rest]
    if name == "answer":
        qid, rest = _first(raw, "the question's id")
        for flag in ("--option", "--decline"):
            if rest == flag or rest.startswith(flag + " "):
                value = rest[len(flag):].strip()
                if flag == "--decline":
                    value = _first(value, "the reason")[0] if value[:1] in "'\"" else value
                elif not value.isdigit():
                    raise SlashError(f"--option takes the option's number (from 1), not {value!r}")
                return [command, f"{flag}={value}", "--", qid]
        if not rest:
            raise SlashError(f"usage: /{NAMESPACE}:answer {COMMANDS['answer'][1]}")
        return [command, "--", qid, rest]
    return [command, *_words(raw)]  # inbox, questions, jobs: their own flags (--all, cancel ID)


def typed_argv(name: str, typed: str) -> list[str]:
    """`agent-bridge slash NAME` (agent_bridge.cli.main): the command line for what arrived on stdin.
    Raises SlashError."""
    if len(typed) > ARGS_MAX:
        raise SlashError(f"the arguments are longer than {ARGS_MAX:,} characters")
    if typed.strip() == "$ARGUMENTS":  # a host that left the placeholder unfilled: nothing was typed
        typed = ""
    return argv(name, typed)

"""The agent-bridge skill: a `SKILL.md` that tells an agent when to use the bridge (message another
session, pin or look up an owner's decision, delegate). The plugin carries it (hosts.plugin), and
`install --codex` writes it where Codex 0.171 loads skills (`$CODEX_HOME/skills/<name>/SKILL.md`,
`<project>/.codex/skills/`; NOTES.md "Plugins"), since Codex has no custom prompts. It names the
tools by their names alone: Claude Code shows them as `mcp__agent-bridge__<tool>` or, from the
plugin, `mcp__plugin_agent-bridge_agent-bridge__<tool>`; Codex in the `mcp__agent_bridge` namespace.

Beneath the host modules: it imports nothing of agent_bridge.
"""

from __future__ import annotations

from pathlib import Path

NAME = "agent-bridge"  # the skill's folder and name
SKILL_MARK = "# agent-bridge's skill: agent-bridge uninstall removes a copy agent-bridge install wrote"
SKILL_TEXT = f"""---
{SKILL_MARK}
name: agent-bridge
description: Reach the other AI coding-agent sessions on this machine (Claude Code, Codex, \
opencode; running or not) and the owner's pinned decisions. Use it to message another session, \
to pin or look up a decision of the owner, or to hand work to another agent.
---

Use the agent-bridge MCP server's tools (named by its server `agent-bridge`, with or without a \
plugin prefix):

- Another session should know or do something: `peers` lists the sessions, `send` leaves a \
durable message (to a name, or `claude`/`codex`), `inbox` reads yours. Where the host passes \
them on, messages for you also arrive between tool calls and at your turn's end: act on them.
- Choices the owner made (a database, an API, a style) bind every session: read `decisions` \
before you choose; `decide` pins one the owner gave you; `ask_owner` when none fits.
- Work another agent should do or review: `delegate` starts it as a job; its answer comes back \
as a message (`job` follows it).
"""


def skill_path(folder: Path) -> Path:
    """`<folder>/agent-bridge/SKILL.md`, `folder` being a host's skills folder."""
    return folder / NAME / "SKILL.md"


def is_ours(text: str) -> bool:
    """Whether a SKILL.md is the one install wrote (its frontmatter carries SKILL_MARK)."""
    head = text.split("\n---", 1)[0]
    return text.startswith("---\n") and SKILL_MARK in head.splitlines()

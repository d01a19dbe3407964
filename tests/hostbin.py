"""The real Claude Code and Codex CLIs, for tests that must see what the hosts do.

`AGENT_BRIDGE_HOST_BIN` names the `node_modules/.bin` folder of pinned installs of
`@anthropic-ai/claude-code` and `@openai/codex` (the `tests` nox session provides it, as for
`tests/hosts`; `AGENT_BRIDGE_TEST_HOST_BIN` is accepted too). Without it a test that needs a
host is skipped with that reason, except on CI, where it fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HOST_BIN_VARS = ("AGENT_BRIDGE_HOST_BIN", "AGENT_BRIDGE_TEST_HOST_BIN")

# Environment for running a real Claude Code offline: nothing leaves 127.0.0.1 (NOTES.md).
CLAUDE_OFFLINE_ENV = {
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
    "ANTHROPIC_API_KEY": "test-key",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "IS_SANDBOX": "1",
}


def host_program(name: str) -> Path:
    """The real `claude` or `codex`; skips (fails on CI) when it is not provided."""
    folder = next((os.environ[v] for v in HOST_BIN_VARS if os.environ.get(v)), None)
    reason = None
    if not folder:
        reason = (
            f"{HOST_BIN_VARS[0]} is not set (the node_modules/.bin folder holding the real claude and codex)"
        )
    elif not (Path(folder) / name).exists():
        reason = f"{HOST_BIN_VARS[0]}={folder} has no {name}"
    if reason is None:
        return Path(folder) / name  # type: ignore[arg-type]
    if os.environ.get("CI"):
        pytest.fail(f"real host CLI needed on CI: {reason}")
    pytest.skip(reason)

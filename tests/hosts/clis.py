"""The real host CLIs, from npm at pinned versions, in a cache folder of the repository.

`python -m tests.hosts.clis` installs them when missing and prints the bin folder (the `tests`
nox session runs it and hands the folder to pytest as AGENT_BRIDGE_HOST_BIN); the host tests
call `ensure()` themselves when run without nox.

Claude Code's npm package ships a placeholder `bin/claude.exe` that its postinstall script
replaces with the platform's native binary; with install scripts off (`--ignore-scripts`, or an
npm that has not approved them) `claude` only prints "native binary not installed". So the
postinstall is run by hand when `claude --version` does not answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CLAUDE_PACKAGE, CLAUDE_VERSION = "@anthropic-ai/claude-code", "2.1.337"  # the newest on npm, 2026-12-07
CODEX_PACKAGE, CODEX_VERSION = "@openai/codex", "0.171.0"
OPENCODE_PACKAGE, OPENCODE_VERSION = "opencode-ai", "1.18.33"  # the newest on npm, 2026-12-05
COPILOT_PACKAGE, COPILOT_VERSION = "@github/copilot", "1.0.102"  # the newest on npm, 2026-12-05
PINNED = (f"{CLAUDE_PACKAGE}@{CLAUDE_VERSION}", f"{CODEX_PACKAGE}@{CODEX_VERSION}",
          f"{OPENCODE_PACKAGE}@{OPENCODE_VERSION}", f"{COPILOT_PACKAGE}@{COPILOT_VERSION}")
BIN_ENV = "AGENT_BRIDGE_HOST_BIN"
CACHE = Path(__file__).resolve().parents[2] / ".nox" / "hostcli"  # .nox/ is ignored by git


class Missing(Exception):
    """The CLIs are not there and cannot be installed here (the reason says why)."""


def version_of(binary: Path) -> str | None:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def usable(bin_dir: Path) -> bool:
    claude, codex = version_of(bin_dir / "claude"), version_of(bin_dir / "codex")
    opencode, copilot = version_of(bin_dir / "opencode"), version_of(bin_dir / "copilot")
    return bool(claude and CLAUDE_VERSION in claude and codex and CODEX_VERSION in codex
                and opencode and OPENCODE_VERSION in opencode and copilot and COPILOT_VERSION in copilot)


def ensure(cache: Path = CACHE) -> Path:
    """The folder holding `claude`, `codex`, `opencode` and `copilot` at the pinned versions:
    $AGENT_BRIDGE_HOST_BIN when set, else the cache (installed with npm when missing). Raises Missing."""
    given = os.environ.get(BIN_ENV)
    if given:
        if not usable(Path(given)):
            raise Missing(
                f"{BIN_ENV}={given} does not hold claude {CLAUDE_VERSION}, codex {CODEX_VERSION}, "
                f"opencode {OPENCODE_VERSION} and copilot {COPILOT_VERSION}"
            )
        return Path(given)
    bin_dir = cache / "node_modules" / ".bin"
    if usable(bin_dir):
        return bin_dir
    npm = shutil.which("npm")
    if npm is None:
        raise Missing("npm is not installed: the real Claude Code, Codex, opencode and Copilot CLIs "
                      "come from npm")
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(cache), *PINNED], check=True,
                   stdout=sys.stderr)  # stdout carries only the answer
    if version_of(bin_dir / "claude") is None:
        postinstall = cache / "node_modules" / CLAUDE_PACKAGE / "install.cjs"
        subprocess.run(["node", str(postinstall)], check=True, cwd=cache)
    if not usable(bin_dir):
        raise Missing(f"npm installed {' '.join(PINNED)} into {cache}, but they do not run")
    return bin_dir


if __name__ == "__main__":
    try:
        print(ensure())
    except Missing as exc:
        print(f"host CLIs: {exc}", file=sys.stderr)
        sys.exit(1)

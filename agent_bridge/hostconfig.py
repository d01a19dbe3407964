"""Reading the hosts' own configuration files, shared by `install`, `uninstall` and `doctor`.

One loader, so that the commands that change these files and the one that checks them agree on
what a file holds: a missing file is empty, a file that does not parse is an error naming the
file (never silently treated as empty, which would let `install` overwrite it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

VERSION_TIMEOUT = 10.0  # seconds for `codex --version`; it answers in well under one


class ConfigError(Exception):
    """A host config file that cannot be read or parsed; the message names the file."""


def read_text(path: Path) -> str | None:
    """The file's text, or None when it does not exist."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def parse_json_object(path: Path, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def parse_toml(path: Path, text: str | None) -> dict[str, Any]:
    try:
        return tomllib.loads(text or "")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc})") from None


def load_json_object(path: Path) -> dict[str, Any]:
    return parse_json_object(path, read_text(path))


def load_toml(path: Path) -> dict[str, Any]:
    return parse_toml(path, read_text(path))


# --- Codex --------------------------------------------------------------------------------

def codex_home() -> Path:
    """`$CODEX_HOME`, default `~/.codex` (openai/codex docs/config.md)."""
    explicit = os.environ.get("CODEX_HOME")
    return Path(explicit).expanduser() if explicit else Path.home() / ".codex"


def codex_program() -> str | None:
    """The `codex` the user would run (the one on PATH), or None."""
    return shutil.which("codex")


_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def codex_version(program: str | None = None) -> tuple[int, int, int] | None:
    """The installed Codex's version from `codex --version` ("codex-cli 0.171.0"), or None when
    there is no codex on PATH or it does not answer with a version."""
    program = program or codex_program()
    if program is None:
        return None
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(out.stdout)
    if out.returncode != 0 or match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch

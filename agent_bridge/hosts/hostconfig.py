"""Reading the hosts' own configuration files, shared by `install`, `uninstall`, `doctor` and the
host modules (agent_bridge/hosts).

One loader, so that the commands that change these files and the one that checks them agree on
what a file holds: a missing file is empty, a file that does not parse is an error naming the
file (never silently treated as empty, which would let `install` overwrite it).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from agent_bridge.common import jsonlimit


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
        data = jsonlimit.loads(text)
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

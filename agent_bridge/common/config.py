"""Broker settings from the environment and `<home>/config.toml` (environment wins)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from agent_bridge.common import domain, jsonlimit, paths

MAX_JOBS_DEFAULT = 4
MAX_JOBS_LIMIT = 64
KNOWN = ("alerts", "hop_limit", "max_jobs", "federation")  # [federation]: agent_bridge.federation.settings


class ConfigError(ValueError):
    """A setting with a bad value; the message names the setting and what is allowed."""


@dataclass(frozen=True)
class Settings:
    hop_limit: int = domain.HOP_LIMIT_DEFAULT
    max_jobs: int = MAX_JOBS_DEFAULT  # jobs running at once (SPEC §4.7); later ones wait
    alerts: bool = True  # desktop notifications for the owner (SPEC §4.6 "The owner is told")


def read_file(home_dir: Path) -> tuple[Path, dict[str, object]]:
    """config.toml's path and its parsed top level ({} when there is none); ConfigError for a file
    that does not parse or names an unknown setting. Shared with agent_bridge.federation.settings."""
    file_values: dict[str, object] = {}
    config_file = home_dir / paths.CONFIG_NAME
    if config_file.exists():
        try:
            file_values = tomllib.loads(config_file.read_text(encoding="utf-8"))
            jsonlimit.check_value(file_values)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{config_file}: cannot parse: {exc}") from None
        except (jsonlimit.TooDeep, RecursionError):  # tomllib recurses once per level of nesting
            raise ConfigError(
                f"{config_file}: values nested deeper than {jsonlimit.MAX_DEPTH} levels"
            ) from None
        unknown = sorted(set(file_values) - set(KNOWN))
        if unknown:
            raise ConfigError(
                f"{config_file}: unknown setting {unknown[0]!r}; known settings: {', '.join(KNOWN)}"
            )
    return config_file, file_values


def load(home_dir: Path, env: dict[str, str] | os._Environ[str] | None = None) -> Settings:
    env = os.environ if env is None else env
    config_file, file_values = read_file(home_dir)
    hop_limit = domain.HOP_LIMIT_DEFAULT
    try:
        if "hop_limit" in file_values:
            hop_limit = domain.parse_hop_limit(file_values["hop_limit"], source=f"{config_file}: hop_limit")
        raw = env.get("AGENT_BRIDGE_HOP_LIMIT")
        if raw is not None and raw != "":
            hop_limit = domain.parse_hop_limit(raw, source="AGENT_BRIDGE_HOP_LIMIT")
    except domain.InputError as exc:
        raise ConfigError(str(exc)) from None
    max_jobs = file_values.get("max_jobs", MAX_JOBS_DEFAULT)
    if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or not 1 <= max_jobs <= MAX_JOBS_LIMIT:
        raise ConfigError(f"{config_file}: max_jobs: expected a whole number from 1 to {MAX_JOBS_LIMIT}, "
                          f"got {max_jobs!r}")
    alerts = file_values.get("alerts", True)
    if not isinstance(alerts, bool):
        raise ConfigError(f"{config_file}: alerts: expected true or false, got {alerts!r}")
    return Settings(hop_limit=hop_limit, max_jobs=max_jobs, alerts=alerts)

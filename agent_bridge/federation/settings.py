"""The [federation] table of `<home>/config.toml` (SPEC §10), read once and checked whole.

  [federation]
  url = "tls://hub.example:4222"   # nats:// or tls://; several, comma-separated, for a cluster
  machine = "laptop"               # this machine's name in subjects: 1 to 32 of a-z, 0-9 and -
  team = "acme"                    # default "ab"; same characters
  seed = "/path/machine.nk"        # default <home>/machine.nk
  ca = "/path/ca.pem"              # the hub's CA, pinned: required with tls://, refused with nats://

Relative paths (seed, ca) are taken from the home folder, where config.toml is. Every bad value is
one SettingsError line naming the key, what is allowed and what was given. No table: `load` returns
None, and nothing of federation runs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from agent_bridge.common import config
from agent_bridge.federation import subjects
from agent_bridge.federation.errors import SettingsError

TABLE = "federation"
KEYS = ("url", "machine", "team", "seed", "ca")
SEED_NAME = "machine.nk"
SCHEMES = ("nats", "tls")


@dataclass(frozen=True)
class FederationSettings:
    url: str  # as written
    servers: tuple[str, ...]  # each server's URL, in order
    machine: str
    team: str
    seed: Path
    ca: Path | None

    @property
    def tls(self) -> bool:
        return self.servers[0].startswith("tls://")


def default_seed(home_dir: Path) -> Path:
    return home_dir / SEED_NAME


def default_machine() -> str:
    """A machine name from the host name, for `agent-bridge machine` before [federation] exists: its
    first label, lower case, anything outside a-z, 0-9 and - made "-", cut to 32 ("machine" if nothing
    is left). A suggestion only: federation itself always uses `machine` from the table."""
    label = socket.gethostname().split(".")[0].lower()
    name = "".join(c if c.isascii() and (c.isalnum() or c == "-") else "-" for c in label)
    name = name.strip("-")[:32].strip("-")
    return name or "machine"


def load(home_dir: Path) -> FederationSettings | None:
    """The [federation] settings, None when config.toml has no such table; SettingsError (one line) for a
    bad value, and for a config.toml that does not parse."""
    try:
        config_file, values = config.read_file(home_dir)
    except config.ConfigError as exc:
        raise SettingsError(str(exc)) from None
    if TABLE not in values:
        return None
    return parse(values[TABLE], home_dir, source=str(config_file))


def parse(table: object, home_dir: Path, source: str = "config.toml") -> FederationSettings:
    def bad(key: str, allowed: str, given: object) -> SettingsError:
        return SettingsError(f"{source}: {TABLE}.{key}: expected {allowed}, got {given!r}")

    if not isinstance(table, dict):
        raise SettingsError(
            f"{source}: {TABLE}: expected a table ([{TABLE}] with url and machine), got {table!r}"
        )
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise SettingsError(f"{source}: {TABLE}.{unknown[0]}: unknown setting; known: {', '.join(KEYS)}")
    for key in ("url", "machine"):
        if key not in table:
            raise SettingsError(f"{source}: {TABLE}.{key}: required, missing")

    url = table["url"]
    if not isinstance(url, str):
        raise bad("url", "a string of nats:// or tls:// URLs, comma-separated", url)
    servers = tuple(part.strip() for part in url.split(","))
    for server in servers:
        problem = _server_problem(server)
        if problem:
            raise bad("url", f"nats://HOST:PORT or tls://HOST:PORT, comma-separated ({problem})", url)
    if len({s.split("://")[0] for s in servers}) > 1:
        raise bad("url", "every server with the same scheme (all nats:// or all tls://)", url)

    machine = table["machine"]
    if not subjects.is_name(machine):
        raise bad("machine", subjects.NAME_RULE, machine)
    team = table.get("team", subjects.DEFAULT_TEAM)
    if not subjects.is_team(team):
        raise bad("team", f"{subjects.NAME_RULE}, not ending in {subjects.RESERVED_TEAM_SUFFIX}", team)

    seed = _path(table.get("seed", SEED_NAME), home_dir, "seed", bad)
    ca = None if "ca" not in table else _path(table["ca"], home_dir, "ca", bad)
    tls = servers[0].startswith("tls://")
    if tls and ca is None:
        raise SettingsError(
            f"{source}: {TABLE}.ca: required with tls:// URLs (the hub's CA certificate, pinned), missing"
        )
    if ca is not None and not tls:
        raise bad(
            "ca",
            "no ca with nats:// URLs (ca pins the CA of a tls:// hub; use tls:// to encrypt)",
            str(table["ca"]),
        )
    if ca is not None and not ca.is_file():
        raise bad("ca", "a readable CA certificate file (PEM)", f"{ca} (no such file)")
    return FederationSettings(url=url, servers=servers, machine=machine, team=team, seed=seed, ca=ca)


def _server_problem(server: str) -> str | None:
    if "://" not in server:
        return f"{server!r} has no scheme"
    try:
        parts = urlsplit(server)
        port = parts.port
    except ValueError:
        return f"{server!r} has a bad port"
    if parts.scheme not in SCHEMES:
        return f"{server!r}: scheme {parts.scheme!r}"
    if not parts.hostname:
        return f"{server!r} has no host"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"{server!r} has a path"
    if parts.username or parts.password:
        return f"{server!r} carries credentials (the machine's NKEY seed is its credential)"
    if port is not None and not 1 <= port <= 65535:
        return f"{server!r} has a bad port"
    return None


def _path(value: object, home_dir: Path, key: str, bad: Callable[[str, str, object], SettingsError]) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise bad(key, "a file path", value)
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else home_dir / path

"""The nats-server configuration a team's hub runs (SPEC §10), printed by
`agent-bridge federation hub-config NAME=PUBKEY… [--team T] [--port N] [--store DIR]`.

Plain `nats-server -c FILE` runs it: JetStream on, and one NKEY user per machine whose permissions let it
  - publish only subjects that name it as sender (subjects.py);
  - create the team's two streams (create only: never update, purge or delete; a create with the
    exact config a stream already has is a no-op, so every machine makes sure of them at start);
  - create, look up, pull from and ack only its own three durable consumers, each create pinned to
    its filter through the subject `$JS.API.CONSUMER.CREATE.<stream>.<consumer>.<filter>` (the server
    refuses a request whose body's filter differs from the subject's), so a machine can make no
    consumer that reads what is addressed to another;
  - read presence (the last message of each machine) by `$JS.API.STREAM.MSG.GET` on the presence
    stream only;
  - receive only under its own inbox prefix `_INBOX_<machine>.>` (the client connects with
    `inbox_prefix`), so no machine reads another's replies or pulled messages.
Everything else is denied, including every other `$JS.API` subject. A client without credentials or
with a key not listed is refused at connect ("Authorization Violation").

The configuration carries only public keys: it can be printed, mailed and committed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from agent_bridge.federation import keys, subjects
from agent_bridge.federation.errors import FederationError

DEFAULT_PORT = 4222
DEFAULT_HOST = "0.0.0.0"  # a hub serves other machines
DEFAULT_CLUSTER_PORT = 6222
SECRET_RE = re.compile(r"[A-Za-z0-9_-]{24,128}")
ROUTE_USER = "route"  # the user the cluster's nodes authenticate each other's routes with

# The streams, the same on every machine (a create with any other config is refused by the hub once
# a stream exists, so they are constants here, not settings).
DUPLICATE_WINDOW = timedelta(minutes=10)  # a retry with the same Nats-Msg-Id within it stores nothing
# How long the hub keeps what it carried: a machine away longer loses what was sent to it meanwhile (its
# senders' outboxes republish what has no receipt). Receivers dedupe by message id, so a republish after
# the duplicate window is still shown once.
MAX_AGE = timedelta(days=30)
PRESENCE_DUPLICATE_WINDOW = timedelta(seconds=30)
# A machine publishes its presence every 30 s; one gone for a day drops out of everyone's list.
PRESENCE_MAX_AGE = timedelta(days=1)


@dataclass(frozen=True)
class Cluster:
    """One node of a hub made of several nats-server nodes (a JetStream cluster, 3 or more for R3).

    Every node gets the same members and team; each its own `node` name, store and ports. Routes carry
    everything between the nodes, so they are authenticated with a secret all nodes share (`secret`)."""

    name: str  # the cluster's name, the same on every node
    node: str  # this node's server_name, unique in the cluster
    port: int  # this node's route port
    routes: tuple[str, ...]  # host:port of every node's route port (its own may be in it)
    secret: str


class HubConfigError(FederationError):
    """A bad NAME=PUBKEY, team, port or store folder: one line."""


@dataclass(frozen=True)
class Member:
    machine: str
    public_key: str


def parse_members(pairs: Iterable[str]) -> list[Member]:
    """NAME=PUBKEY words as `hub-config` takes them; HubConfigError (one line) for the first bad one."""
    members: list[Member] = []
    for pair in pairs:
        name, sep, key = pair.partition("=")
        if not sep:
            raise HubConfigError(
                f"expected NAME=PUBKEY (from `agent-bridge machine` on that machine), got {pair!r}"
            )
        if not subjects.is_name(name):
            raise HubConfigError(f"{pair!r}: machine name: expected {subjects.NAME_RULE}, got {name!r}")
        if not keys.is_user_public_key(key):
            raise HubConfigError(
                f"{pair!r}: public key: expected an NKEY user public key (U and 55 more "
                f"characters, as `agent-bridge machine` prints), got {key!r}"
            )
        for other in members:
            if other.machine == name:
                raise HubConfigError(f"machine {name!r} is given twice")
            if other.public_key == key:
                raise HubConfigError(f"machines {other.machine!r} and {name!r} have the same public key")
        members.append(Member(name, key))
    if not members:
        raise HubConfigError("expected at least one NAME=PUBKEY")
    return members


def make_cluster(name: str, node: str, port: int, routes: Sequence[str], secret: str) -> Cluster:
    """A checked Cluster; HubConfigError (one line) for the first bad value."""
    if not subjects.is_name(name):
        raise HubConfigError(f"--cluster: expected {subjects.NAME_RULE}, got {name!r}")
    if not subjects.is_name(node):
        raise HubConfigError(f"--node: expected {subjects.NAME_RULE}, got {node!r}")
    check_port(port)
    cleaned = tuple(r.strip() for r in routes)
    for route in cleaned:
        host, sep, route_port = route.rpartition(":")
        if (
            not sep
            or not host
            or not route_port.isdigit()
            or not 1 <= int(route_port) <= 65535
            or "/" in host
        ):
            raise HubConfigError(
                f"--routes: expected HOST:PORT of each node's route port, comma-separated, got {route!r}"
            )
    if len(cleaned) < 2:
        raise HubConfigError(
            f"--routes: expected the route ports of the hub's nodes (3 or more for "
            f"streams kept on 3), got {','.join(cleaned)!r}"
        )
    if not SECRET_RE.fullmatch(secret):
        raise HubConfigError(
            "--cluster-secret-file: expected 24 to 128 of A-Z, a-z, 0-9, _ and - "
            "(e.g. `openssl rand -hex 32`), the same file for every node"
        )
    return Cluster(name, node, port, cleaned, secret)


def check_team(team: str) -> str:
    if not subjects.is_team(team):
        raise HubConfigError(
            f"--team: expected {subjects.NAME_RULE}, not ending in "
            f"{subjects.RESERVED_TEAM_SUFFIX}, got {team!r}"
        )
    return team


def check_port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise HubConfigError(f"--port: expected 1 to 65535, got {port}")
    return port


def permissions(team: str, machine: str) -> tuple[list[str], list[str]]:
    """(publish allow, subscribe allow) for one machine: exactly what transport.py uses."""
    stream = subjects.stream(team)
    presence = subjects.presence_stream(team)
    publish = [
        f"{team}.msg.{machine}.*",
        f"{team}.rcpt.{machine}.*",
        subjects.dec(team, machine),
        subjects.presence(team, machine),
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.CREATE.{presence}",
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.INFO.{presence}",
        f"$JS.API.STREAM.MSG.GET.{presence}",
    ]
    for kind in subjects.KINDS:
        name = subjects.consumer(machine, kind)
        publish += [
            f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{subjects.consumer_filter(team, machine, kind)}",
            f"$JS.API.CONSUMER.INFO.{stream}.{name}",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}",
            f"$JS.ACK.{stream}.{name}.>",
        ]
    return publish, [subjects.inbox_prefix(machine) + ".>"]


def _q(text: str) -> str:
    return json.dumps(text)  # nats-server's config reads JSON strings; "$" inside quotes is no variable


def _list(items: Sequence[str], indent: str) -> str:
    inner = "".join(f"{indent}  {_q(item)}\n" for item in items)
    return f"[\n{inner}{indent}]"


def render(
    members: Sequence[Member],
    team: str = subjects.DEFAULT_TEAM,
    port: int = DEFAULT_PORT,
    store: Path | None = None,
    host: str = DEFAULT_HOST,
    command: str | None = None,
    tls: tuple[Path, Path] | None = None,
    cluster: Cluster | None = None,
) -> str:
    """The configuration text for `nats-server -c`. `store`: JetStream's folder (absolute). `tls`: the
    hub's certificate and key files (PEM): then every client must speak TLS (machines use tls:// with
    `ca` pinned to the CA that signed it)."""
    check_team(team)
    check_port(port)
    store = (store or Path("agent-bridge-hub")).expanduser().absolute()
    names = ", ".join(m.machine for m in members)
    lines = [
        f"# nats-server configuration for the agent-bridge team {team!r} (machines: {names}).",
    ]
    if command:
        lines.append(f"# Made by: {command}")
    lines += [
        "# Run it with: nats-server -c THIS_FILE",
        "# Each machine publishes only as itself, reads only its own durable consumers and gets replies",
        f"# only under _INBOX_<machine>. The machines create the streams {subjects.stream(team)} and",
        f"# {subjects.presence_stream(team)} themselves (create only; none may update, purge or delete one).",
        "# Only public keys are here"
        + (" and the routes' secret: keep it private." if cluster else ".")
        + " Add a machine: run hub-config again with every NAME=PUBKEY, restart.",
        f"listen: {_q(f'{host}:{port}')}",
        "",
        "jetstream {",
        f"  store_dir: {_q(str(store))}",
        "}",
        "",
    ]
    if cluster is not None:
        check_port(cluster.port)
        routes = [f"nats://{ROUTE_USER}:{cluster.secret}@{route}" for route in cluster.routes]
        at = lines.index("jetstream {")
        lines[at:at] = [f"server_name: {_q(cluster.node)}", ""]
        lines += [
            "# The nodes' routes: only this hub's nodes, with the shared secret (keep this file private).",
            "cluster {",
            f"  name: {_q(cluster.name)}",
            f"  listen: {_q(f'{host}:{cluster.port}')}",
            f"  authorization {{ user: {_q(ROUTE_USER)}, password: {_q(cluster.secret)} }}",
            f"  routes: {_list(routes, '  ')}",
            "}",
            "",
        ]
    if tls is not None:
        cert, key = (p.expanduser().absolute() for p in tls)
        lines += ["tls {", f"  cert_file: {_q(str(cert))}", f"  key_file: {_q(str(key))}", "}", ""]
    lines += [
        "authorization {",
        "  users: [",
    ]
    for member in members:
        publish, subscribe = permissions(team, member.machine)
        lines += [
            f"    # machine {member.machine}",
            "    {",
            f"      nkey: {_q(member.public_key)}",
            "      permissions: {",
            f"        publish: {{ allow: {_list(publish, '        ')} }}",
            f"        subscribe: {{ allow: {_list(subscribe, '        ')} }}",
            "      }",
            "    }",
        ]
    lines += ["  ]", "}", ""]
    return "\n".join(lines)

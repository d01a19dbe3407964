"""`agent-bridge machine [--json]` and `agent-bridge federation hub-config NAME=PUBKEY…` (SPEC §10).

Errors a person can cause are one line on stderr: exit 2 for a bad argument or setting, 1 for a seed
that cannot be used or a missing extra. Neither command needs a running broker.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from agent_bridge.common import paths
from agent_bridge.federation import hub, identity, settings
from agent_bridge.federation.errors import FederationError, IdentityError, MissingExtra, SettingsError


def _fail(command: str, exc: Exception, code: int) -> int:
    print(f"agent-bridge {command}: {exc}", file=sys.stderr)
    return code


def machine(as_json: bool) -> int:
    """This machine's name and NKEY public key, creating the seed (0600) on first use.

    The name is `machine` from [federation] when the table exists; else one made from the host name
    (settings.default_machine), marked as a suggestion: nothing uses it until it is in config.toml."""
    home = paths.home()
    try:
        configured = settings.load(home)
    except SettingsError as exc:
        return _fail("machine", exc, 2)
    name = configured.machine if configured else settings.default_machine()
    seed_path = configured.seed if configured else settings.default_seed(home)
    try:
        if seed_path.parent == home:
            paths.ensure_home(home)
        made = identity.ensure(seed_path)
    except (IdentityError, MissingExtra) as exc:
        return _fail("machine", exc, 1)
    if as_json:
        print(
            json.dumps(
                {
                    "machine": name,
                    "public_key": made.public_key,
                    "seed": str(made.seed_path),
                    "created": made.created,
                    "configured": configured is not None,
                    "team": configured.team if configured else None,
                }
            )
        )
        return 0
    note = "" if configured else "  (from the host name: set machine in [federation] of config.toml)"
    print(f"machine     {name}{note}")
    print(f"public key  {made.public_key}")
    print(f"seed        {made.seed_path}{'  (created now, mode 0600)' if made.created else ''}")
    print(f"for the hub {name}={made.public_key}")
    return 0


def hub_config(
    pairs: Sequence[str],
    team: str,
    port: int,
    store: str | None,
    listen: str,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    cluster: Sequence[str | None] = (None, None, None, None),
    cluster_port: int = hub.DEFAULT_CLUSTER_PORT,
) -> int:
    """Print the nats-server configuration for these machines (hub.render). `cluster`: (name, node,
    routes, secret file), all or none, for one node of a hub of several."""
    command = shlex.join(
        [
            "agent-bridge",
            "federation",
            "hub-config",
            *pairs,
            "--team",
            team,
            "--port",
            str(port),
            *(["--store", store] if store else []),
            *(["--listen", listen] if listen != hub.DEFAULT_HOST else []),
            *(["--tls-cert", tls_cert, "--tls-key", tls_key] if tls_cert and tls_key else []),
            *([f"--{flag}={value}" for flag, value in zip(CLUSTER_FLAGS, cluster, strict=True) if value]),
            *(["--cluster-port", str(cluster_port)] if any(cluster) else []),
        ]
    )
    try:
        members = hub.parse_members(pairs)
        tls = _tls_files(tls_cert, tls_key)
        text = hub.render(
            members,
            team=hub.check_team(team),
            port=hub.check_port(port),
            store=Path(store) if store else None,
            host=listen,
            command=command,
            tls=tls,
            cluster=_cluster(cluster, cluster_port),
        )
    except FederationError as exc:
        return _fail("federation hub-config", exc, 2)
    sys.stdout.write(text)
    return 0


CLUSTER_FLAGS = ("cluster", "node", "routes", "cluster-secret-file")


def _cluster(values: Sequence[str | None], port: int) -> hub.Cluster | None:
    if not any(values):
        return None
    missing = [f"--{flag}" for flag, value in zip(CLUSTER_FLAGS, values, strict=True) if not value]
    if missing:
        raise hub.HubConfigError(
            f"a cluster node needs --cluster, --node, --routes and --cluster-secret-file; "
            f"missing {', '.join(missing)}"
        )
    name, node, routes, secret_file = (str(v) for v in values)
    secret_path = Path(secret_file).expanduser()
    try:
        secret = secret_path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        raise hub.HubConfigError(
            f"--cluster-secret-file: expected a readable file, got {secret_file!r}"
        ) from None
    return hub.make_cluster(name, node, port, routes.split(","), secret)


def _tls_files(cert: str | None, key: str | None) -> tuple[Path, Path] | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise hub.HubConfigError("--tls-cert and --tls-key go together (the hub's certificate and its key)")
    for flag, value in (("--tls-cert", cert), ("--tls-key", key)):
        if not Path(value).expanduser().is_file():
            raise hub.HubConfigError(f"{flag}: expected a PEM file, got {value!r} (no such file)")
    return Path(cert), Path(key)


def status(as_json: bool) -> int:
    """`agent-bridge federation status [--json]`: the hub connection as the broker has it (none
    while no broker runs), the team's machines with when each was last heard, the outbox's depth
    and oldest row, and the last error. Reads bridge.db itself: works with the broker down."""
    import time

    from agent_bridge.ipc import blocking
    from agent_bridge.ipc.protocol import RemoteError
    from agent_bridge.store import federation_queries, reader

    home = paths.home()
    try:
        configured = settings.load(home)
    except SettingsError as exc:
        return _fail("federation status", exc, 2)
    if configured is None:
        if as_json:
            print(json.dumps({"configured": False}))
        else:
            print("federation: not configured (no [federation] in config.toml; see docs/federation.md)")
        return 0
    try:
        hub_state: dict[str, object] | None = blocking.call(home, "status", timeout=5.0).get("federation")
    except (blocking.BrokerUnavailable, RemoteError, OSError):
        hub_state = None
    with reader.reading(paths.db_path(home)) as conn:
        machines = [] if conn is None else federation_queries.machines(conn)
        outbox = (federation_queries.OutboxStats(0, None) if conn is None
                  else federation_queries.outbox_stats(conn))
    others = [{"name": m.name, "heardAt": m.heard_at} for m in machines if m.name != configured.machine]
    now = int(time.time() * 1000)
    out = {
        "configured": True,
        "machine": configured.machine,
        "team": configured.team,
        "url": configured.url,
        "broker": hub_state is not None,
        "connected": bool(hub_state and hub_state.get("connected")),
        "since": None if hub_state is None else hub_state.get("since"),
        "lastError": None if hub_state is None else hub_state.get("lastError"),
        "lastErrorAt": None if hub_state is None else hub_state.get("lastErrorAt"),
        "machines": others,
        "outbox": {"depth": outbox.depth, "oldest": outbox.oldest, "unconfirmed": outbox.unconfirmed,
                   "decisions": outbox.decisions, "awaitingFirstMachine": outbox.parked},
    }
    if as_json:
        print(json.dumps(out))
        return 0

    def ago(at: object) -> str:
        return "never" if not isinstance(at, int) else f"{max(0, now - at) // 1000} s ago"

    print(f"federation: machine {configured.machine} of team {configured.team}, hub {configured.url}")
    if hub_state is None:
        print("hub: unknown (no broker runs: `agent-bridge up`)")
    else:
        print(f"hub: {'connected' if out['connected'] else 'not connected'} since {ago(out['since'])}")
    heard = ", ".join(f"{m['name']} (heard {ago(m['heardAt'])})" for m in others)
    print(f"machines: {heard or 'none heard yet'}")
    oldest = f", oldest queued {ago(outbox.oldest)}" if outbox.oldest else ""
    unconfirmed = f", {outbox.unconfirmed} unconfirmed" if outbox.unconfirmed else ""
    print(f"outbox: {outbox.depth} waiting{oldest}{unconfirmed}")
    if outbox.decisions:
        first = f", {outbox.parked} of them until a first machine is heard" if outbox.parked else ""
        print(f"decisions and retractions owed to the team: {outbox.decisions}{first}")
    if out["lastError"]:
        print(f"last error: {out['lastError']} ({ago(out['lastErrorAt'])})")
    return 0

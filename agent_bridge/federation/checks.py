"""What `doctor` (and `up`, before it starts federation) can say about this machine's federation
setup without the network: one line per problem, nothing when all is well or [federation] is absent.

    for line in checks.local_problems(home):
        print(f"federation: {line}")

The hub's reachability is the transport's status (`Transport.status`), shown by `federation status`.
"""

from __future__ import annotations

from pathlib import Path

from agent_bridge.federation import identity, settings
from agent_bridge.federation.errors import FederationError, require


def local_problems(home_dir: Path) -> list[str]:
    """Problems with [federation], the seed and the extra, each one line (SPEC §10: never a traceback)."""
    try:
        configured = settings.load(home_dir)
    except FederationError as exc:
        return [str(exc)]
    if configured is None:
        return []
    problems: list[str] = []
    if not configured.seed.exists():
        problems.append(
            f"{configured.seed}: no seed yet: run `agent-bridge machine` and give the hub its public key"
        )
    else:
        try:
            identity.load(configured.seed)
        except FederationError as exc:
            problems.append(str(exc))
    try:
        require("nats")
    except FederationError as exc:
        problems.append(str(exc))
    return problems

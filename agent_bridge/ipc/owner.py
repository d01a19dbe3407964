"""The owner's calls to the broker: the command line's (`agent-bridge decide | send | …`) and
the dashboard's owner actions, which take the same path. A broker is started when none runs, as
an MCP server does; a refusal is a CommandError, said in one line. Standard library and the
blocking client only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent_bridge.common import paths
from agent_bridge.ipc import blocking
from agent_bridge.ipc.protocol import RemoteError

CALL_TIMEOUT = 30.0  # a decide fans out to every connected session in one transaction
START_TIMEOUT = 60.0  # `up --detach` waits up to 20 s itself; this only bounds a stuck child
BAD_ARGUMENTS = 2  # the exit code for bad arguments, everywhere (argparse's own)


class CommandError(Exception):
    """A refusal, said in one line; `code` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def ensure_broker(home: Path) -> None:
    """Start a detached broker when none runs for `home` (what an MCP server does), saying so on
    stderr; a broker that refuses to start (a newer database, a bad config) is a CommandError."""
    if blocking.broker_socket(home) is not None:
        return
    up = subprocess.run(
        [sys.executable, "-m", "agent_bridge", "up", "--detach"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        env={**os.environ, "AGENT_BRIDGE_HOME": str(home)},
    )
    if up.returncode != 0 or blocking.broker_socket(home) is None:
        lines = [line for line in (up.stderr or "").splitlines() if line.strip()]
        why = lines[-1].removeprefix("agent-bridge up: ") if lines else f"exit status {up.returncode}"
        raise CommandError(f"no broker was running and none could be started: {why}")
    print(f"agent-bridge: started a broker for {home} (stop it with `agent-bridge down`)", file=sys.stderr)


def broker_call(op: str, home: Path | None = None, **args: Any) -> Any:
    """`op` done by the broker of `home` (default: this environment's), as the command line
    does it: a broker is started when none runs. The dashboard's owner actions come here too."""
    from agent_bridge.ipc.protocol import unstorable_text

    where = unstorable_text(args)
    if where is not None:  # argv bytes that are not UTF-8 arrive as lone surrogates
        raise CommandError(f"{where}: not valid text (is it UTF-8?); nothing was sent", BAD_ARGUMENTS)
    home = paths.ensure_home(home or paths.home())
    ensure_broker(home)
    try:
        return blocking.call(home, op, timeout=CALL_TIMEOUT, **args)
    except RemoteError as exc:
        raise CommandError(exc.message, BAD_ARGUMENTS if exc.code == "bad_request" else 1) from None
    except blocking.BrokerUnavailable as exc:
        raise CommandError(f"the broker did not answer: {exc}") from None

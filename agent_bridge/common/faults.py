"""Test-only crash points: `AGENT_BRIDGE_FAULT=<point>[@<n>]` makes the process kill itself
with SIGKILL the n-th time (default: the first time) it reaches `<point>`; with `/stop` after
it, the process stops itself (SIGSTOP) there instead, so a test can act while it stands still
(send it a signal) and then let it go on (SIGCONT).

Read once, when the broker starts (`broker.root.run_broker`) and when a relay starts
(`relay.main.Relay`); nothing else reads it. Unset (as it is for every user) the injector is a
no-op. The points, each named where it is called; the broker's:

  upgrade:backup-copied    the pre-upgrade backup is copied, not yet renamed into place
  upgrade:after-backup     the backup is in place, the upgrade transaction not yet begun
  upgrade:after-step       a schema step ran inside the (uncommitted) upgrade transaction
  upgrade:before-commit    every step ran; the upgrade transaction is about to commit
  decide:after-decision    the revision row is written, no notification yet (uncommitted)
  decide:mid-fanout        the first notification is written, the others not (uncommitted)
  decide:before-commit     everything is written; the transaction is about to commit
  decide:after-commit      the decision and its notifications are committed; no answer yet
  send:before-commit       a message and its receipt are written, not committed
  send:after-commit        the message is committed; the sender has no answer yet
  ack:before-commit        receipts are marked acknowledged, not committed
  ack:after-commit         the acknowledgement is committed; the session has no answer yet
  deliver:after-push       a message was pushed to its session, which has not acked it yet
  retract:after-record     the retraction row is written, no notice yet (uncommitted)
  retract:mid-notices      the first notice is written, the others not (uncommitted)
  retract:before-commit    everything is written; the transaction is about to commit
  forget:before-commit     the sessions are forgotten and their queues dropped, not committed

and the relay's:

  relay:after-write        a line that shows messages is written to the host, not yet noted
                           as shown (nor reported written to the broker)
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping

Fault = Callable[[str], None]
FAULT_ENV = "AGENT_BRIDGE_FAULT"


def no_fault(point: str) -> None:
    return None


def fault_injector(env: Mapping[str, str] | None = None) -> Fault:
    spec = (os.environ if env is None else env).get(FAULT_ENV, "").strip()
    if not spec:
        return no_fault
    spec, _, action = spec.partition("/")
    if action not in ("", "stop"):
        raise ValueError(f"{FAULT_ENV}: expected <point>[@<n>][/stop], got {spec!r}/{action!r}")
    wanted, _, nth = spec.partition("@")
    remaining = int(nth) if nth else 1
    if remaining < 1:
        raise ValueError(f"{FAULT_ENV}: expected <point>[@<n>] with n >= 1, got {spec!r}")

    def fault(point: str) -> None:
        nonlocal remaining
        if point != wanted:
            return
        remaining -= 1
        if remaining == 0:
            os.kill(os.getpid(), signal.SIGSTOP if action == "stop" else signal.SIGKILL)

    return fault

"""When the relay looks for its broker, starts one, and how long it waits between tries: the
connection keeper's decisions, with no I/O (time and what was found are arguments).

The I/O half (relay.connector) finds the broker's socket, runs `agent-bridge up --detach`,
says hello, sleeps for as long as this machine says, and tells it what happened:

- nothing answered (`missed`): wait BACKOFF_START, doubling up to BACKOFF_MAX; a broker that
  stays unreachable RESTART_AFTER seconds is started again (`start_due`);
- the broker refused this session, or is not ours (`refused_by`): wait REFUSED_BACKOFF_START,
  doubling up to REFUSED_BACKOFF_MAX; that broker is up, so nothing is restarted;
- a start failed (`start_failed`): wait START_BACKOFF_FIRST, doubling, and give up after
  START_ATTEMPTS in a row; a failure `up` calls permanent is tried again only once the files it
  depends on have changed (`blocked_until_changed`: their identity then);
- a hello answered (`joined`): all of it is forgotten.
"""

from __future__ import annotations

from typing import Any

BACKOFF_START, BACKOFF_MAX = 0.05, 2.0
RESTART_AFTER = 2.0  # broker unreachable this long: start one ourselves
# A broker that cannot start (a newer or corrupt database, a read-only folder) fails the same way
# each time: wait longer between tries, and stop after a few, so relays never respawn it forever.
START_BACKOFF_FIRST, START_ATTEMPTS = 0.5, 5
REFUSED_BACKOFF_START, REFUSED_BACKOFF_MAX = 0.5, 30.0  # another connection holds our host session id

NOT_REACHABLE = "the agent-bridge broker is not reachable right now; it is being restarted, try again shortly"


class Keeper:
    """The connection keeper's state: one broker connection at a time, looked for with backoff."""

    def __init__(self) -> None:
        self.backoff = BACKOFF_START
        self.refused_wait = REFUSED_BACKOFF_START
        self.down_since: float | None = None  # when the broker was last found unreachable
        self.refused: str | None = None  # why the broker will not take this session now
        self.start_failure: str | None = None  # why the last broker we started could not start
        self.start_attempts = 0  # consecutive failed starts
        self.next_start = 0.0  # no new start is tried before this
        # After a permanent refusal: the identity of the files it depends on then; no start is
        # tried while they are the same.
        self.blocked_until_changed: tuple[Any, ...] | None = None

    @property
    def known(self) -> bool:
        """Whether waiting for a broker has a known end now (refused, or it cannot start)."""
        return self.refused is not None or self.start_failure is not None

    def start_due(self, now: float, found: bool) -> bool:
        """Whether to start a broker now (before the blocked check, which needs the files):
        none is registered, or the registered one has not answered for RESTART_AFTER."""
        down_long = self.down_since is not None and now - self.down_since > RESTART_AFTER
        return (not found or down_long) and self.start_attempts < START_ATTEMPTS and now >= self.next_start

    def still_blocked(self, files: tuple[Any, ...]) -> bool:
        """Whether a permanent refusal still holds, `files` being the start files' identity now.
        Once they changed, starting is tried again as if for the first time."""
        if self.blocked_until_changed is None:
            return False
        if files == self.blocked_until_changed:
            return True
        self.blocked_until_changed = None
        self.start_attempts, self.next_start = 0, 0.0
        return False

    def start_failed(self, reason: str, now: float, permanent_files: tuple[Any, ...] | None) -> None:
        """A broker we started could not start, `up` said `reason`; `permanent_files`: the start
        files' identity before the try, when `up` called the refusal permanent."""
        self.start_failure = reason
        self.start_attempts += 1
        self.next_start = now + START_BACKOFF_FIRST * 2 ** (self.start_attempts - 1)
        if permanent_files is not None:
            self.blocked_until_changed = permanent_files

    @property
    def gave_up(self) -> bool:
        return self.start_attempts >= START_ATTEMPTS

    def refused_by(self, reason: str) -> tuple[bool, float]:
        """The broker refused this session's hello (or is not ours): (first time, seconds to
        wait before the next hello)."""
        first = self.refused is None
        self.refused = reason
        wait = self.refused_wait
        self.refused_wait = min(self.refused_wait * 2, REFUSED_BACKOFF_MAX)
        self.down_since = None  # the broker is up: nothing to restart
        return first, wait

    def missed(self, now: float) -> float:
        """No broker answered (or its connection ended): seconds to wait before looking again."""
        if self.down_since is None:
            self.down_since = now
        wait = self.backoff
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)
        return wait

    def joined(self) -> None:
        """A broker answered this session's hello."""
        self.down_since = None
        self.backoff, self.refused_wait = BACKOFF_START, REFUSED_BACKOFF_START
        self.refused = self.start_failure = self.blocked_until_changed = None
        self.start_attempts, self.next_start = 0, 0.0

    def unreachable(self, start_files: str = "") -> str:
        """Why a tool call gets no broker (today's reason, as the tool error the agent reads)."""
        if self.refused is not None:
            return f"agent-bridge: this session is not connected: {self.refused}"
        if self.start_failure is not None:
            if self.blocked_until_changed is not None:
                return (
                    f"the agent-bridge broker cannot start: {self.start_failure}; gave up until that "
                    f"changes: "
                    "fix it, then run `agent-bridge up` (this session connects once it runs)"
                )
            if self.gave_up:
                return (f"the agent-bridge broker cannot start: {self.start_failure}; gave up after "
                        f"{self.start_attempts} attempts: fix that, then run `agent-bridge up` (this session "
                        "connects once it runs)")
            return f"the agent-bridge broker cannot start: {self.start_failure}; trying again"
        return NOT_REACHABLE

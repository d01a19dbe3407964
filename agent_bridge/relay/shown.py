"""What the relay holds, wrote to the host, and the broker has not confirmed recording: the
relay's half of the showing machine (agent_bridge.core.showing), and the ledger file
(agent_bridge.common.ledger) as that machine's unconfirmed part, while no broker confirms it.

The caller serializes access (the relay's lock); `peer` is this session's id, once known.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agent_bridge.common import ledger
from agent_bridge.core.showing import Showing
from agent_bridge.ipc.frames import Acked, Offered, RelayFrame

log = logging.getLogger("agent_bridge.mcp")


def batches(ids: list[str]) -> list[list[str]]:
    return [ids[i:i + ledger.IDS_MAX] for i in range(0, len(ids), ledger.IDS_MAX)]


class Shown:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.showing = Showing()
        self.ledger_peer: str | None = None  # the session whose ledger file this relay keeps now

    def save(self, peer: str | None) -> None:
        """The machine's unconfirmed part (offered, or written and not confirmed recorded) in
        the ledger file, every id of it; none left: no file."""
        if peer is None:
            return
        if self.ledger_peer is not None and self.ledger_peer != peer:
            ledger.remove(self.home, self.ledger_peer)
        offered, acked = self.showing.unconfirmed()
        try:
            ledger.save(self.home, peer, offered, acked)
        except OSError as exc:
            log.warning("could not keep acknowledgements in %s: %s", self.home / ledger.FOLDER, exc)
        self.ledger_peer = peer if offered or acked else None

    def save_if_kept(self, peer: str | None) -> None:
        """`save`, when a ledger file is kept now."""
        if self.ledger_peer is not None:
            self.save(peer)

    def take_back(self, key: str, peer: str | None) -> None:
        """The host cancelled request `key`. If its result was already written, the cancel
        crossed it and the host ignored it: its messages are not acknowledged from here (not
        kept for a next broker, not in the ledger). The broker, told of the cancel too, shows
        them again as repeats; if it never hears of it, they are still offered and
        unacknowledged there, so the next session shows them as repeats."""
        _, again = self.showing.cancel(key)
        if again:
            self.save_if_kept(peer)

    def keep_written(self, peer: str | None) -> None:
        """What was shown and maybe never recorded, for the next broker, and in the ledger
        meanwhile."""
        self.showing.lost()
        if any(self.showing.unconfirmed()):
            self.save(peer)

    def hand_over_acks(self, now: float) -> list[RelayFrame]:
        """The acknowledgements kept while no broker answered, as "acked" frames; they wait for
        its confirmation like written ones."""
        return [Acked(ids) for ids in batches(self.showing.take_acks(now))]

    def for_hello(self) -> tuple[list[str], list[str]]:
        """What this relay showed and no broker recorded, as far as a hello carries it (IDS_MAX
        ids: recorded before the session's delivery starts): (acknowledged, offered)."""
        acked = self.showing.due()[: ledger.IDS_MAX]
        offered = self.showing.unconfirmed()[0][: ledger.IDS_MAX - len(acked)]
        return acked, offered

    def joined(self, acked: list[str], offered: list[str], now: float, peer: str | None) -> list[RelayFrame]:
        """A broker recorded the hello's `acked` and `offered`: the rest, as frames for it."""
        self.showing.reported(acked)
        self.showing.recorded(acked)
        carried = set(offered)
        rest = [mid for mid in self.showing.unconfirmed()[0] if mid not in carried]
        frames: list[RelayFrame] = [Offered(ids) for ids in batches(rest)]
        frames += self.hand_over_acks(now)
        self.save(peer)  # what is left unconfirmed, if a ledger file is kept
        self.showing.forget_queued()  # the new broker pushes what is still unacknowledged
        return frames

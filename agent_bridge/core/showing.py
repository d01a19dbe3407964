"""One ledger of showing (SPEC §3): the delivery guarantee as one state machine, with no I/O.

Each (session, message) is in exactly one state here:

    QUEUED      waiting to be shown (marked `repeat` when it may have been shown before)
    OFFERED     put into an answer for request or line `by`, not handed on yet
    ON_ITS_WAY  that answer is on its way to the host's pipe, not known to be written
    SETTLING    written to the host; a cancel of `by` may still cross it until `due`
    WRITTEN     written, and no cancel can take it back: its acknowledgement is due
    RECORDING   the acknowledgement is with the recorder (the broker's store, or for the relay
                the broker), not confirmed yet
    ACKED       confirmed: kept only to drop a replay of it

and the processes only feed it events and carry out what it returns:

    arrive(message)            a message to show (pushed by the broker, or held by the relay)
    offer(by, ids)             an answer for `by` will show these (returns them, repeats marked)
    on_its_way(by)             that answer left for the host
    written(by, ids, now, grace)  its bytes are in the host's pipe
    cancel(by)                 the host cancelled `by`: unwritten, nothing shown; written, the
                               host ignores it: offered again, first in line, as repeats
    tick(now)                  time passes: settled answers come due
    eof()                      the host closed its input: no cancel can follow any more
    take_acks(now)             the acknowledgements due, handed to the recorder
    recorded(ids) / not_recorded(ids)   the recorder's answer
    lost()                     the recorder went away before it confirmed: due again
    elsewhere(ids)             acknowledged through another path (a Stop hook, a ledger)
    offered_elsewhere(ids)     offered through another path: shown again, they are repeats
    client_offers(ids)         a client that holds the messages itself (a bridge-protocol
                               session) is about to show these; client_withdraws(ids): it won't
    unconfirmed()              what a ledger must keep: (offered, acknowledged, not confirmed)

Request ids are keyed once, as the MCP SDK correlates them (`key`: "7" and 7 are one request).
Time is an argument; there are no threads, sockets or clocks in here. `tests/test_showing_model.py`
drives it against a reference model with hypothesis.

Standard library only: the relay uses it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

QUEUED, OFFERED, ON_ITS_WAY, SETTLING, WRITTEN, RECORDING, ACKED = (
    "queued", "offered", "on_its_way", "settling", "written", "recording", "acked",
)
UNWRITTEN = (OFFERED, ON_ITS_WAY)
UNCONFIRMED = (SETTLING, WRITTEN, RECORDING)  # written to the host, acknowledgement not confirmed
ACKED_MEMORY = 50_000  # acknowledged ids kept to drop replays; unconfirmed ones are never dropped
CLIENT = "client"  # `by` of what a bridge-protocol client offered (it holds the messages itself)
CANCELLED_MEMORY = 1_000  # requests cancelled before they offered anything: they never will


def key(rid: Any) -> str:
    """A JSON-RPC request id as one key, correlated as the MCP SDK does (`coerce_request_id`:
    a string holding an integer is that integer)."""
    if type(rid) is int:  # the usual case, on every answer: json.dumps of an int is its digits
        return str(rid)
    if isinstance(rid, str):
        try:
            rid = int(rid)
        except ValueError:
            pass
    return json.dumps(rid)


class Entry:
    __slots__ = ("mid", "message", "known", "state", "by", "due", "repeat", "order")

    def __init__(self, message: dict[str, Any], known: bool = True) -> None:
        self.mid = str(message["id"])
        self.message = message
        self.known = known  # False: only its id is known here (the relay wrote what the broker sent)
        self.state = QUEUED
        self.by: str | None = None
        self.due = 0.0
        # offered before (elsewhere) without a confirmed acknowledgement
        self.repeat = bool(message.get("repeat"))
        self.order = 0  # its place in the queue (Showing._place)

    def shown(self) -> dict[str, Any]:
        """The message as it is offered now."""
        return dict(self.message, repeat=True) if self.repeat else self.message


class Entries:
    """One session's messages not acknowledged, each one Entry indexed by its state and by the
    answer that shows it, so that each event and query touches only the entries it concerns;
    the acknowledged ones kept as ids. The index and the queries; Showing has the events."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self._in: dict[str, dict[str, Entry]] = {state: {} for state in (QUEUED, *UNWRITTEN, *UNCONFIRMED)}
        self._of: dict[str, dict[str, Entry]] = {}  # by -> its entries
        # Whether SETTLING is in the order its entries come due (each `written` with a grace is
        # due `now + grace`, later than the one before): then the first is the next due, and a
        # tick stops at the first not due. Should an entry come in due before the last one there,
        # SETTLING is searched whole until it empties. (One settling entry per answer written in
        # the last CANCEL_GRACE: a thousand at a few thousand messages a second.)
        self._settling_in_order = True
        self._back = 0  # the last arrival's order
        self._front = 0  # the order of the last entry put first in line
        self.acked: OrderedDict[str, None] = OrderedDict()
        self.cancelled: OrderedDict[str, None] = OrderedDict()

    # --- queries --------------------------------------------------------------------

    def state(self, mid: str) -> str | None:
        entry = self.entries.get(mid)
        if entry is not None:
            return entry.state
        return ACKED if mid in self.acked else None

    def queued(self, limit: int | None = None) -> list[dict[str, Any]]:
        """What an answer may show now, oldest first, repeats marked."""
        waiting = self._in[QUEUED]
        if not waiting:
            return []
        ordered = sorted(waiting.values(), key=_order)
        return [e.shown() for e in (ordered if limit is None else ordered[:limit])]

    def has_queued(self) -> bool:
        return bool(self._in[QUEUED])

    def repeats(self, ids: list[str]) -> set[str]:
        """Those of `ids` held here as maybe shown before (an answer the host cancelled after it
        was written, say): shown through another path (the Stop hook), they are repeats too."""
        return {mid for mid in ids if (entry := self.entries.get(mid)) is not None and entry.repeat}

    def busy(self) -> set[str]:
        """Being shown or acknowledged here now: not for another path to show."""
        return {mid for state, entries in self._in.items() if state != QUEUED for mid in entries}

    def unconfirmed(self) -> tuple[list[str], list[str]]:
        """(offered and maybe shown, written and not confirmed): the ledger's content. An answer
        on its way may have been written, and one the host cancelled after it was written may
        have been read: both count as offered, so they come back as repeats."""
        maybe = [*self._in[OFFERED].values(), *self._in[ON_ITS_WAY].values(),
                 *(e for e in self._in[QUEUED].values() if e.repeat)]
        written = [e for state in UNCONFIRMED for e in self._in[state].values()]
        return [e.mid for e in sorted(maybe, key=_order)], [e.mid for e in sorted(written, key=_order)]

    def due(self) -> list[str]:
        """Written, acknowledgement due, not handed to a recorder yet."""
        return [e.mid for e in sorted(self._in[WRITTEN].values(), key=_order)]

    def settling_due(self) -> float | None:
        settling = self._in[SETTLING]
        if self._settling_in_order:
            return next(iter(settling.values())).due if settling else None
        return min((e.due for e in settling.values()), default=None)

    def settled(self, now: float) -> list[Entry]:
        """The settling entries due by `now`."""
        settling = self._in[SETTLING]
        if not self._settling_in_order:
            return [e for e in settling.values() if e.due <= now]
        out = []
        for entry in settling.values():
            if entry.due > now:
                break
            out.append(entry)
        return out

    # --- inside ---------------------------------------------------------------------

    def _new(self, message: dict[str, Any], known: bool = True) -> Entry:
        """A new entry, last in line, queued."""
        entry = Entry(message, known)
        self._back += 1
        entry.order = self._back
        self.entries[entry.mid] = entry
        self._in[QUEUED][entry.mid] = entry
        return entry

    def _put(self, entry: Entry, state: str, by: str | None = None) -> None:
        """Move `entry` to `state`, shown by `by` (None when queued): every index follows."""
        mid = entry.mid
        if entry.state != state:
            self._in[entry.state].pop(mid, None)
            into = self._in[state]
            if state == SETTLING and into and entry.due < next(reversed(into.values())).due:
                self._settling_in_order = False
            elif entry.state == SETTLING and not self._in[SETTLING]:
                self._settling_in_order = True
            into[mid] = entry
            entry.state = state
        if entry.by != by:
            if entry.by is not None:
                shown_by = self._of.get(entry.by)
                if shown_by is not None:
                    shown_by.pop(mid, None)
                    if not shown_by:
                        del self._of[entry.by]
            if by is not None:
                self._of.setdefault(by, {})[mid] = entry
            entry.by = by

    def _first(self, entries: list[Entry]) -> None:
        """Put these first in line, in the order given."""
        for entry in reversed(entries):
            self._front -= 1
            entry.order = self._front

    def _drop(self, entry: Entry) -> None:
        self._put(entry, QUEUED)
        del self._in[QUEUED][entry.mid]
        del self.entries[entry.mid]

    def _by(self, by: str, states: tuple[str, ...]) -> list[Entry]:
        return sorted((e for e in self._of.get(by, {}).values() if e.state in states), key=_order)


class Showing(Entries):
    """The states of one session's messages in one process (see the module's docstring).

    Every message not acknowledged has one Entry, indexed by its state and by the answer that
    shows it, so that each event and query touches only the entries it concerns: a busy
    session's answers settling for their grace period are many, and none of them is looked at
    by the next `inbox`. Queue order is each entry's `order` (arrival, or the front for one
    offered again). The acknowledged ones are kept only as ids (ACKED), forgotten oldest first
    past ACKED_MEMORY."""

    # --- events ---------------------------------------------------------------------

    def arrive(self, message: dict[str, Any], *, reack: bool = True) -> bool:
        """A message to show; False for one already here (a replay). With `reack`, a replay of
        one acknowledged here means its recording was lost: it is due again."""
        mid = str(message["id"])
        if mid in self.acked:
            if reack:
                del self.acked[mid]
                again = self._new(message)
                again.repeat = True
                self._put(again, WRITTEN)
            return False
        entry = self.entries.get(mid)
        if entry is None:
            self._new(message)
            return True
        if not entry.known:
            entry.message, entry.known = message, True
        if entry.state == QUEUED and message.get("repeat"):
            entry.repeat = True
        return False

    def again(self, message: dict[str, Any]) -> None:
        """The broker withdrew this message (a cancel crossed its answer): first in line, a repeat."""
        mid = str(message["id"])
        self.acked.pop(mid, None)
        entry = self.entries.get(mid)
        if entry is None:
            entry = self._new(message)
        entry.message, entry.known, entry.repeat = message, True, True
        self._put(entry, QUEUED)
        self._first([entry])

    def offer(self, by: str, ids: list[str]) -> list[dict[str, Any]]:
        """An answer for `by` will show these queued messages: returned as shown, repeats marked.
        A request the host cancelled before it offered anything offers nothing."""
        if by in self.cancelled:
            return []
        out = []
        for mid in ids:
            entry = self.entries.get(mid)
            if entry is None or entry.state != QUEUED:
                continue
            out.append(entry.shown())
            self._put(entry, OFFERED, by)
        return out

    def on_its_way(self, by: str) -> None:
        for entry in self._by(by, (OFFERED,)):
            self._put(entry, ON_ITS_WAY, by)

    def written(self, by: str, ids: list[str], now: float, grace: float = 0.0) -> list[str]:
        """The answer for `by` showing `ids` is in the host's pipe. With a `grace`, a cancel may
        still take it back until `now + grace`; returns the ids that count as written."""
        done = []
        for mid in ids:
            entry = self.entries.get(mid)
            if entry is None or entry.state not in UNWRITTEN or entry.by != by:
                continue
            entry.repeat = True  # written once: if it is ever offered again, maybe seen
            if grace > 0:
                entry.due = now + grace
                self._put(entry, SETTLING, by)
            else:
                entry.due = now
                self._put(entry, WRITTEN, by)
            done.append(mid)
        return done

    def shown_directly(self, by: str | None, ids: list[str], *, reported: bool) -> None:
        """Written to the host for `by` by a path this machine did not offer (the relay writing
        the broker's answer), and `reported` to the recorder or not: acknowledged once confirmed."""
        for mid in ids:
            if mid in self.acked:
                continue
            entry = self.entries.get(mid)
            if entry is None:
                entry = self._new({"id": mid}, known=False)
            entry.repeat = True
            self._put(entry, RECORDING if reported else WRITTEN, by)

    def reported(self, ids: list[str]) -> None:
        """Written ones handed to the recorder (the relay's hand-over to a new broker)."""
        for mid in ids:
            entry = self.entries.get(mid)
            if entry is not None and entry.state == WRITTEN:
                self._put(entry, RECORDING, entry.by)

    def cancel(self, by: str) -> tuple[list[str], list[dict[str, Any]]]:
        """The host cancelled request `by`. Returns (withdrawn: offered but never written, now
        queued again; again: written or maybe written, so the host ignores an answer it may have
        read: queued again first in line as repeats)."""
        withdrawn, again = [], []
        found = self._by(by, (OFFERED, ON_ITS_WAY, SETTLING, WRITTEN, RECORDING))
        if not found:  # still running, maybe: whatever it would offer, it offers nothing
            self.cancelled[by] = None
            while len(self.cancelled) > CANCELLED_MEMORY:
                self.cancelled.popitem(last=False)
        for entry in found:
            if entry.state == OFFERED:
                withdrawn.append(entry.mid)
                self._put(entry, QUEUED)
                continue
            entry.repeat = True
            self._put(entry, QUEUED)
            again.append(entry)
        for entry in [e for e in again if not e.known]:  # the broker offers it again, whole
            self._drop(entry)
        again = [e for e in again if e.known]
        self._first(again)
        return withdrawn, [e.shown() for e in again]

    def withdraw(self, by: str) -> list[str]:
        """The answer for `by` never left (it failed, or the call ended before it existed):
        what it offered is queued again as it was."""
        out = []
        for entry in self._by(by, UNWRITTEN):
            self._put(entry, QUEUED)
            out.append(entry.mid)
        return out

    def tick(self, now: float) -> None:
        """Settled answers (grace over by `now`) come due."""
        for entry in self.settled(now):
            self._put(entry, WRITTEN, entry.by)

    def eof(self) -> None:
        """The host closed its input: no cancel can follow; every settling answer is due."""
        self.tick(float("inf"))

    def take_acks(self, now: float) -> list[str]:
        """The acknowledgements due by `now`, handed to the recorder (RECORDING)."""
        self.tick(now)
        out = sorted(self._in[WRITTEN].values(), key=_order)
        for entry in out:
            self._put(entry, RECORDING, entry.by)
        return [e.mid for e in out]

    def recorded(self, ids: list[str]) -> None:
        """The recorder confirmed these acknowledgements."""
        for mid in ids:
            entry = self.entries.get(mid)
            if entry is not None and entry.state == RECORDING:
                self._ack(mid)
        self._forget_acked()

    def not_recorded(self, ids: list[str]) -> None:
        """The recorder could not take these now: due again."""
        for mid in ids:
            entry = self.entries.get(mid)
            if entry is not None and entry.state == RECORDING:
                self._put(entry, WRITTEN, entry.by)

    def lost(self) -> None:
        """The recorder went away: what it did not confirm is due again (for the next one)."""
        for entry in list(self._in[RECORDING].values()):
            self._put(entry, WRITTEN, entry.by)

    def elsewhere(self, ids: list[str]) -> None:
        """Acknowledged through another path (a Stop hook, a ledger): done here too."""
        for mid in ids:
            self._ack(mid)
        self._forget_acked()

    def offered_elsewhere(self, ids: list[str]) -> None:
        """Offered through another path (the Stop hook): offered here again, they are repeats."""
        for mid in ids:
            entry = self.entries.get(mid)
            if entry is not None:
                entry.repeat = True

    def client_offers(self, ids: list[str]) -> list[str]:
        """A client that holds the messages itself (a bridge-protocol session, not the MCP side
        here) is about to show these: maybe written from now on. Returns the ones it offered
        before without an acknowledgement: shown again, they are repeats."""
        before = []
        for mid in ids:
            if mid in self.acked:
                continue
            entry = self.entries.get(mid)
            if entry is not None and entry.state != QUEUED:
                before.append(mid)
                continue
            if entry is None:
                entry = self._new({"id": mid}, known=False)
            self._put(entry, ON_ITS_WAY, CLIENT)
        return before

    def client_withdraws(self, ids: list[str]) -> None:
        """That client's host cancelled the call that offered these: not shown after all."""
        for mid in ids:
            entry = self.entries.get(mid)
            if entry is not None and entry.by == CLIENT and entry.state in UNWRITTEN:
                if entry.known:
                    self._put(entry, QUEUED)
                else:
                    self._drop(entry)

    def forget_queued(self) -> None:
        """A new broker pushes what is still unacknowledged: drop the queued copies."""
        for entry in list(self._in[QUEUED].values()):
            self._drop(entry)

    def _ack(self, mid: str) -> None:
        entry = self.entries.get(mid)
        if entry is not None:
            self._drop(entry)
        self.acked[mid] = None

    def _forget_acked(self) -> None:
        while len(self.acked) > ACKED_MEMORY:
            self.acked.popitem(last=False)


def _order(entry: Entry) -> int:
    return entry.order

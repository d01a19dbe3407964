"""The connected sessions (SPEC §3): who is connected right now, under which record.

Below both the broker (which routes requests to these sessions) and the identity rules (which
decide which record a connection is): both change it only through these methods. What each
connected session is showing its host lives in its own showing machine (`Session.showing`,
agent_bridge.core.showing), which moves with the session object when its record changes.
"""

from __future__ import annotations

from agent_bridge.broker.sessions.session import Session
from agent_bridge.core.showing import Showing


class Registry:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}  # peer id -> the connected session
        # The showing machines of connections that ended while the store could not record
        # what they had offered (its disk failed), by the record they showed for: their
        # unconfirmed part is written before the next session is served (SPEC §3: shown
        # again, those messages are repeats).
        self.parked: list[tuple[str, Showing]] = []

    def add(self, session: Session) -> None:
        self.sessions[session.id] = session

    def drop(self, session: Session) -> None:
        """Unregister `session` (only if it is still the one registered under its record)."""
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]

    def holds(self, session: Session) -> bool:
        return self.sessions.get(session.id) is session

    def get(self, peer_id: str) -> Session | None:
        return self.sessions.get(peer_id)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self.sessions

    def connected_ids(self) -> set[str]:
        return set(self.sessions)

    def connected_names(self, *, excluding: Session | None = None) -> set[str]:
        return {s.name for s in self.sessions.values() if s is not excluding}

    def find_connected(self, address: str) -> Session | None:
        """The connected session `address` names; a tentative one only if no other matches."""
        found = None
        for s in self.sessions.values():
            peer = s.peer  # read once: every send looks its recipient up here
            if address == peer.id or address == peer.name or address == peer.host_session_id:
                if not s.tentative:
                    return s
                found = found or s
        return found

    def showing_now(self, peer_id: str) -> set[str]:
        """The messages the connected session of record `peer_id` is showing its host right now
        (offered, written, acknowledgement not recorded): not for another path to show."""
        session = self.sessions.get(peer_id)
        return session.showing.busy() if session is not None else set()

    def repeats_now(self, peer_id: str, ids: list[str]) -> set[str]:
        """Those of `ids` the connected session of record `peer_id` holds as maybe shown before
        (Showing.repeats): another path shows them as repeats."""
        session = self.sessions.get(peer_id)
        return session.showing.repeats(ids) if session is not None else set()

    def park(self, peer_id: str, machine: Showing) -> None:
        self.parked.append((peer_id, machine))

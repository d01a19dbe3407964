"""Apply each named mutation to core/federation.py in turn, run the model test and the case
tests, restore the file.

Run by hand from the repository root once `nox -s tests` has made .nox/tests:
`python3 tests/federation/mutate_outbox.py`. Every line must say CAUGHT twice (the model
searches at random: a mutation needing several faults together may, rarely, pass one run).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

MODULE = Path("agent_bridge/core/federation.py")
TESTS = {"model": "tests/federation/test_outbox_model.py", "cases": "tests/federation/test_outbox.py"}

MUTATIONS = {
    "ack before commit": (
        "        self._applying.add(token)\n        return [Apply(token)]",
        "        self._applying.add(token)\n        return [Apply(token), AckStream(token)]",
    ),
    "ack after a failed commit": (
        "        self._applying.discard(token)\n        return []",
        "        return self.applied(token)",
    ),
    "new message id on retry": (
        "actions.append(Publish(entry.id, entry.kind, msg_id=entry.id))",
        'actions.append(Publish(entry.id, entry.kind, msg_id=f"{entry.id}#{entry.tries}"))',
    ),
    "timeout treated as failure": (
        "        if entry is not None:\n            self._unknown(entry, now)\n        return []",
        "        if entry is not None:\n            del self._entries[(kind, row_id)]\n"
        "            return [Drop(row_id, kind)]\n        return []",
    ),
    "PubAck treated as delivered": (
        "        if kind not in CONFIRMED:\n            del self._entries",
        "        if True:\n            del self._entries",
    ),
    "a restart forgets relayed messages": (
        "            self.queued(row, now)\n            if row.relayed_at is not None:",
        "            if row.relayed_at is None:\n"
        "                self.queued(row, now)\n            if False:",
    ),
    "unconfirmed before the bound": (
        "now - entry.queued_at >= UNCONFIRMED_AFTER",
        "now - entry.queued_at >= UNCONFIRMED_AFTER / 2",
    ),
    "a decision done at its PubAck": (
        "        if kind not in CONFIRMED:\n            del self._entries",
        "        if kind != MSG:\n            del self._entries",
    ),
    "a confirmation ends the wrong row": (
        "        entry = self._entries.pop((kind, row_id), None)",
        "        entry = self._entries.pop((MSG, row_id), None)",
    ),
    "a decision owed to nobody ends at its PubAck": (
        "        if team.heard == 0:\n            entry.parked = True\n            return []",
        "        if team.heard == 0:\n            return self.confirmed(DEC, row_id, now)",
    ),
    "a newcomer is not owed a parked decision": (
        "        entry.parked = False\n        entry.queued_at, entry.unconfirmed_at",
        "        entry.queued_at, entry.unconfirmed_at",
    ),
    "a parked decision is marked unconfirmed": (
        "                and not entry.parked\n                and now - entry.queued_at",
        "                and now - entry.queued_at",
    ),
    "a hub's lost store changes nothing": (
        "            if not entry.in_flight and not entry.parked:\n                entry.relays = 0",
        "            if False:\n                entry.relays = 0",
    ),
}


def main() -> None:
    original = MODULE.read_text()
    for name, (before, after) in MUTATIONS.items():
        assert original.count(before) == 1, f"{name}: the code it mutates changed"
        MODULE.write_text(original.replace(before, after))
        verdicts = []
        try:
            for label, test in TESTS.items():
                run = subprocess.run(
                    [".nox/tests/bin/pytest", "-q", "-x", "-p", "no:cacheprovider", test],
                    capture_output=True, text=True, check=False,
                )
                verdicts.append(f"{label} {'CAUGHT' if run.returncode else 'MISSED'}")
        finally:
            MODULE.write_text(original)
        print(f"{name}: {', '.join(verdicts)}")

if __name__ == "__main__":
    main()

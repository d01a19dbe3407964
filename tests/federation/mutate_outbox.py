"""Apply each named mutation to core/federation.py in turn, run the model test, restore the file.

Run by hand from the repository root once `nox -s tests` has made .nox/tests:
`python3 tests/federation/mutate_outbox.py`. Every line must say CAUGHT.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

MODULE = Path("agent_bridge/core/federation.py")
TEST = "tests/federation/test_outbox_model.py"

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
        "        if kind != MSG:\n            del self._entries",
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
}


def main() -> None:
    original = MODULE.read_text()
    for name, (before, after) in MUTATIONS.items():
        assert original.count(before) == 1, f"{name}: the code it mutates changed"
        MODULE.write_text(original.replace(before, after))
        try:
            run = subprocess.run(
                [".nox/tests/bin/pytest", "-q", "-x", "-p", "no:cacheprovider", TEST],
                capture_output=True, text=True, check=False,
            )
        finally:
            MODULE.write_text(original)
        why = [line.strip() for line in run.stdout.splitlines() if line.startswith("E") and "Error" in line]
        print(f"{name}: {'CAUGHT' if run.returncode else 'MISSED'}", *why[:1])


if __name__ == "__main__":
    main()

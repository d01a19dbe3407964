"""Time and row ids for the store and the broker: below both, so the daemon never imports
them from the writer. Standard library only."""

from __future__ import annotations

import os
import random
import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# Ids name rows; they are not secrets (session secrets come from `secrets`). Time-ordered
# (UUID version 7): a new row's id sorts after the ids before it, so a batch of inserts lands
# on the last pages of the primary-key indexes (messages, receipts) instead of one page per
# message spread over the whole index, which every commit then wrote to the WAL again and
# every checkpoint copied. The random part comes from a generator seeded from the OS:
# `uuid.uuid4()` asks the kernel for 16 bytes at every call.
_ids = random.Random(os.urandom(32))
if hasattr(os, "register_at_fork"):  # a forked child must not repeat its parent's ids
    os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def new_id() -> str:
    """A UUID version 7 (RFC 9562: Unix milliseconds, then 74 random bits), as text."""
    n = (
        time.time_ns() // 1_000_000 << 80
        | 0x7 << 76
        | _ids.getrandbits(12) << 64
        | 0b10 << 62
        | _ids.getrandbits(62)
    )
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

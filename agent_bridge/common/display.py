"""Text for people at a terminal: what agents wrote, made safe to print, and values in words.

Names, decision texts, messages and project paths come from agents (SPEC §8 "Terminal output"):
printed as they are, an ESC or BEL sequence in them could recolour, retitle or rewrite the
owner's terminal. `visible` is the one function every human-readable output goes through;
`--json` output is JSON as is (json.dumps escapes control characters itself).

Standard library only: the CLI's light commands import it.
"""

from __future__ import annotations

import time
import unicodedata
from typing import Any

# Characters that steer a terminal or reorder what it shows, rather than being shown:
# C0 and C1 controls, DEL, bidirectional overrides and isolates, and lone surrogates (which a
# terminal's encoder cannot print at all). Everything else is printed as is.
_BIDI = frozenset(range(0x202A, 0x202F)) | frozenset(range(0x2066, 0x206A)) | {0x200E, 0x200F, 0x061C}


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _shown_as_is(ch: str) -> bool:
    code = ord(ch)
    if code in _BIDI:
        return False
    return unicodedata.category(ch) not in ("Cc", "Cs")


def visible(text: object) -> str:
    """`text` with every control character written out (`\\x1b`, `\\n`, `\\u202e`), so printing it
    cannot send an escape sequence, a carriage return or a direction override to the terminal."""
    s = text if isinstance(text, str) else str(text)
    if all(_shown_as_is(ch) for ch in s):  # the common case: nothing to change
        return s
    return "".join(ch if _shown_as_is(ch) else _escape(ch) for ch in s)


def scope_words(scope: Any) -> str:
    """A decision's scope as the owner would say it: "all sessions", "project /w/app",
    "sessions claude-app, codex-api"."""
    if scope == "all":
        return "all sessions"
    if isinstance(scope, dict) and isinstance(scope.get("project"), str):
        return f"project {visible(scope['project'])}"
    if isinstance(scope, dict) and isinstance(scope.get("sessions"), list):
        names = [visible(a) for a in scope["sessions"]]
        return ("session " if len(names) == 1 else "sessions ") + ", ".join(names)
    return visible(scope)


def when(epoch_ms: int | None) -> str:
    """Local date and time of an epoch-milliseconds stamp."""
    if epoch_ms is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_ms / 1000))


def age(ms: int) -> str:
    """A duration in one unit, rounded down: `3 h`, `12 m`, `40 s`."""
    seconds = max(ms, 0) // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def names(items: list[str]) -> str:
    return ", ".join(visible(n) for n in items)

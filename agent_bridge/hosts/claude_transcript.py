"""Which Claude Code runs, and what a session's transcript says about it: the version (of the
`claude` on PATH, for doctor and jobs; of the host that wrote the transcript, for the hooks), what
that version takes, a turn cut short by Esc, and the prompts queued behind the running turn.

Which Claude Code runs the session: every entry Claude Code writes to the session transcript
(`transcript_path` in each hook input) carries `"version"` (seen with 2.1.197 and 2.1.332). The
transcript is the running host's own record of itself, so a Stop hook reads it there rather than
asking `claude --version` (another install may be on PATH, and it costs a process).

Light: the hooks read the transcript at every Stop, so this module imports nothing at its top;
the standard library (and hosts.base, for `claude --version`) inside the functions that use it.
"""

from __future__ import annotations

Version = tuple[int, int, int]
STOP_CONTEXT_SINCE: Version = (2, 1, 163)  # Stop takes hookSpecificOutput.additionalContext (changelog)
# `asyncRewake` hooks run in the background and wake the model on exit 2: seen with 2.1.332 (the
# key is in 2.1.197's settings schema too, but no run of it was seen, so it is not relied on).
ASYNC_REWAKE_SINCE: Version = (2, 1, 332)
TRANSCRIPT_TAIL = 64 << 10  # bytes read from the end of a transcript per step when looking for a version
TRANSCRIPT_TAIL_MAX = 4 << 20  # give up (and answer as for an older host) past this much of the tail


def claude_version() -> Version | None:
    """The version of the `claude` on PATH ("2.1.332 (Claude Code)"), or None."""
    import shutil

    from agent_bridge.hosts.base import version_output

    printed = version_output(shutil.which("claude"))
    return parse_version(printed) if printed is not None else None


def stop_takes_context(version: Version | None) -> bool:
    """Whether this Claude Code version takes `additionalContext` on Stop (unknown: no)."""
    return version is not None and version >= STOP_CONTEXT_SINCE


def parse_version(text: object) -> Version | None:
    """"2.1.332" (or "2.1.332 (Claude Code)") -> (2, 1, 332); None for anything else."""
    if not isinstance(text, str):
        return None
    parts = text.strip().split(" ", 1)[0].split(".")
    if len(parts) != 3 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def transcript_version(path: str) -> Version | None:
    """The version of the Claude Code that last wrote this session transcript (JSON lines, each
    entry Claude Code writes carrying `"version"`), from its newest complete line that has one;
    None when there is no such line (or no readable file)."""
    import json

    if not path:
        return None
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            size = min(end, TRANSCRIPT_TAIL)
            while True:
                f.seek(end - size)
                lines = f.read(size).split(b"\n")
                if size < end:
                    lines = lines[1:]  # the first one may be cut
                for line in reversed(lines):
                    if b'"version"' not in line:
                        continue
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    version = parse_version(entry.get("version")) if isinstance(entry, dict) else None
                    if version is not None:
                        return version
                if size >= end or size >= TRANSCRIPT_TAIL_MAX:
                    return None
                size = min(end, size * 4)
    except OSError:
        return None


def tail_lines(path: str) -> list[bytes]:
    """The whole lines in the last TRANSCRIPT_TAIL bytes of a transcript; [] when unreadable."""
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            f.seek(max(0, end - TRANSCRIPT_TAIL))
            lines = f.read(TRANSCRIPT_TAIL).split(b"\n")
    except OSError:
        return []
    return lines[1:] if end > TRANSCRIPT_TAIL else lines  # the first one may be cut


def interrupted_at(path: str) -> float:
    """When the last turn cut short by Esc was (epoch seconds), from the `interruptedMessageId`
    entries in the last TRANSCRIPT_TAIL bytes of the transcript; 0.0 when none or unreadable."""
    import json
    from datetime import datetime

    for line in reversed(tail_lines(path)):
        if b'"interruptedMessageId"' not in line:
            continue
        try:
            entry = json.loads(line)
            stamp = entry["timestamp"]
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return 0.0


def queued_prompts(path: str) -> int:
    """How many prompts wait in the session's queue, from the `queue-operation` entries in the
    last TRANSCRIPT_TAIL bytes of its transcript ("enqueue" adds one; "dequeue" and "remove" take
    one; a "dequeue" of what was queued before the tail counts for nothing). 0 when unreadable."""
    import json

    lines = tail_lines(path)
    pending = 0
    for line in lines:
        if b'"queue-operation"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("type") != "queue-operation":
            continue
        operation = entry.get("operation")
        if operation == "enqueue":
            pending += 1
        elif operation in ("dequeue", "remove"):
            pending = max(0, pending - 1)
        elif operation == "clear":
            pending = 0
    return pending

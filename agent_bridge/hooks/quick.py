"""The PostToolUse hook's first look, run as a script: `python -I -S .../agent_bridge/hooks/quick.py
post-tool-use --agent HOST` (what `install` registers where it names this machine's interpreter).

It runs after every tool call of every session, and nearly always nothing waits. So it starts
Python without `site` and imports only built-in modules: it reads the hook input, takes the
`session_id`, and looks for the session's file in the broker's post box (`<home>/pending/`,
daemon.pending). No file, while a broker keeps the box (`pending/ready`): nothing waits; exit 0
with no output. Otherwise (a file, no box, an input it cannot read this simply) it runs the whole
hook, `agent_bridge.hooks.post_tool_use`, in this process, with `site` loaded then.

What it must agree on with the package, checked by tests/hooks/test_quick.py: the home folder
(`paths.home`) and the file name (`paths.pending_path`).
"""

import os
import sys

KEY = b'"session_id"'


def home() -> str:
    """paths.home, without pathlib."""
    explicit = os.environ.get("AGENT_BRIDGE_HOME")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
        return os.path.join(base, "agent-bridge")
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "agent-bridge")


def session_id(raw: bytes) -> str | None:
    """The input's top-level `session_id` when it is a plain string named once; else None."""
    at = raw.find(KEY)
    if at < 0 or raw.find(KEY, at + 1) >= 0:
        return None
    rest = raw[at + len(KEY):].lstrip(b" \t\r\n")
    if not rest.startswith(b":"):
        return None
    rest = rest[1:].lstrip(b" \t\r\n")
    if not rest.startswith(b'"'):
        return None
    end = rest.find(b'"', 1)
    value = rest[1:end]
    if end < 0 or b"\\" in value:
        return None
    try:
        text = value.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    return text or None


def digest(text: str) -> str:
    """paths.host_session_digest."""
    try:
        from _sha256 import sha256  # type: ignore[import-not-found, unused-ignore]
    except ImportError:  # Python >= 3.12
        from hashlib import sha256
    return str(sha256(text.encode("utf-8")).hexdigest()[:32])


def nothing_waits(raw: bytes) -> bool:
    """True only when the post box says so for this input's session."""
    sid = session_id(raw)
    if sid is None:
        return False
    box = os.path.join(home(), "pending")
    return os.path.exists(os.path.join(box, "ready")) and not os.path.exists(os.path.join(box, digest(sid)))


def main(argv: list[str]) -> int:
    agent = argv[2] if len(argv) == 3 and argv[0] == "post-tool-use" and argv[1] == "--agent" else "claude"
    raw = sys.stdin.buffer.read((8 << 20) + 1)
    try:
        if nothing_waits(raw):
            return 0
    except Exception:  # noqa: BLE001 - whatever it is, the whole hook looks
        pass
    import site

    site.main()  # the package's dependencies (the store reader's SQLite)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from agent_bridge.hooks import post_tool_use

    return post_tool_use.main(agent, raw)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

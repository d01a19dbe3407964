"""The PostToolUse hook's first look, run as a script: `python -I -S .../agent_bridge/hooks/quick.py
post-tool-use --agent HOST` (what `install` registers where it names this machine's interpreter).

It runs after every tool call of every session, and nearly always nothing waits. So it starts
Python without `site` and imports only built-in modules: it reads the hook input, takes the
`session_id`, and looks for the session's file in the broker's post box (`<home>/pending/`,
broker.feeds.postbox). No file, while a broker keeps the box (`pending/ready`): nothing waits; exit 0
with no output. Otherwise (a file, no box, an input it cannot read this simply) it runs the whole
hook, `agent_bridge.hooks.post_tool_use`, in this process, with `site` loaded then.

What it must agree on with the package, checked by tests/hooks/test_quick.py: the home folder
(`paths.home`) and the file name (`paths.pending_path`). Not on Windows (no `posix`): there the
whole hook looks.
"""

import sys

try:  # the built-in module under `os`: without `site`, `import os` costs more than this whole look
    import posix as _os
except ImportError:  # not a POSIX system: the module that is there
    import os as _os  # type: ignore[no-redef]

KEY = b'"session_id"'


def _env(name: str) -> str | None:
    environ = _os.environ
    raw = environ.get(name.encode()) if _os.__name__ == "posix" else environ.get(name)  # type: ignore[call-overload]
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "surrogateescape")
    return raw


def _exists(path: str) -> bool:
    try:
        _os.stat(path)
    except OSError:
        return False
    return True


def home() -> str | None:
    """paths.home (the same folder, not always the same spelling), without pathlib; None where
    this look cannot tell (the whole hook then looks)."""
    explicit = _env("AGENT_BRIDGE_HOME")
    if explicit:
        if explicit.startswith("~"):
            user_home = _env("HOME")
            if not user_home or not (explicit == "~" or explicit.startswith("~/")):
                return None
            explicit = user_home + explicit[1:]
        return explicit if explicit.startswith("/") else _os.getcwd() + "/" + explicit
    if sys.platform == "win32":
        return None
    state = _env("XDG_STATE_HOME")
    if not state:
        user_home = _env("HOME")
        if not user_home:
            return None
        state = user_home + "/.local/state"
    return state + "/agent-bridge"


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
    except ImportError:
        try:  # Python >= 3.12
            from _sha2 import sha256  # type: ignore[import-not-found, no-redef, unused-ignore]
        except ImportError:
            from hashlib import sha256  # type: ignore[assignment, unused-ignore]
    return str(sha256(text.encode("utf-8")).hexdigest()[:32])


def nothing_waits(raw: bytes) -> bool:
    """True only when the post box says so for this input's session."""
    sid = session_id(raw)
    folder = home()
    if sid is None or folder is None:
        return False
    box = folder + "/pending/"
    return _exists(box + "ready") and not _exists(box + digest(sid))


def main(argv: list[str]) -> int:
    agent = argv[2] if len(argv) == 3 and argv[0] == "post-tool-use" and argv[1] == "--agent" else "claude"
    raw = sys.stdin.buffer.read((8 << 20) + 1)
    try:
        if nothing_waits(raw):
            return 0
    except Exception:  # noqa: BLE001 - whatever it is, the whole hook looks
        pass
    import os
    import site

    site.main()  # the package's dependencies (the store reader's SQLite)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from agent_bridge.hooks import post_tool_use

    return post_tool_use.main(agent, raw)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

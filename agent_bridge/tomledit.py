"""Layout-preserving edits of a TOML document (Codex's `config.toml`).

The standard library reads TOML but cannot write it, and rewriting a user's config from its
parsed form would drop every comment. So edits work on the document's lines: tables are appended
or removed, keys inserted, replaced or removed in place, and everything else stays byte for byte.
Callers check the result by parsing it again (see `agent_bridge.install`).
"""

from __future__ import annotations

import json
import re
import tomllib


class TomlEditError(ValueError):
    """A value this editor cannot write."""


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_HEADER = re.compile(r"^\s*(\[\[?)\s*(?P<key>[^\]#]*?)\s*(\]\]?)\s*(#.*)?$")
_KEY_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')\s*=")


def toml_string(value: str) -> str:
    """A TOML basic string (JSON escapes are valid TOML escapes; DEL must be escaped too)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise TomlEditError(f"cannot write a TOML value of type {type(value).__name__}")


def parse_dotted_key(text: str) -> list[str] | None:
    """`mcp_servers."agent-bridge"` -> ["mcp_servers", "agent-bridge"]; None if not a plain key."""
    parts: list[str] = []
    rest = text.strip()
    while rest:
        if rest[0] in "\"'":
            end = rest.find(rest[0], 1)
            if end < 0:
                return None
            raw = rest[: end + 1]
            try:
                parts.append(tomllib.loads(f"k = {raw}")["k"])
            except tomllib.TOMLDecodeError:
                return None
            rest = rest[end + 1 :].lstrip()
        else:
            match = _BARE_KEY.match(rest)
            if not match:
                return None
            parts.append(match.group(0))
            rest = rest[match.end() :].lstrip()
        if rest.startswith("."):
            rest = rest[1:].lstrip()
        elif rest:
            return None
    return parts


class TomlText:
    """Minimal, layout-preserving edits of a TOML document's lines."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        if self.lines and not self.lines[-1].endswith("\n"):
            self.lines[-1] += "\n"

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def _headers(self) -> list[tuple[int, list[str] | None]]:
        """Table headers (line, key path; None for `[[array tables]]`), skipping the lines of
        multi-line values, which may look like headers."""
        found = []
        i = 0
        while i < len(self.lines):
            if _KEY_LINE.match(self.lines[i]):
                i = self._value_end(i, len(self.lines))
                continue
            m = _HEADER.match(self.lines[i])
            if m:
                found.append((i, parse_dotted_key(m.group("key")) if m.group(1) == "[" else None))
            i += 1
        return found

    def section(self, key: list[str]) -> tuple[int, int] | None:
        """(header line, end line exclusive) of the standard table `[key]`, or None."""
        headers = self._headers()
        for n, (i, path) in enumerate(headers):
            if path == key:
                end = headers[n + 1][0] if n + 1 < len(headers) else len(self.lines)
                return i, end
        return None

    def _value_end(self, start: int, stop: int) -> int:
        """The line after the key/value pair that starts at `start` (multi-line arrays too)."""
        for end in range(start + 1, stop + 1):
            try:
                tomllib.loads("".join(self.lines[start:end]))
                return end
            except tomllib.TOMLDecodeError:
                continue
        return start + 1

    def find_key(self, section: tuple[int, int], key: str) -> tuple[int, int] | None:
        start, stop = section
        i = start + 1
        while i < stop:
            m = _KEY_LINE.match(self.lines[i])
            if m:
                end = self._value_end(i, stop)
                if parse_dotted_key(m.group("key")) == [key]:
                    return i, end
                i = end
            else:
                i += 1
        return None

    def set_key(self, section: tuple[int, int], key: str, value: object, comment: str | None = None) -> None:
        line = f"{toml_key(key)} = {toml_value(value)}" + (f"  # {comment}" if comment else "") + "\n"
        found = self.find_key(section, key)
        if found is not None:
            indent = _KEY_LINE.match(self.lines[found[0]]).group("indent")  # type: ignore[union-attr]
            self.lines[found[0] : found[1]] = [indent + line]
            return
        self.lines.insert(self._insert_at(section), line)

    def remove_key(self, section: tuple[int, int], key: str) -> None:
        found = self.find_key(section, key)
        if found is not None:
            del self.lines[found[0] : found[1]]

    def _insert_at(self, section: tuple[int, int]) -> int:
        """After the section's last key/value pair (trailing blank and comment lines stay below)."""
        start, stop = section
        at = start + 1
        i = start + 1
        while i < stop:
            if _KEY_LINE.match(self.lines[i]):
                i = self._value_end(i, stop)
                at = i
            else:
                i += 1
        return at

    def append_table(self, key: list[str], values: dict[str, object], comment: str | None = None) -> None:
        block = []
        if self.lines and self.lines[-1].strip():
            block.append("\n")
        if comment:
            block.append(f"# {comment}\n")
        block.append("[" + ".".join(toml_key(k) for k in key) + "]\n")
        block.extend(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in values.items())
        self.lines.extend(block)

    def key_text(self, section: tuple[int, int], key: str) -> str | None:
        """The source lines of `key = …` in the section (comment included), or None."""
        found = self.find_key(section, key)
        return None if found is None else "".join(self.lines[found[0] : found[1]])

    def rename_key(self, section: tuple[int, int], old: str, new: str) -> None:
        """`old = value  # comment` becomes `new = value  # comment`, in place."""
        found = self.find_key(section, old)
        if found is None:
            return
        line = self.lines[found[0]]
        m = _KEY_LINE.match(line)
        assert m is not None
        self.lines[found[0]] = m.group("indent") + toml_key(new) + line[m.end("key") :]

    def section_is_empty(self, section: tuple[int, int]) -> bool:
        start, stop = section
        return not any(line.strip() for line in self.lines[start + 1 : stop])

    def tables_under(self, key: list[str]) -> list[tuple[int, int]]:
        """The sections of `[key]` and of every `[key.sub…]` table, in document order."""
        headers = self._headers()
        found = []
        for n, (i, path) in enumerate(headers):
            if path is not None and path[: len(key)] == key:
                end = headers[n + 1][0] if n + 1 < len(headers) else len(self.lines)
                found.append((i, end))
        return found

    def remove_section(self, section: tuple[int, int], *, marker: str | None = None) -> None:
        """Delete a table (its header and key/value lines, not comments below its last key, which
        belong to what follows), and the comment line just above it when it is `# <marker>`.
        Blank lines left dangling at the end of the document go too."""
        start, _ = section
        stop = self._insert_at(section)  # after the last key/value pair: comments below belong to what follows
        while stop < len(self.lines) and not self.lines[stop].strip():
            stop += 1
        if marker and start > 0 and self.lines[start - 1].strip() == f"# {marker}":
            start -= 1
        del self.lines[start:stop]
        while self.lines and not self.lines[-1].strip():
            self.lines.pop()

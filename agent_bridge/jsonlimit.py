"""JSON nesting depth, bounded in one place (SPEC §8, "Input depth and size"). Standard library
only: the relay and the hooks import it.

`json.loads` recurses once per level of nesting: 3 KB of `[` (valid JSON once closed) raise
RecursionError, which no caller expecting ValueError catches, and a value just under the
interpreter's limit breaks whatever walks it afterwards (pydantic, `json.dumps`, our own checks).
Every surface that parses JSON from outside (host lines, IPC frames, hook stdin, HTTP
parameters, the CLI's --scope, config) goes through `loads`, which refuses nesting past
MAX_DEPTH with `TooDeep`, a ValueError, before the parser recurses.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Levels of arrays and objects. What the bridge takes nests 6 deep at most (a tools/call line:
# message, params, arguments, scope, sessions); hosts add `_meta` objects of a few levels.
MAX_DEPTH = 64

# A JSON string (kept whole, so brackets inside it do not count), or one bracket. The string's
# pattern is the unrolled form: linear time, no backtracking on long strings.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_MEMBER_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]')
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_decode = json.JSONDecoder()


class TooDeep(ValueError):
    """JSON nested deeper than MAX_DEPTH levels."""

    def __init__(self, limit: int = MAX_DEPTH) -> None:
        super().__init__(f"JSON nested deeper than {limit} levels")
        self.limit = limit


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the arrays and objects in `text` (JSON, or something that may be) nest deeper
    than `limit`. Text with no more brackets than `limit` is answered without a scan."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return True
        elif token in "]}":
            depth -= 1
    return False


def loads(text: str | bytes | bytearray, limit: int = MAX_DEPTH) -> Any:
    """`json.loads`, refusing nesting deeper than `limit` with TooDeep (a ValueError). Bytes are
    decoded as UTF-8 first (UnicodeDecodeError, a ValueError too, when they are not)."""
    if not isinstance(text, str):
        text = str(text, "utf-8")
    # The count first, inline: every host line and frame comes through here, and few have many brackets.
    if text.count("[") + text.count("{") > limit and too_deep(text, limit):
        raise TooDeep(limit)
    try:
        return _decode.decode(text)  # what `json.loads` calls, without its checks of the argument
    except RecursionError:  # a limit above the interpreter's: still one clear error
        raise TooDeep(limit) from None


def check_value(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise TooDeep when an already parsed value (say, from TOML) nests deeper than `limit`.
    Iterative: a value deep enough to break recursion is measured without recursing."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth + 1 > limit:
                raise TooDeep(limit)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


NESTED = object()  # `members`: the value of this key is an array or object (not decoded)


def members(text: str) -> dict[str, Any] | None:
    """The top-level members of the JSON object in `text`, without parsing what nests: scalar
    values decoded, arrays and objects as NESTED. For a line too deep to parse, so that its
    answer can still carry the request's id. None when `text` is not a JSON object this can
    read (the last of duplicate keys wins, as in `json.loads`)."""
    start = _WHITESPACE.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("{", start):
        return None
    found: dict[str, Any] = {}
    depth = 0
    key: str | None = None
    expect_key = True
    for match in _MEMBER_TOKEN.finditer(text, start):
        token = match.group()
        if token in "[{":
            if depth == 1 and key is not None and not expect_key:
                found[key] = NESTED
                key = None
            depth += 1
        elif token in "]}":
            depth -= 1
            if depth == 0:
                return found
        elif depth != 1:
            continue
        elif token == ",":
            expect_key, key = True, None
        elif token == ":":
            if key is None:
                return None
            expect_key = False
            at = _WHITESPACE.match(text, match.end()).end()  # type: ignore[union-attr]
            if text.startswith(("[", "{"), at):
                continue  # nested: marked when its bracket comes
            try:
                found[key], _ = _decode.raw_decode(text, at)
            except ValueError:
                return None
            key = None
        elif expect_key and key is None:  # a string where a key belongs
            try:
                key = json.loads(token)
            except ValueError:
                return None
    return None

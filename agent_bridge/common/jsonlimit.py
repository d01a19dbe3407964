"""JSON nesting depth, bounded in one place (SPEC §8, "Input depth and size"). Standard library
only: the relay and the hooks import it.

`json.loads` recurses once per level of nesting: 3 KB of `[` (valid JSON once closed) raise
RecursionError, which no caller expecting ValueError catches, and a value just under the
interpreter's limit breaks whatever walks it afterwards (pydantic, `json.dumps`, our own checks).
Every surface that parses JSON from outside (host lines, IPC frames, hook stdin, HTTP
parameters, the CLI's --scope, config) goes through `loads`, which refuses nesting past
MAX_DEPTH with `TooDeep`, a ValueError: the C parser's own recursion guard stops anything
deeper than the interpreter allows (RecursionError, turned into TooDeep), and what it parsed
is measured without recursing before anyone walks it. `too_deep` measures the text itself,
for a line handed on unparsed (to the MCP SDK, whose models recurse in Python).
"""

from __future__ import annotations

import json
import re
from typing import Any

# Levels of arrays and objects. What the bridge takes nests 6 deep at most (a tools/call line:
# message, params, arguments, scope, sessions); hosts add `_meta` objects of a few levels.
MAX_DEPTH = 64
COUNT_UP_TO = 4096  # characters: `loads` counts a shorter text's brackets before measuring its value

_BRACKET = re.compile(r"[\[\]{}]")
# A JSON string (kept whole, so brackets inside it do not count), or one bracket, colon or comma.
# The string's pattern is the unrolled form: linear time, no backtracking on long strings.
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
    # Only brackets outside strings count. With the escaped backslashes, then the escaped
    # quotes, taken out (each run of backslashes pairs up from its left, as JSON reads it),
    # every quote left opens or closes a string: the even pieces between quotes are outside.
    # All of it in C: a line carrying JSON in a string (a tool's result inside a frame) has a
    # few pieces however many quotes it escapes.
    pieces = text.replace("\\\\", "").replace('\\"', "").split('"')
    outside = "".join(pieces[::2])
    if outside.count("[") + outside.count("{") <= limit:
        return False
    depth = 0
    for match in _BRACKET.finditer(outside):
        if match.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def loads(text: str | bytes | bytearray, limit: int = MAX_DEPTH) -> Any:
    """`json.loads`, refusing nesting deeper than `limit` with TooDeep (a ValueError). Bytes are
    decoded as UTF-8 first (UnicodeDecodeError, a ValueError too, when they are not)."""
    if not isinstance(text, str):
        text = str(text, "utf-8")
    # No more brackets than `limit`, in strings or not: nothing to measure (most lines and frames).
    # A long text is measured without counting: walking its value's containers costs less than
    # reading its characters twice when most of them are in strings (a frame carrying a result).
    measure = len(text) > COUNT_UP_TO or text.count("[") + text.count("{") > limit
    try:
        value = _decode.decode(text)  # what `json.loads` calls, without its checks of the argument
    except RecursionError:  # deeper than the interpreter lets the C parser go
        raise TooDeep(limit) from None
    except ValueError:
        if measure and too_deep(text, limit):  # broken JSON that also nests too deep: say the depth
            raise TooDeep(limit) from None
        raise
    # Parsed first, measured after: the value's containers, not the text's characters (a frame
    # carrying a tool's result as a string has thousands of brackets and escapes, in one string).
    if measure and _deeper(value, limit):
        raise TooDeep(limit)
    return value


def _deeper(value: Any, limit: int) -> bool:
    """Whether `value`'s dicts and lists nest deeper than `limit`, measured without recursing.
    Only containers are pushed: a value of many scalars costs one pass over them."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def check_value(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise TooDeep when an already parsed value (say, from TOML) nests deeper than `limit`.
    Iterative: a value deep enough to break recursion is measured without recursing."""
    if _deeper(value, limit):
        raise TooDeep(limit)


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

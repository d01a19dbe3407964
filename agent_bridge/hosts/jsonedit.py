"""Editing a JSON file in place, the way tomlkit edits TOML: only the values that change are
rewritten, and everything else (indentation, key order, compact arrays, blank lines,
a missing final newline, CRLF line ends) stays byte for byte.

`rewrite(text, old, new)` takes the file's text, the document it parses to (`old`) and the
document wanted (`new`), and returns text that parses to `new`. Members that appear are added
after the last member of their object, in the object's own layout; members and elements that go
are cut out with their separator, so an install followed by an uninstall gives back the original
bytes. What it cannot place in the file's layout (an element inserted in the middle of a list)
is written as that whole value again, in the file's indentation. The caller checks the result
parses to `new` (hosts.edits.edit_json).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

_WS = re.compile(r"[ \t\r\n]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_DECODER = json.JSONDecoder()


class EditError(Exception):
    """The text could not be edited in place (the caller then refuses, or writes it anew)."""


@dataclass
class Node:
    start: int
    end: int
    kind: str  # "object", "array" or "scalar"
    members: list[tuple[str, int, Node]] = field(default_factory=list)  # (key, key start, value) of an object
    items: list[Node] = field(default_factory=list)  # an array's elements


def parse(text: str) -> Node:
    """The spans of every value in `text` (which json.loads accepts)."""
    node, end = _value(text, _skip(text, 0))
    if _skip(text, end) != len(text):
        raise EditError("text after the JSON value")
    return node


def _skip(text: str, i: int) -> int:
    match = _WS.match(text, i)
    return match.end() if match else i


def _value(text: str, i: int) -> tuple[Node, int]:
    if i >= len(text):
        raise EditError("unexpected end of the text")
    ch = text[i]
    if ch == "{":
        return _object(text, i)
    if ch == "[":
        return _array(text, i)
    if ch == '"':
        _, end = _DECODER.raw_decode(text, i)
        return Node(i, end, "scalar"), end
    for word in ("true", "false", "null"):
        if text.startswith(word, i):
            return Node(i, i + len(word), "scalar"), i + len(word)
    match = _NUMBER.match(text, i)
    if match and match.end() > i:
        return Node(i, match.end(), "scalar"), match.end()
    raise EditError(f"unexpected character {ch!r}")


def _object(text: str, i: int) -> tuple[Node, int]:
    """The object whose `{` is at `i`."""
    node = Node(i, i, "object")
    j = _skip(text, i + 1)
    if text.startswith("}", j):
        node.end = j + 1
        return node, j + 1
    while True:
        key, after_key = _DECODER.raw_decode(text, j)
        if not isinstance(key, str):
            raise EditError("an object key that is not a string")
        colon = _skip(text, after_key)
        if not text.startswith(":", colon):
            raise EditError("':' expected")
        value, after = _value(text, _skip(text, colon + 1))
        node.members.append((key, j, value))
        j = _skip(text, after)
        if text.startswith(",", j):
            j = _skip(text, j + 1)
            continue
        if text.startswith("}", j):
            node.end = j + 1
            return node, j + 1
        raise EditError("',' or '}' expected")


def _array(text: str, i: int) -> tuple[Node, int]:
    """The array whose `[` is at `i`."""
    node = Node(i, i, "array")
    j = _skip(text, i + 1)
    if text.startswith("]", j):
        node.end = j + 1
        return node, j + 1
    while True:
        value, after = _value(text, j)
        node.items.append(value)
        j = _skip(text, after)
        if text.startswith(",", j):
            j = _skip(text, j + 1)
            continue
        if text.startswith("]", j):
            node.end = j + 1
            return node, j + 1
        raise EditError("',' or ']' expected")


# --- the file's layout ------------------------------------------------------------------


def indent_unit(text: str) -> str:
    """One level of the file's indentation: the first indented line's leading whitespace (two
    spaces when nothing is indented)."""
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and stripped != line:
            return line[: len(line) - len(stripped)]
    return "  "


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _line_indent(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    line = text[start:pos]
    return line[: len(line) - len(line.lstrip(" \t"))]


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _separators(*samples: str) -> tuple[str, str]:
    """The separators one-line JSON uses in the first of `samples` that shows them (`","` or
    `", "`, `":"` or `": "`); json's own where none does."""
    item = key = None
    for sample in (_STRING.sub('""', s) for s in samples):  # a comma inside a string says nothing
        if item is None and (found := re.search(r",(\s?)", sample)):
            item = "," + found.group(1)
        if key is None and (found := re.search(r":(\s?)", sample)):
            key = ":" + found.group(1)
    return item or ", ", key or ": "


def _dump(
    value: Any, indent: str | None, base: str, nl: str, separators: tuple[str, str] = (", ", ": ")
) -> str:
    """`value` as JSON in the file's layout: indented by `indent` from `base` (its line's
    indentation), or on one line with `separators` when `indent` is None."""
    if indent is None:
        return json.dumps(value, ensure_ascii=False, separators=separators)
    lines = json.dumps(value, ensure_ascii=False, indent=indent).split("\n")
    return (nl + base).join(lines)


class _Editor:
    def __init__(self, text: str) -> None:
        self.text = text
        self.unit = indent_unit(text)
        self.nl = _newline(text)
        self.multiline = "\n" in text.strip() or text.strip() in ("{}", "[]")
        self.cuts: list[tuple[int, int, str]] = []  # (start, end, replacement), applied from the end

    def replace(self, node: Node, value: Any) -> None:
        indent = self.unit if self.multiline or node.kind == "scalar" else None
        if node.kind != "scalar" and "\n" not in self.text[node.start:node.end]:
            indent = None  # a value written on one line stays on one line
        # On one line, in the separators the value had (else the file's): an undo then gives back its bytes.
        separators = _separators(self.text[node.start:node.end], self.text)
        self.cuts.append(
            (
                node.start,
                node.end,
                _dump(value, indent, _line_indent(self.text, node.start), self.nl, separators),
            )
        )

    def edit(self, node: Node, old: Any, new: Any) -> None:
        if old == new and type(old) is type(new):
            return
        if node.kind == "object" and isinstance(old, dict) and isinstance(new, dict):
            self._edit_object(node, old, new)
        elif node.kind == "array" and isinstance(old, list) and isinstance(new, list):
            self._edit_array(node, old, new)
        else:
            self.replace(node, new)

    def _layout(self, node: Node, children: list[int]) -> tuple[str, str | None]:
        """The separator before a new member or element (after a comma), and the indentation of
        the values written (None: on one line)."""
        if children:
            last = children[-1]
            before = max(self.text.rfind(",", node.start, last), node.start)  # only blanks lie between
            gap = self.text[before + 1:last]
            if "\n" in gap:
                return gap, self.unit
            return gap, None
        if "\n" not in self.text[node.start:node.end] and not self.multiline:
            return "", None
        return self.nl + _line_indent(self.text, node.start) + self.unit, self.unit

    def _edit_object(self, node: Node, old: dict[str, Any], new: dict[str, Any]) -> None:
        # JSON keeps a repeated key's last value
        last_of = {key: i for i, (key, _, _) in enumerate(node.members)}
        if len(last_of) != len(node.members):  # a repeated key: the object anew
            self.replace(node, new)
            return
        gone = {i for key, i in last_of.items() if key not in new}
        for key, i in last_of.items():
            if key in new:
                self.edit(node.members[i][2], old[key], new[key])
        added = [key for key in new if key not in last_of]
        if gone and len(gone) == len(node.members) and added:
            self.replace(node, new)
            return
        if gone:
            self._cut(node, [(s, v) for _, s, v in node.members], gone)
        if not added:
            return
        kept = [s for i, (_, s, _) in enumerate(node.members) if i not in gone]
        sep, indent = self._layout(node, kept)
        base = sep.rsplit("\n", 1)[-1] if "\n" in sep else ""
        pieces = [
            json.dumps(key, ensure_ascii=False) + ": " + _dump(new[key], indent, base, self.nl)
            for key in added
        ]
        self._insert(
            node, kept, sep, pieces, [v.end for i, (_, _, v) in enumerate(node.members) if i not in gone]
        )

    def _edit_array(self, node: Node, old: list[Any], new: list[Any]) -> None:
        matcher = SequenceMatcher(None, [_key(v) for v in old], [_key(v) for v in new], autojunk=False)
        appended: list[Any] = []
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                continue
            if op == "replace" and i2 - i1 == j2 - j1:
                for k in range(i2 - i1):
                    self.edit(node.items[i1 + k], old[i1 + k], new[j1 + k])
            elif op == "delete":
                continue  # below, all at once
            elif op == "insert" and i1 == len(old):
                appended.extend(new[j1:j2])
            else:  # an edit this layout cannot hold in place: the list anew, in the file's indentation
                self.cuts = [c for c in self.cuts if not (node.start <= c[0] and c[1] <= node.end)]
                self.replace(node, new)
                return
        deleted = {k for op, i1, i2, _, _ in matcher.get_opcodes() if op == "delete" for k in range(i1, i2)}
        if deleted and len(deleted) == len(node.items) and appended:
            self.replace(node, new)
            return
        if deleted:
            self._cut(node, [(v.start, v) for v in node.items], deleted)
        if not appended:
            return
        kept = [v.start for k, v in enumerate(node.items) if k not in deleted]
        sep, indent = self._layout(node, kept)
        base = sep.rsplit("\n", 1)[-1] if "\n" in sep else ""
        pieces = [_dump(v, indent, base, self.nl) for v in appended]
        self._insert(node, kept, sep, pieces, [v.end for k, v in enumerate(node.items) if k not in deleted])

    def _cut(self, node: Node, children: list[tuple[int, Node]], gone: set[int]) -> None:
        """Cut the children `gone` out with their separators: after a kept child, from the end of
        the child before; before any kept child, up to the next child; all of them: the inside."""
        if len(gone) == len(children):
            self.cuts.append((node.start + 1, node.end - 1, ""))
            return
        first_kept = min(i for i in range(len(children)) if i not in gone)
        for i in sorted(gone):
            start, value = children[i]
            if i > first_kept:
                self.cuts.append((children[i - 1][1].end, value.end, ""))
            else:
                self.cuts.append((start, children[i + 1][0], ""))

    def _insert(self, node: Node, kept: list[int], sep: str, pieces: list[str], ends: list[int]) -> None:
        if kept:
            at = max(ends)
            self.cuts.append((at, at, "".join("," + sep + piece for piece in pieces)))
            return
        closing = self.nl + _line_indent(self.text, node.start) if "\n" in sep else ""
        body = ("," + (sep if sep else " ")).join(pieces)
        self.cuts.append((node.start + 1, node.end - 1, sep + body + closing))

    def result(self) -> str:
        text = self.text
        for start, end, replacement in sorted(self.cuts, key=lambda c: (c[0], c[1]), reverse=True):
            text = text[:start] + replacement + text[end:]
        return text


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def rewrite(text: str, old: Any, new: Any) -> str:
    """`text` (which parses to `old`) edited in place to parse to `new`."""
    try:
        root = parse(text)
    except (EditError, ValueError, RecursionError) as exc:
        raise EditError(str(exc)) from None
    editor = _Editor(text)
    editor.edit(root, old, new)
    return editor.result()

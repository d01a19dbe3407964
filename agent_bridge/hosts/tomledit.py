"""The TOML edits install and uninstall make (Codex's config.toml), beneath the host modules
like hosts.edits, whose refusal (InstallError) and edit (FileEdit) they share.

Edited with tomlkit, which keeps a document's comments and layout. tomlkit hangs the comment
lines above a table header on whatever comes before them; our rules are the other way round (a
comment above a table belongs to that table, comments below a table's last key to what follows
it), so removing a table (`remove_table`) moves those lines itself.

Whatever was edited, `finish_toml` checks that the result parses (with the standard library's
reader) to exactly the expected document, else the edit is refused and nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from tomlkit.container import Container
from tomlkit.items import Comment, Item, Key, Null, SingleKey, Table, Whitespace
from tomlkit.toml_document import TOMLDocument

from agent_bridge.hosts import hostconfig
from agent_bridge.hosts.edits import NOTHING_CHANGED, FileEdit, InstallError, read_config

TomlPath = tuple[str, ...]  # table names from the document's root, as in a [header]


def toml_doc(path: Path) -> tuple[str | None, dict[str, Any], TOMLDocument]:
    before, data = read_config(hostconfig.parse_toml, path)
    try:
        return before, data, tomlkit.parse(before or "")
    except tomlkit.exceptions.ParseError as exc:  # TOML the standard library reads, but tomlkit does not
        raise InstallError(f"{path}: cannot edit it ({exc}); {NOTHING_CHANGED}") from None


def finish_toml(path: Path, before: str | None, doc: TOMLDocument, expected: dict[str, Any], notes: list[str],
                manual: str, private: bool) -> FileEdit:
    """The edit, after checking that the edited text parses (with the standard library's reader,
    not tomlkit) to exactly `expected`."""
    if not notes:
        return FileEdit(path, before, before, [], private)
    after = doc.as_string()
    if after.strip():
        after = after.rstrip("\n") + "\n"  # blank lines left dangling at the end by a removal go
    try:
        result = hostconfig.parse_toml(path, after)
    except hostconfig.ConfigError as exc:
        raise InstallError(f"{path}: editing it would break it ({exc}); {manual}") from None
    if result != expected:
        raise InstallError(f"{path}: cannot edit it without changing other settings; {manual}")
    if not after.strip() and before is not None:
        return FileEdit(path, before, None, [*notes, "deleted the file (nothing else was in it)"], private)
    return FileEdit(path, before, after, notes, private)


def _walk(container: Container, at: TomlPath = ()) -> Iterator[tuple[TomlPath, Container, int]]:
    """Every entry of the document in the order it is written: (the path of the entry's key, its
    container, its index there), going into tables (a table's header is its own entry)."""
    for index, (key, item) in enumerate(container.body):
        where = (*at, key.key) if key is not None else at
        yield where, container, index
        if isinstance(item, Table):
            yield from _walk(item.value, where)


def toml_table(doc: TOMLDocument, at: TomlPath) -> Table | None:
    """The table written as a `[header]` at `at`; None when there is none, or when the keys are
    written another way (an inline table, dotted keys), which these edits leave alone."""
    for where, container, index in _walk(doc):
        item = container.body[index][1]
        if where == at and isinstance(item, Table) and not item.is_super_table():
            return item
    return None


def append_table(
    doc: TOMLDocument, at: TomlPath, values: dict[str, Any], comment: str | None = None
) -> Table:
    """A new `[header]` table at the end of the document (after a blank line), with `# comment`
    on the line above it."""
    table = tomlkit.table()
    for key, value in values.items():
        table.add(key, _inline(value))
    if comment:
        table.trivia.indent = f"# {comment}\n"
    text = doc.as_string()
    if text.strip() and not text.endswith("\n\n"):
        doc.add(tomlkit.ws("\n" if text.endswith("\n") else "\n\n"))
    item = table
    for name in reversed(at[1:]):
        outer = tomlkit.table(is_super_table=True)
        outer.append(name, item)
        item = outer
    doc.append(at[0], item)
    return table


def _inline(value: Any) -> Any:
    """A dict becomes an inline table (`env = { … }`), not a [sub.table] of its own."""
    if isinstance(value, dict):
        inline = tomlkit.inline_table()
        inline.update(value)
        return inline
    return value


def set_value(doc: TOMLDocument, at: TomlPath, key: str, value: Any, comment: str | None = None) -> None:
    """`key = value[  # comment]` in the table at `at`: in place when the key is there (its old
    trailing comment goes), else after the table's last key (comment and blank lines below it
    stay below)."""
    table = toml_table(doc, at)
    assert table is not None
    item = tomlkit.item(_inline(value))
    if key in table:
        table[key] = item  # tomlkit keeps the old line's comment: replaced below
    else:
        entries = [(k, v) for k, v in table.value.body if not isinstance(v, Null)]
        last = max(
            (n for n, (k, v) in enumerate(entries) if k is not None and not isinstance(v, Table)), default=-1
        )
        entries.insert(last + 1, (SingleKey(key), item))
        _rebuild(doc, at, entries)
    item.trivia.comment_ws = "  " if comment else ""
    item.trivia.comment = f"# {comment}" if comment else ""


def is_blank(table: Table) -> bool:
    """Whether the table holds nothing, not even a comment (blank lines at most; tomlkit leaves a
    Null where a key was removed)."""
    return all(isinstance(item, (Whitespace, Null)) for _, item in table.value.body)


def key_comment(table: Table, key: str) -> str:
    """The trailing comment of `key = …` ("" when it has none)."""
    item = table.value.item(key) if key in table else None
    return item.trivia.comment if isinstance(item, Item) else ""


def rename_key(doc: TOMLDocument, at: TomlPath, old: str, new: str) -> None:
    """`old = value  # comment` in the table at `at` becomes `new = value  # comment`, in place."""
    table = toml_table(doc, at)
    assert table is not None
    _rebuild(
        doc,
        at,
        [
            (SingleKey(new) if k is not None and k.key == old else k, v)
            for k, v in table.value.body
            if not isinstance(v, Null)
        ],
    )


def _rebuild(doc: TOMLDocument, at: TomlPath, entries: list[tuple[Key | None, Item]]) -> None:
    """Put a table built from `entries` (key and item, or None and a comment or blank line) in
    the place of the table at `at`, keeping its header line. tomlkit can neither rename a key nor
    insert one before others, so a table is built again for both."""
    rebuilt = tomlkit.table()
    for key, item in entries:
        if isinstance(item, (Comment, Whitespace)):
            rebuilt.add(item)
        elif key is not None:
            rebuilt.add(key, item)
    rebuilt.add(tomlkit.ws(""))  # else tomlkit adds a blank line after a table that ends in a comment
    _parent(doc, at)[at[-1]] = rebuilt


def _parent(doc: TOMLDocument, at: TomlPath) -> Any:
    parent: Any = doc
    for name in at[:-1]:
        parent = parent[name]
    return parent


def remove_table(doc: TOMLDocument, at: TomlPath, marker: str | None = None) -> None:
    """Remove the `[header]` table at `at`, the tables under it, and the comment line just above
    it when it is `# <marker>`. Comment lines below its last key belong to what follows: they stay,
    above the next table's header (blank lines right below its last key go with it)."""
    table = toml_table(doc, at)
    assert table is not None
    entries = list(_walk(doc))
    start = next(n for n, (_, container, index) in enumerate(entries) if container.body[index][1] is table)
    end = next((n for n in range(start + 1, len(entries)) if entries[n][0][: len(at)] != at), len(entries))
    inside = [container.body[index][1] for _, container, index in entries[start + 1:end]]
    tail: list[Item] = []
    for item in reversed(inside):  # the comments and blank lines after the last key, from the first comment
        if isinstance(item, Null):  # where a key was removed
            continue
        if not isinstance(item, (Comment, Whitespace)):
            break
        tail.insert(0, item)
    while tail and isinstance(tail[0], Whitespace):
        tail.pop(0)
    if tail:
        text = "".join(item.as_string() for item in tail)
        below = next((item for item in (container.body[index][1] for _, container, index in entries[end:])
                      if isinstance(item, Table) and not item.is_super_table()), None)
        if below is not None:
            below.trivia.indent = text + below.trivia.indent
        else:  # nothing follows: they stay at the end
            doc.add(tomlkit.ws(text))
    if marker:
        above = next(
            (
                item
                for item in (container.body[index][1] for _, container, index in reversed(entries[:start]))
                if not (isinstance(item, Table) and item.is_super_table())
            ),
            None,
        )
        if isinstance(above, Comment) and above.as_string().strip() == f"# {marker}":
            above.trivia.indent = above.trivia.comment = above.trivia.trail = ""  # written as nothing
    del _parent(doc, at)[at[-1]]

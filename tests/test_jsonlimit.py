"""agent_bridge.common.jsonlimit: the one bound on JSON nesting depth (SPEC §8), and the readers of
files and lines that go through it. Pure functions, no I/O beyond a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_bridge.common import jsonlimit, paths
from agent_bridge.common.jsonlimit import MAX_DEPTH, NESTED, TooDeep
from agent_bridge.hosts import hostconfig


def nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


def test_the_limit_is_exact():
    assert jsonlimit.loads(nested(MAX_DEPTH)) is not None
    with pytest.raises(TooDeep, match=f"nested deeper than {MAX_DEPTH} levels"):
        jsonlimit.loads(nested(MAX_DEPTH + 1))
    with pytest.raises(TooDeep):
        jsonlimit.loads(nested(100_000))  # far past the interpreter's recursion limit
    assert isinstance(TooDeep(), ValueError)  # caught wherever a malformed value already is
    # A long text is measured by its value, not by counting its characters: the same limit.
    padding = '"' + "x" * jsonlimit.COUNT_UP_TO + '"'
    assert jsonlimit.loads(nested(MAX_DEPTH, padding)) is not None
    with pytest.raises(TooDeep):
        jsonlimit.loads(nested(MAX_DEPTH + 1, padding))


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"a": "[" * 1000 + "{" * 1000 + '\\"'})
    assert jsonlimit.loads(text) == json.loads(text)
    assert not jsonlimit.too_deep(json.dumps(["]" * 500, nested(3)]))


def depth_of(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


# Strings made of what could fool a scan: brackets, quotes and runs of backslashes.
TRICKY_TEXT = st.text(alphabet='[]{}"\\ a\n', max_size=12)


@given(
    st.recursive(
        st.none() | st.integers() | TRICKY_TEXT,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
        max_leaves=30,
    ),
    st.integers(min_value=0, max_value=6),
    st.booleans(),
)
def test_too_deep_counts_the_brackets_outside_strings_only(value, limit, ascii_only):
    """The depth `too_deep` measures is the value's, whatever its strings hold: brackets,
    escaped quotes, runs of backslashes, and JSON carried in a string (as a frame carries a line)."""
    for text in (json.dumps(value, ensure_ascii=ascii_only), json.dumps({"line": json.dumps(value)})):
        expected = depth_of(json.loads(text)) > limit
        assert jsonlimit.too_deep(text, limit) is expected, text
        if expected:  # and `loads`, which parses first and measures the value, agrees
            with pytest.raises(TooDeep):
                jsonlimit.loads(text, limit)
        else:
            assert jsonlimit.loads(text, limit) == json.loads(text)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                    max_leaves=40))
def test_loads_equals_json_loads_under_the_limit(value):
    text = json.dumps(value)
    assert jsonlimit.loads(text) == json.loads(text)


def test_check_value_measures_without_recursing():
    value: list = []
    for _ in range(50_000):
        value = [value]
    with pytest.raises(TooDeep):
        jsonlimit.check_value(value)
    jsonlimit.check_value({"a": [[1]], "b": {"c": None}}, limit=3)
    with pytest.raises(TooDeep):
        jsonlimit.check_value({"a": [[1]]}, limit=2)


def test_members_reads_the_top_level_of_a_line_too_deep_to_parse():
    line = (
        '{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"arguments":{"scope":'
        + nested(1500)
        + "}}}"
    )
    found = jsonlimit.members(line)
    assert found == {"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": NESTED}
    assert jsonlimit.members(' {"id": "a\\"b", "x": [1], "id": "last"}') == {"id": "last", "x": NESTED}
    assert jsonlimit.members(
        '{"method":"notifications/cancelled","params":{"requestId":' + nested(999) + "}}"
    ) == {"method": "notifications/cancelled", "params": NESTED}
    for not_an_object in ("[1]", nested(2000), '"x"', "", "{", '{"id" 1}', "{1: 2}"):
        assert jsonlimit.members(not_an_object) in (None, {}), not_an_object


def test_files_read_through_the_limit_say_so_in_one_line(tmp_path: Path):
    with pytest.raises(hostconfig.ConfigError, match="nested deeper"):
        hostconfig.parse_json_object(tmp_path / "settings.json", '{"a":' + nested(5000) + "}")
    (tmp_path / paths.BROKER_JSON).write_text('{"pid": 1, "x": ' + nested(5000) + "}")
    assert paths.read_broker_json(tmp_path) is None  # unreadable, as garbage is

"""agent_bridge.hosts.jsonedit: a JSON file edited in place parses to the document wanted, and adding
then removing the same things gives back the original bytes, whatever the file's layout."""

from __future__ import annotations

import copy
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_bridge.hosts.jsonedit import rewrite

keys = st.text(alphabet="abcdefgh-_ é", min_size=1, max_size=6)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=8))
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)
objects = st.dictionaries(keys, documents, max_size=5)
layouts = st.sampled_from(
    [
        {"indent": 2},
        {"indent": 4},
        {"indent": "\t"},
        {},
        {"separators": (",", ":")},
        {"indent": 2, "crlf": True},
    ]
)


def render(doc, layout) -> str:
    layout = dict(layout)
    crlf = layout.pop("crlf", False)
    text = json.dumps(doc, ensure_ascii=False, **layout) + "\n"
    return text.replace("\n", "\r\n") if crlf else text


def containers(doc, path=()):
    yield path, doc
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        if isinstance(v, (dict, list)):
            yield from containers(v, (*path, k))


def at(doc, path):
    for k in path:
        doc = doc[k]
    return doc


@settings(max_examples=300, deadline=None)
@given(objects, layouts, st.data())
def test_an_edit_gives_the_document_wanted_and_its_undo_the_original_bytes(doc, layout, data):
    text = render(doc, layout)
    places = list(containers(doc))
    path, _ = data.draw(st.sampled_from(places))
    added = copy.deepcopy(doc)
    target = at(added, path)
    value = data.draw(documents)
    if isinstance(target, dict):
        key = data.draw(keys.filter(lambda k: k not in target))
        target[key] = value
    else:
        target.append(value)
    out = rewrite(text, doc, added)
    assert json.loads(out) == added
    assert rewrite(out, added, doc) == text  # install, then uninstall: byte for byte


@settings(max_examples=300, deadline=None)
@given(objects, objects, layouts)
def test_any_change_parses_to_the_document_wanted(doc, other, layout):
    text = render(doc, layout)
    wanted = {**{k: v for i, (k, v) in enumerate(doc.items()) if i % 2}, **other}
    assert json.loads(rewrite(text, doc, wanted)) == wanted


def test_a_one_line_array_rewritten_whole_keeps_its_separators_so_the_undo_gives_the_bytes_back():
    """Found by the property above: appending into the first of two empty arrays in compact
    JSON rewrote the outer array with json's default `", "`, so install then uninstall did
    not give back the file's bytes. Separators inside strings say nothing about the layout."""
    for text, doc, added in (
        ('{"_":[[],[]]}\n', {"_": [[], []]}, {"_": [[None], []]}),
        (
            '{"k":"x, y: z","_":[[],[]]}\n',
            {"k": "x, y: z", "_": [[], []]},
            {"k": "x, y: z", "_": [[None], []]},
        ),
    ):
        out = rewrite(text, doc, added)
        assert json.loads(out) == added
        assert rewrite(out, added, doc) == text

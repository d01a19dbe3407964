"""The pure domain rules (SPEC §4.1-4.3), with examples from the spec and properties."""

from __future__ import annotations

import json
import ntpath
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_bridge.common import domain
from agent_bridge.common.domain import InputError, SessionView, lookup_matches, parse_scope, scope_applies
from agent_bridge.common.rows import Decision
from tests.shapes import DECISION_FIELDS

# --- topics and texts ---------------------------------------------------------------


def test_topic_identity_is_trimmed_and_lowercased():
    assert domain.normalize_topic(" Camera ") == "camera"
    assert domain.normalize_topic("DB\t") == "db"


@pytest.mark.parametrize("bad", ["", "   ", "\n\t", None, 3, ["x"]])
def test_empty_or_non_string_topic_is_refused(bad):
    with pytest.raises(InputError, match="topic"):
        domain.normalize_topic(bad)


def test_topic_length_limit_counts_after_trimming():
    assert domain.normalize_topic("  " + "a" * 200 + "  ") == "a" * 200
    with pytest.raises(InputError, match="at most 200"):
        domain.normalize_topic("a" * 201)


def test_text_limits():
    assert domain.normalize_text("  Hold to look \n") == "Hold to look"
    assert len(domain.normalize_text("x" * 4000)) == 4000
    with pytest.raises(InputError, match="at most 4000"):
        domain.normalize_text("x" * 4001)
    with pytest.raises(InputError, match="empty"):
        domain.normalize_text("   ")


def test_query_limit_and_case():
    assert domain.normalize_query(None) is None
    assert domain.normalize_query("") is None
    assert domain.normalize_query("PostGres") == "postgres"
    assert domain.normalize_query("q" * 512) == "q" * 512
    with pytest.raises(InputError, match="at most 512"):
        domain.normalize_query("q" * 513)


@given(st.text(min_size=1, max_size=250))
def test_topic_normalization_is_idempotent(raw):
    try:
        once = domain.normalize_topic(raw)
    except InputError:
        stripped = raw.strip().lower()
        assert not stripped or len(stripped) > 200
        return
    assert domain.normalize_topic(once) == once
    assert once == once.strip() and once == once.lower() and 1 <= len(once) <= 200


# --- folders --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/a//b/./c/", "/a/b/c"),
        ("/Users/Me/Proj", "/Users/Me/Proj"),  # POSIX case is kept
        ("/", "/"),
        ("//srv/x", "/srv/x"),
        ("/a/b/../c", "/a/c"),
        ("C:\\Users\\Me\\Proj", "c:/users/me/proj"),
        ("c:/users/me/proj/", "c:/users/me/proj"),
        ("C:\\", "c:/"),
        ("\\\\Server\\Share\\Dir\\", "//server/share/dir"),
    ],
)
def test_folder_normalization_examples(raw, expected):
    assert domain.normalize_folder(raw) == expected


def test_windows_spellings_are_one_scope():
    assert parse_scope({"project": "C:\\Users\\Me\\Proj"}) == parse_scope({"project": "c:/users/me/proj/"})


@pytest.mark.parametrize("bad", ["relative/dir", "./x", "~/proj", "", " /a", "C:relative", "C:", 5, None])
def test_relative_or_malformed_folders_are_refused(bad):
    with pytest.raises(InputError):
        domain.normalize_folder(bad)


posix_segments = st.lists(st.sampled_from(["a", "B", "c d", ".", "", "é", "x.y"]), min_size=1, max_size=6)


@given(posix_segments, st.booleans())
def test_posix_normalization_is_idempotent_and_lexical(segments, trailing):
    raw = "/" + "/".join(segments) + ("/" if trailing else "")
    once = domain.normalize_folder(raw)
    assert domain.normalize_folder(once) == once
    assert once == "/" or not once.endswith("/")
    assert "//" not in once and "/./" not in once + "/"
    assert once == posixpath.normpath(raw).replace("//", "/")


@given(st.sampled_from("CDcd"), posix_segments, st.booleans(), st.booleans())
def test_windows_normalization_ignores_case_and_separator(drive, segments, backslash, trailing):
    sep = "\\" if backslash else "/"
    raw = f"{drive}:{sep}" + sep.join(segments) + (sep if trailing else "")
    once = domain.normalize_folder(raw)
    assert once == once.lower() and "\\" not in once
    assert domain.normalize_folder(once) == once
    assert domain.normalize_folder(raw.upper()) == once
    assert once == ntpath.normpath(raw).replace("\\", "/").lower().rstrip("/") or once.endswith(":/")


# --- scopes ------------------------------------------------------------------------------


def test_scope_values():
    assert parse_scope("all") == "all"
    assert parse_scope('"all"') == "all"
    assert parse_scope('{"project": "/x/y/"}') == {"project": "/x/y"}
    assert parse_scope({"sessions": ["claude-p", " id-1 ", "claude-p"]}) == {"sessions": ["claude-p", "id-1"]}


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ({"folder": "/x"}, 'unknown key "folder"'),
        ({"project": "/x", "sessions": ["a"]}, "exactly one key"),
        ({}, "empty object"),
        ({"project": "rel"}, "relative"),
        ({"project": 3}, "scope.project"),
        ({"sessions": []}, "empty list"),
        ({"sessions": "a"}, "non-empty list"),
        ({"sessions": [""]}, "must not be empty"),
        ({"sessions": [1]}, "expected a string"),
        ("everyone", "not JSON"),
        ("{not json", "not JSON"),
        ('"some string"', "string"),
        ([1, 2], "a list"),
        (7, "a number"),
        (True, "a boolean"),
    ],
)
def test_bad_scopes_name_the_problem(bad, fragment):
    with pytest.raises(InputError) as info:
        parse_scope(bad)
    assert fragment in str(info.value)
    assert "scope" in str(info.value)


json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@given(json_values)
def test_parse_scope_either_accepts_a_canonical_scope_or_refuses_clearly(value):
    try:
        scope = parse_scope(value)
    except InputError as exc:
        assert str(exc).startswith("scope")
        return
    assert parse_scope(json.loads(domain.scope_to_json(scope))) == scope
    assert domain.scope_kind(scope) in ("all", "project", "sessions")


# --- matching ------------------------------------------------------------------------------

A = SessionView(id="id-a", name="claude-proj", project="/w/proj", host_session_id="host-a")
B = SessionView(id="id-b", name="codex-proj", project="/w/proj")
C = SessionView(id="id-c", name="claude-other", project="/w/other")


def test_delivery_scope_matching():
    assert all(scope_applies("all", s) for s in (A, B, C))
    assert [s.name for s in (A, B, C) if scope_applies({"project": "/w/proj"}, s)] == [
        "claude-proj",
        "codex-proj",
    ]
    for address in ("claude-proj", "id-a", "host-a"):
        assert scope_applies({"sessions": [address]}, A)
        assert not scope_applies({"sessions": [address]}, B)


def test_lookup_rules():
    project = {"project": "/w/proj"}
    assert lookup_matches("all", project)
    assert lookup_matches("all", "all")
    assert not lookup_matches(project, "all")
    assert lookup_matches(project, project)
    assert not lookup_matches({"project": "/w/proj/sub"}, project)  # no subfolders
    # a project lookup includes decisions addressed to the caller (MCP)
    assert lookup_matches({"sessions": ["host-a"]}, project, addresses=A.addresses)
    assert not lookup_matches({"sessions": ["host-a"]}, project)
    # a sessions lookup matches any address of the same session
    assert lookup_matches({"sessions": ["host-a"]}, {"sessions": ["claude-proj"]}, addresses=A.addresses)
    assert not lookup_matches(project, {"sessions": ["claude-proj"]}, addresses=A.addresses)
    assert lookup_matches({"sessions": ["x"]}, None)


addresses = st.sampled_from(["a", "b", "c", "d"])


@given(
    st.lists(addresses, min_size=1, max_size=3, unique=True),
    st.lists(addresses, min_size=1, max_size=3, unique=True),
)
def test_sessions_matching_is_set_intersection(recorded, looked_up):
    assert lookup_matches({"sessions": recorded}, {"sessions": looked_up}) == bool(
        set(recorded) & set(looked_up)
    )


@given(st.sampled_from(["/p", "/q"]), st.sampled_from(["/p", "/q"]))
def test_project_delivery_matches_exact_folder(decided, session_project):
    s = SessionView(id="i", name="n", project=session_project)
    assert scope_applies({"project": decided}, s) == (decided == session_project)


# --- sessions and hops ------------------------------------------------------------------------


def test_names_and_dedupe():
    assert domain.session_name("claude", "/home/me/project") == "claude-project"
    assert domain.dedupe_name("claude-project", []) == "claude-project"
    assert domain.dedupe_name("claude-project", ["claude-project"]) == "claude-project-2"
    assert domain.dedupe_name("claude-project", ["claude-project", "claude-project-2"]) == "claude-project-3"


def test_hops():
    assert domain.reply_hop(None) == 1
    assert domain.reply_hop(1) == 2
    assert domain.reply_hop(99) == 100
    assert domain.reply_hop(100) == 100
    assert domain.is_active(9, 10) and not domain.is_active(10, 10)
    assert not domain.is_active(domain.DECISION_HOP, domain.HOP_MAX)


@pytest.mark.parametrize("bad", ["0", "101", "ten", "", True, 3.5, -1])
def test_hop_limit_values_are_checked(bad):
    with pytest.raises(InputError, match="1..100"):
        domain.parse_hop_limit(bad, source="AGENT_BRIDGE_HOP_LIMIT")


def test_render_has_exactly_the_seed_fields():
    # A row in the order of store.queries.DECISION_COLUMNS: seq first, current as SQLite gives it (0/1).
    row = (7, "d1", "camera", "Hold", '"all"', "p", "claude-x", "claude", 1, None, None, 1)
    rendered = Decision.from_row(row).to_json()
    assert set(rendered) == DECISION_FIELDS
    assert rendered["author"] == {"id": "p", "name": "claude-x", "agent": "claude"}
    assert rendered["current"] is True and rendered["scope"] == "all"


def test_decision_line_cuts_with_ellipsis():
    line = domain.decision_line({"topic": "t", "text": "x" * 300}, limit=160)
    assert line == "t: " + "x" * 159 + "…"
    assert domain.decision_line({"topic": "t", "text": "short"}, limit=160) == "t: short"


def test_messages_from_the_command_line_are_framed_as_a_local_command():
    for kind, what in (("message", "a message"), ("decision", "a pinned owner decision notice"),
                       ("retraction", "a notice that a pinned owner decision was retracted")):
        framed = domain.frame_message("cli", "cli", "please rebase", kind=kind)
        assert framed.startswith(f"[agent-bridge] {what}")
        assert "from a local command" in framed and "not from the user" in framed
        assert "another agent session" not in framed and framed.endswith("\nplease rebase")
    agent = domain.frame_message("codex-app", "codex", "hi", kind="retraction")
    assert "another agent session, codex-app (codex)" in agent and "retracted" in agent


@pytest.mark.parametrize("agent", ["cli", "CLI", "Cli"])
def test_no_session_can_call_its_agent_cli(agent):
    with pytest.raises(InputError, match="reserved"):
        domain.normalize_agent(agent)

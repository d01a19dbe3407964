"""docs/: the parts generated from the code match the code, and what they show of the MCP
tools is what a real `agent-bridge mcp` advertises to its host."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import trio

from tests.conftest import mcp_session

REPO = Path(__file__).resolve().parent.parent


def _generate():
    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_parts_are_current():
    assert _generate().stale() == [], "run: python docs/generate.py"


def test_a_stale_part_is_found(tmp_path):
    generate = _generate()
    for path in (REPO / "docs").glob("*.md"):
        shutil.copy(path, tmp_path / path.name)
    cli = tmp_path / "cli.md"
    cli.write_text(cli.read_text(encoding="utf-8").replace("`--detach`", "`--detached`"), encoding="utf-8")
    assert generate.stale(tmp_path) == ["cli.md: generated parts are stale"]
    (tmp_path / "schema.md").write_text("no markers\n", encoding="utf-8")
    assert "no docs file has the generated part 'schema'" in generate.stale(tmp_path)


def test_every_relative_link_resolves():
    import re

    for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"
    assert "(docs/README.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    assert (REPO / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


@pytest.mark.slow
async def test_documented_tools_are_the_advertised_ones(broker, env):
    documented = (REPO / "docs" / "mcp-tools.md").read_text(encoding="utf-8")
    with trio.fail_after(60):
        async with mcp_session(env, "--project", "/w/docs") as session:
            tools = (await session.list_tools()).tools
    assert tools
    for tool in tools:
        block = f"### `{tool.name}`\n\n{tool.description}\n\n```json\n" + json.dumps(
            tool.input_schema, indent=2, ensure_ascii=False, sort_keys=True) + "\n```\n"
        assert block in documented, tool.name


def test_ci_runs_exactly_the_readme_test_command():
    """`.ci/run` runs the command the README gives for testing (lint, typecheck and tests), so
    what passes on CI is what a contributor runs."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = next(
        line for line in readme.splitlines() if "nox -s" in line and line.startswith("python3 -m pip")
    )
    assert "lint" in command and "typecheck" in command and "tests" in command
    ci = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == [command]

"""What `pip install .` ships: every file of the package that is not Python source must be named
in pyproject's package data, or a real install (not the editable one the suite runs from) lacks
it. The relay, for one, answers with no broker from `mcp_static.json`."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agent_bridge"


def test_every_data_file_of_the_package_is_shipped():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["agent_bridge"]
    data = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    ]
    assert "relay/mcp_static.json" in data  # the relay's answers without a broker
    missing = [name for name in data if not any(fnmatch.fnmatch(name, g) for g in globs)]
    assert missing == [], f"not in [tool.setuptools.package-data] agent_bridge: {missing}"


def test_the_globs_find_every_data_file_as_setuptools_does():
    """setuptools expands the globs with `glob`, whose `*` skips dot-files and dot-folders (the
    plugin's `.claude-plugin/`, `.mcp.json`), which fnmatch above would match."""
    import glob

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["agent_bridge"]
    found = {name for g in globs for name in glob.glob(g, root_dir=PACKAGE, recursive=True)}
    data = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    assert "marketplace/agent-bridge/.claude-plugin/plugin.json" in data  # the plugin (hosts/plugin.py)
    assert sorted(data - found) == []

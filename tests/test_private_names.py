"""A private name (`_x`) is never used outside its module: not imported (`from m import _x`),
not reached through a module (`m._x`). A shared need moves to a public name in a module below
both (STYLE 14). Ruff's rule for this (PLC2701) is preview-only, so it is checked here."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "agent_bridge"

# (module, where the name is defined, name): uses still to be cut. Each entry must still be found,
# so that it is removed when its cut lands.
ALLOWED: set[tuple[str, str, str]] = set()


def module_names() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(module: str, tree: ast.Module, modules: set[str]) -> set[tuple[str, str, str]]:
    """(module, the module the name belongs to, name) for every private name `module` takes
    from another module of the package."""
    uses = set()
    bound: dict[str, str] = {}  # local name -> the package module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in modules:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in modules:
                    bound[alias.asname or alias.name] = full
                elif private(alias.name) and node.module != module:
                    uses.add((module, node.module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and private(node.attr) and bound[node.value.id] != module):
            uses.add((module, bound[node.value.id], node.attr))
    return uses


def test_no_private_name_is_used_outside_its_module():
    modules = module_names()
    found = set()
    for module, path in modules.items():
        found |= private_uses(module, ast.parse(path.read_text(encoding="utf-8")), set(modules))
    assert found - ALLOWED == set(), (
        "private names used across modules: make them public, or move them below both"
    )
    assert ALLOWED - found == set(), "no longer used across modules: remove from ALLOWED"


def test_the_check_finds_both_forms():
    """The walker itself, on source written for it: an import and an attribute through a module."""
    source = ("from agent_bridge.common.paths import _secret\nfrom agent_bridge.common import domain\n"
              "from agent_bridge.ipc import protocol as p\nx = domain._rule\ny = p.PUBLIC\nz = p._frame\n")
    modules = {"agent_bridge", "agent_bridge.common", "agent_bridge.common.paths",
               "agent_bridge.common.domain", "agent_bridge.ipc", "agent_bridge.ipc.protocol",
               "agent_bridge.cli.demo"}
    assert private_uses("agent_bridge.cli.demo", ast.parse(source), modules) == {
        ("agent_bridge.cli.demo", "agent_bridge.common.paths", "_secret"),
        ("agent_bridge.cli.demo", "agent_bridge.common.domain", "_rule"),
        ("agent_bridge.cli.demo", "agent_bridge.ipc.protocol", "_frame"),
    }

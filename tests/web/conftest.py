"""Fixtures of the dashboard tests (helpers in webfixtures.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from webfixtures import Facts, Running, build_database, start_dashboard


@pytest.fixture
def web_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


@pytest.fixture
def facts(web_home: Path) -> Facts:
    return build_database(web_home)


@pytest.fixture
async def dashboard(nursery: trio.Nursery, web_home: Path, facts: Facts) -> AsyncIterator[Running]:
    """The dashboard over the fixture database; the claude session is connected."""
    running = await start_dashboard(nursery, web_home, live={facts.peers["claude-proj"]["id"]})
    yield running

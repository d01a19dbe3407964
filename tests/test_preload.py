"""The broker loads the sessions' MCP side (the MCP SDK, pydantic) by itself soon after it is
ready, not at the first session's connection, where the import held that session's
`tools/list`, and every other session on the event loop, up for half a second. Its dashboard's
server (Quart, Hypercorn) likewise: the broker listens for it before it is ready and loads it
after (dashboard/deferred.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import wait_until

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps (Linux)")


def _mapped(pid: int, library: str) -> bool:
    return library in Path(f"/proc/{pid}/maps").read_text()


def test_a_ready_broker_loads_the_mcp_side_before_any_session_asks(broker) -> None:
    """Seen from outside the process: pydantic's native core, which only the MCP side needs,
    is mapped into the broker while no session has connected."""
    wait_until(
        lambda: _mapped(broker.pid, "pydantic_core"), timeout=60, what="the MCP SDK loaded by the broker"
    )
    assert broker.status()["sessions"] == 0


def test_a_ready_broker_loads_the_dashboard_s_server_with_no_browser_asking(broker) -> None:
    """markupsafe's native speedups, which only Quart's templates need, are mapped into the broker
    once its sessions settled, while nothing connected to the dashboard."""
    wait_until(
        lambda: _mapped(broker.pid, "markupsafe"), timeout=60, what="Quart loaded by the broker"
    )
    assert broker.status()["sessions"] == 0


def test_the_broker_reaches_ready_without_the_mcp_side() -> None:
    """What `agent-bridge up` imports before it answers anyone leaves the MCP side (the SDK,
    pydantic) to the thread that loads it after ready: imported at the top of a module the
    broker starts with, it cost every start half a second on the event loop."""
    import subprocess
    import sys

    code = (
        "import sys; import agent_bridge.broker.root, agent_bridge.broker.ops.handlers; "
        "print(sorted(m for m in ('mcp', 'pydantic', 'agent_bridge.broker.mcp.host') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def test_the_broker_reaches_ready_without_the_dashboard_s_server() -> None:
    """`agent-bridge up` and the broker's tree import the dashboard's listening socket, not its
    server: Quart and Hypercorn were 150-230 ms of every start before broker.json was written,
    and a restarted broker's sessions wait for broker.json."""
    import subprocess
    import sys

    code = (
        "import sys; import agent_bridge.broker.control, agent_bridge.broker.root; "
        "print(sorted(m for m in ('quart', 'hypercorn', 'flask', 'agent_bridge.dashboard.server') "
        "if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded

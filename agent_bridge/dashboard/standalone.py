"""`agent-bridge dashboard [--open]` (SPEC §1, §2).

With a broker running: print the URL it published in `dashboard.url`. Without one: serve the
same app in the foreground, read-only, until Ctrl-C (or SIGTERM).

The token never goes on a command line: `--open` hands the browser a 0600 redirect page in the
state folder, not the tokenized URL itself: any local user can read a command line (`ps`).
"""

from __future__ import annotations

import html
import signal
import sys
import webbrowser
from pathlib import Path

from agent_bridge.common import paths

OPEN_PAGE = "dashboard-open.html"  # the redirect page --open gives the browser
REDIRECT_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
<meta http-equiv="refresh" content="0; url={url}"><title>agent-bridge dashboard</title></head>
<body><p><a href="{url}">Open the agent-bridge dashboard</a></p></body></html>
"""


def main(open_browser: bool) -> int:
    home = paths.home()
    broker = running_broker(home)
    if broker is not None:
        url = read_url_file(home)
        if url is None:
            print(
                f"agent-bridge dashboard: a broker is running (pid {broker['pid']}) but "
                f"{home / paths.DASHBOARD_URL} is missing or empty; it is written once the dashboard "
                "listens: try again in a moment, or see broker.log",
                file=sys.stderr,
            )
            return 1
        print(url, flush=True)
        if open_browser:
            open_in_browser(home, url)
        return 0
    return _serve(home, open_browser)


def running_broker(home: Path) -> dict | None:
    """The running broker's record, confirmed by its lock (paths.running_broker)."""
    return paths.running_broker(home)


def read_url_file(home: Path) -> str | None:
    try:
        text = (home / paths.DASHBOARD_URL).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


def open_in_browser(home: Path, url: str) -> bool:
    """Open `url` through a 0600 redirect page, so the token is not on the browser's argv."""
    try:
        page = write_open_page(home, url)
    except OSError as exc:
        print(f"agent-bridge dashboard: cannot write {home / OPEN_PAGE} ({exc.strerror}); "
              "open the URL above yourself", file=sys.stderr)
        return False
    opened = webbrowser.open(page.as_uri())
    if not opened:
        print("agent-bridge dashboard: no browser found; open the URL above yourself", file=sys.stderr)
    return opened


def write_open_page(home: Path, url: str) -> Path:
    """`<home>/dashboard-open.html` (0600): a page that sends the browser on to `url`."""
    page = home / OPEN_PAGE
    paths.write_private(page, REDIRECT_PAGE.format(url=html.escape(url, quote=True)))
    return page


def _serve(home: Path, open_browser: bool) -> int:
    import trio

    from agent_bridge.dashboard.port import DashboardError

    try:
        return trio.run(_serve_foreground, home, open_browser)
    except DashboardError as exc:
        print(f"agent-bridge dashboard: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the signal handler was installed
        return 0


async def _serve_foreground(home: Path, open_browser: bool) -> int:
    from functools import partial

    import trio

    from agent_bridge.dashboard.server import run_dashboard

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            dashboard = await nursery.start(partial(run_dashboard, home, live=None, require_url_file=False))
            print(dashboard.url, flush=True)
            if dashboard.publish_error:
                print(
                    f"agent-bridge dashboard: {dashboard.publish_error}; use the URL above", file=sys.stderr
                )
            print(
                f"agent-bridge dashboard: no broker is running; serving {home} read-only until Ctrl-C",
                file=sys.stderr,
                flush=True,
            )
            if open_browser:
                await trio.to_thread.run_sync(open_in_browser, home, dashboard.url)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()
    return 0

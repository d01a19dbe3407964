"""Desktop notifications through `desktop-notifier` (D-Bus `org.freedesktop.Notifications` on
Linux, the native notification centres on macOS and Windows), from the broker's Trio loop.

desktop-notifier is asyncio code. Each notification runs on a worker thread inside an asyncio
loop of its own (`asyncio.run`), one at a time, bounded by SEND_TIMEOUT: the Trio loop never
waits on D-Bus, and alerts are rare enough (a question, a job's end, a message to the owner)
that a fresh connection per notification costs nothing that matters. The package is imported
there too, on first use: a broker that never alerts never loads it.

The library logs a failed notification as a warning with a traceback and carries on. Its
records are kept out of the broker's log here (this module's `_Failures` takes them instead) and
the failure becomes one line of our own, once: "no notification service" is a fact about the
desktop, not news at every alert. After a failure the next alerts are tried again at most every
RETRY_AFTER seconds and fail silently, so a notification service started later is found.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import trio

log = logging.getLogger("agent_bridge.broker")

APP_NAME = "agent-bridge"
SEND_TIMEOUT = 10.0  # seconds a notification may take (connect, introspect, Notify)
RETRY_AFTER = 300.0  # seconds after a failure before the next alert tries the service again


class _Failures(logging.Handler):
    """desktop-notifier's log records, kept instead of printed: the last one's words say why a
    notification failed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        reason = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self.last = reason


_failures = _Failures()
_library_log = logging.getLogger("desktop_notifier")
_library_log.addHandler(_failures)
_library_log.propagate = False
_sending = threading.Lock()  # one notification at a time, whichever task asks


def _send_blocking(title: str, body: str) -> str | None:
    """Show one notification; None when it was handed to the service, else why not."""
    with _sending:
        _failures.last = None
        try:
            return asyncio.run(asyncio.wait_for(_send(title, body), SEND_TIMEOUT))
        except TimeoutError:
            return f"no answer within {SEND_TIMEOUT:.0f} s"
        except Exception as exc:  # noqa: BLE001 - any failure of the library or the bus is "no service"
            return f"{type(exc).__name__}: {exc}"


async def _send(title: str, body: str) -> str | None:
    from desktop_notifier import DesktopNotifier  # dbus-fast on Linux: loaded on first use

    dispatched = asyncio.Event()
    notifier: Any = DesktopNotifier(app_name=APP_NAME, app_icon=None)
    try:
        await notifier.send(title=title, message=body, on_dispatched=dispatched.set)
    finally:
        # Its D-Bus connection outlives the call otherwise (one socket per alert, until garbage
        # collection): the library has no public close, so its backend's bus is closed here.
        bus = getattr(getattr(notifier, "_backend", None), "bus", None)
        if bus is not None:
            bus.disconnect()
    if dispatched.is_set():
        return None
    return _failures.last or "the notification was not delivered"


class Desktop:
    """The broker's desktop notifications: `await show(title, body)`; says once in the log when
    no notification service answers."""

    def __init__(self) -> None:
        self.shown = 0
        self.failed_at: float | None = None  # trio.current_time() of the last failure
        self.told = False  # the one log line was written

    async def show(self, title: str, body: str) -> bool:
        now = trio.current_time()
        if self.failed_at is not None and now - self.failed_at < RETRY_AFTER:
            return False
        failure = await trio.to_thread.run_sync(_send_blocking, title, body, abandon_on_cancel=True)
        if failure is None:
            self.shown += 1
            self.failed_at = None
            return True
        self.failed_at = trio.current_time()
        if not self.told:
            self.told = True
            log.warning("alerts: no desktop notification service answered (%s); no desktop "
                        "notifications until one does (alerts = false in config.toml turns them off)",
                        failure.splitlines()[0] if failure else failure)
        return False

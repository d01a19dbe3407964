"""`agent-bridge up | down | status`: start, stop and inspect the broker process."""

from __future__ import annotations

import io
import json
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import apsw

from agent_bridge.common import config, paths
from agent_bridge.federation.errors import FederationError
from agent_bridge.ipc import blocking
from agent_bridge.ipc.protocol import RemoteError
from agent_bridge.store.migration import SchemaError

if TYPE_CHECKING:
    from agent_bridge.federation.settings import FederationSettings

E = TypeVar("E", bound=BaseException)

LOCK_NAME = paths.LOCK_NAME
DETACH_TIMEOUT = 20.0  # seconds `up --detach` waits for the broker to accept connections
DOWN_TIMEOUT = 10.0
NOT_RUNNING = 3  # `status` with no broker: the exit status service managers use for "not running"
LOG_MAX_BYTES = 5_000_000  # broker.log, then one older broker.log.1: whatever clients make it log
DETACHED_MARK = "AGENT_BRIDGE_DETACHED_CHILD"  # set by `up --detach` for the broker it spawns


class BrokerLock:
    """One broker per home: an exclusive flock held for the broker's lifetime. The kernel
    releases it when the process dies, so a killed broker never blocks the next one."""

    def __init__(self, home: Path) -> None:
        self.path = home / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if sys.platform == "win32":
                import msvcrt

                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # released by the OS when the process dies
            else:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError here; PermissionError from msvcrt
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _already_running(home: Path) -> str:
    record = paths.read_broker_json(home) or {}
    pid = record.get("pid")
    where = f" (pid {pid})" if pid else ""
    return (f"agent-bridge: {paths.ALREADY_RUNNING} {home}{where}; "
            "use `agent-bridge status` or `agent-bridge down`")


class _PrivateRotatingLog(logging.handlers.RotatingFileHandler):
    """broker.log with a size cap: any client of this user can make the broker log (each
    connection that says hello and leaves writes two lines), so only a cap bounds the file.
    Each file it opens is this user's only (0600), whatever the umask."""

    def __init__(self, filename: Path, **kwargs: Any) -> None:
        super().__init__(filename, **kwargs)
        # A detached broker's stdout and stderr are this file too (`up --detach`): whatever it
        # writes there (a crash traceback) must follow the rotation into the new broker.log,
        # not land in the old one renamed broker.log.1.
        self.std_fds = [fd for fd in (1, 2) if _same_file(fd, self.baseFilename)]

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "a", encoding=self.encoding)

    def doRollover(self) -> None:
        super().doRollover()
        if self.stream is None or not self.std_fds:
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # what is buffered belongs to the old file
            except (OSError, ValueError):
                pass
        for fd in self.std_fds:
            os.dup2(self.stream.fileno(), fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:  # fd closed, or the file not there
        return False


def setup_logging(home: Path, *, to_stderr: bool) -> None:
    handlers: list[logging.Handler] = []
    handlers.append(
        _PrivateRotatingLog(paths.log_path(home), maxBytes=LOG_MAX_BYTES, backupCount=1, encoding="utf-8")
    )
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
        force=True,
    )


def _federation_settings(home: Path) -> FederationSettings | None:
    """[federation] of config.toml (None without one), its seed readable and private, and nats-py
    there: each refusal one line, before anything starts (SPEC §10)."""
    from agent_bridge.federation import settings as federation_settings

    found = federation_settings.load(home)
    if found is not None:
        from agent_bridge.federation.errors import require
        from agent_bridge.federation.identity import read_seed

        require("nats")
        read_seed(found.seed)
    return found


def up(*, detach: bool) -> int:  # noqa: C901 - the start-up order, and each refusal with its own line, in one place
    os.umask(0o077)  # bridge.db, its WAL files and the log: this user only
    _take_stop_signals()
    reasons = _reason_channel()  # `up --detach` waits on it for why its child could not start
    home = paths.home()
    try:
        paths.writable_home(home)  # a read-only folder: one line here, before any file is opened in it
        settings = config.load(home)
        federation = _federation_settings(home)
    except config.ConfigError as exc:
        return _refuse(reasons, f"{exc} {paths.PERMANENT}until the setting changes)", code=2)
    except FederationError as exc:  # a bad [federation] value, an unusable seed, a missing extra
        return _refuse(reasons, f"{exc} {paths.PERMANENT}until the setting changes)", code=2)
    except paths.HomeError as exc:
        return _refuse(reasons, str(exc))
    except OSError as exc:  # writable_home's own reasons name the folder
        said = exc.strerror or str(exc)
        return _refuse(reasons, said if str(home) in said else f"cannot use the state folder {home}: {said}")
    if detach:
        try:
            return _up_detached(home)
        except OSError as exc:  # the lock or the log cannot be opened after all
            return _refuse(reasons, f"cannot write in the state folder {home}: {exc.strerror or exc}")
    lock = BrokerLock(home)
    try:
        if not lock.acquire():
            # Also what a broker started by `up --detach` says when another one (started at the
            # same moment by another MCP server) won the lock: its parent reports exactly this.
            _tell_parent(reasons, _already_running(home))
            return 1
        setup_logging(home, to_stderr=False)
    except OSError as exc:
        lock.release()
        return _refuse(reasons, f"cannot write in the state folder {home}: {exc.strerror or exc}")
    try:
        import trio

        from agent_bridge.broker.root import run_broker
        from agent_bridge.dashboard.port import DashboardError

        log = logging.getLogger("agent_bridge.broker")
        refused: list[str] = []
        channel = [reasons]

        def on_ready(record: dict[str, Any]) -> None:
            (home / paths.START_FAILURE).unlink(missing_ok=True)
            if reasons is None:
                _print_ready(record, detached=False)
            else:  # its stdout is broker.log; the parent, now reading nothing more, prints the ready lines
                channel[0] = None
                os.close(reasons)

        _raise_open_files_limit()
        try:
            trio.run(partial(run_broker, home, settings, on_ready=on_ready, federation=federation))
        except* (SchemaError, DashboardError) as group:
            # Refusals we understand (a newer database, a dashboard port in use): say why, exit 1.
            refused.extend(_permanent(refusal) for refusal in _leaves(group))
        except* (OSError, apsw.Error) as group:  # a locked or unreadable database, a read-only folder
            for failure in _leaves(group):
                log.error("start-up failed", exc_info=failure)
                refused.append(f"could not start: {_one_line(failure)} (details in {paths.log_path(home)})")
        except* KeyboardInterrupt:
            pass  # Ctrl-C before the signal handler was in place: stopped, as asked
        except* Exception as group:
            for unexpected in _leaves(group):
                log.error("unexpected failure", exc_info=unexpected)
                refused.append(f"failed: {_one_line(unexpected)} (details in {paths.log_path(home)})")
        for refusal in refused:
            log.error("%s", refusal)
            _refuse(channel[0], refusal)
        if refused:
            _remember_failure(home, refused[0])
        return 1 if refused else 0
    finally:
        lock.release()


def _permanent(refusal: Exception) -> str:
    """A refusal's line, marked permanent when starting again cannot change it (a database of a
    newer schema or not a database at all): relays then wait for the file to change."""
    if isinstance(refusal, SchemaError):
        return f"{refusal} {paths.PERMANENT}until {paths.DB_NAME} changes)"
    return str(refusal)


def _take_stop_signals() -> None:
    """SIGINT and SIGTERM reach this process even when the one that started it held them (a
    relay's threads hold them, and a child inherits that): `down` and the user stop it so."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _raise_open_files_limit() -> None:
    """Raise the soft limit on open files to the hard one: every session, hook and dashboard
    tab holds a descriptor, and the common soft limit (1024) is far below what is allowed."""
    try:
        import resource
    except ImportError:  # Windows: no such limit
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            logging.getLogger("agent_bridge.broker").info("could not raise the open-files limit: %s", exc)


def _leaves(group: BaseExceptionGroup[E]) -> list[E]:
    """The exceptions in a group, nested groups (one per nursery level) flattened."""
    found: list[E] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


def _remember_failure(home: Path, reason: str) -> None:
    """Keep the reason where `doctor` finds it; a folder we cannot write keeps nothing."""
    try:
        paths.write_private(home / paths.START_FAILURE, reason + "\n")
    except OSError:
        pass


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return (
        f"{type(exc).__name__}: {text}"
        if isinstance(exc, Exception) and not isinstance(exc, OSError)
        else text
    )


def _reason_channel() -> int | None:
    """In the broker `up --detach` spawned: the pipe its parent reads for a refusal (else None)."""
    raw = os.environ.pop(DETACHED_MARK, None)
    if raw is None:
        return None
    try:
        fd = int(raw)
        os.fstat(fd)
    except (ValueError, OSError):
        return None
    return fd


def _refuse(reasons: int | None, text: str, *, code: int = 1) -> int:
    """Say why the broker cannot start: on stderr, and to the waiting `up --detach` if any."""
    _tell_parent(reasons, f"agent-bridge up: {text}")
    return code


def _tell_parent(reasons: int | None, line: str) -> None:
    """`line` on stderr, and to the waiting `up --detach` if any."""
    print(line, file=sys.stderr, flush=True)
    if reasons is not None:
        try:
            os.write(reasons, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass


def _print_ready(record: dict[str, Any], *, detached: bool) -> None:
    """What a person starting the broker needs: where the dashboard is, how to connect hosts.
    Printed to the terminal only, never to broker.log (the URL carries the dashboard token)."""
    home = Path(record["home"])
    print(f"agent-bridge broker running (pid {record['pid']})", flush=True)
    print(f"  socket:    {record['socket']}")
    if record.get("web"):
        try:
            url = (home / paths.DASHBOARD_URL).read_text(encoding="utf-8").strip()
        except OSError:
            url = f"{record['web']} (tokenized URL in {home / paths.DASHBOARD_URL})"
        print(f"  dashboard: {url}")
    print(
        "  connect Claude Code: agent-bridge install --claude   (or: claude mcp add agent-bridge -- "
        "agent-bridge mcp --agent claude)"
    )
    print("  connect Codex:       agent-bridge install --codex")
    print("  stop:                agent-bridge down" + ("" if detached else "   (or Ctrl-C)"), flush=True)


def _up_detached(home: Path) -> int:
    deadline = time.monotonic() + DETACH_TIMEOUT
    while time.monotonic() < deadline:
        probe = BrokerLock(home)
        if probe.acquire():
            probe.release()
            code = _start_detached(home, deadline)
        else:
            code = _already_up(home, deadline)
        if code is not None:
            return code
        # The lock went free before a broker answered: whoever held it (another `up --detach`
        # between its probe and its child's lock, or a broker that gave up) is not starting
        # one now. Start one here; a broker that cannot start says why itself.
    return _not_ready(home)


def _start_detached(home: Path, deadline: float) -> int | None:
    log_fd = os.open(paths.log_path(home), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    read_reasons, write_reasons = os.pipe()  # the child writes why it could not start, if so
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "agent_bridge", "up"],
            env={**os.environ, DETACHED_MARK: str(write_reasons)},
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
            pass_fds=(write_reasons,),
        )
    except BaseException:
        os.close(read_reasons)
        raise
    finally:
        os.close(log_fd)
        os.close(write_reasons)
    try:
        return _wait_detached(home, child, read_reasons, deadline)
    finally:
        os.close(read_reasons)


def _wait_detached(home: Path, child: subprocess.Popen[bytes], reasons: int, deadline: float) -> int | None:
    """0 once `child` answers, 1 with its reason if it could not start; None if it found the
    lock taken by another broker that then went away too (the caller tries again)."""
    while time.monotonic() < deadline:
        code = child.poll()
        if code is not None:
            said = _read_all(reasons)
            if paths.ALREADY_RUNNING in said or (not said and code == 1 and not BrokerLock(home).acquire()):
                return _already_up(home, deadline)  # another one started at the same moment: it is up
            if said:
                sys.stderr.write(said if said.endswith("\n") else said + "\n")
            else:
                print(
                    f"agent-bridge up: the broker exited with status {code}; see {paths.log_path(home)}",
                    file=sys.stderr,
                )
            return 1
        record = paths.read_broker_json(home)
        if record and record.get("pid") == child.pid:
            try:
                blocking.call(home, "ping", timeout=1.0)
            except (blocking.BrokerUnavailable, RemoteError):
                pass
            else:
                _print_ready(record, detached=True)
                return 0
        time.sleep(0.05)
    return _not_ready(home)


def _not_ready(home: Path) -> int:
    print(
        f"agent-bridge up: the broker did not become ready in {DETACH_TIMEOUT:.0f}s; see "
        f"{paths.log_path(home)}",
        file=sys.stderr,
    )
    return 1


def _already_up(home: Path, deadline: float) -> int | None:
    """`up --detach` while a broker runs (or is starting) for `home`: once it answers, say so and
    exit 0, so scripts can use `up --detach` as "make sure one is up" (SPEC §2). None: the lock
    went free first, so nobody is starting one."""
    while True:
        record = paths.read_broker_json(home)
        try:
            if record and blocking.call(home, "ping", timeout=1.0) == "pong":
                print(f"agent-bridge: {paths.ALREADY_RUNNING} {home} (pid {record.get('pid')})")
                return 0
        except (blocking.BrokerUnavailable, RemoteError, OSError):
            pass
        if paths.lock_holder(home) is None:
            return None
        if time.monotonic() >= deadline:
            print(_already_running(home) + f"; it did not answer in {DETACH_TIMEOUT:.0f}s", file=sys.stderr)
            return 1
        time.sleep(0.05)


def _read_all(fd: int) -> str:
    """What the exited child wrote on the reasons pipe (EOF: every writer has closed it)."""
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def down() -> int:
    """Stop this home's broker: ask it on its socket; signal its process only once the lock
    confirms the pid is that broker (a pid in a stale broker.json may be anyone's by now).
    A broker still starting (it holds the lock, broker.json not yet written: a relay may start
    one right after the last one stopped) is waited for, then stopped: it would otherwise come
    up after `down` looked, and stay."""
    home = paths.home()
    record = paths.running_broker(home)
    if record is None:
        try:
            record = _starting_broker(home)
        except TimeoutError as exc:
            print(f"agent-bridge down: {exc}", file=sys.stderr)
            return 1
    if record is None:
        print("agent-bridge: no broker is running")
        return 0
    pid = record["pid"]
    interrupted = 0
    try:
        said = blocking.call(home, "shutdown", timeout=5.0)
        interrupted = int(said.get("jobsInterrupted") or 0) if isinstance(said, dict) else 0
    except (blocking.BrokerUnavailable, RemoteError):
        if paths.running_broker(home) != record:  # confirmed again right before the signal
            print("agent-bridge: no broker is running")
            return 0
        os.kill(pid, signal.SIGTERM)  # it does not answer on its socket: ask the process
    deadline = time.monotonic() + DOWN_TIMEOUT
    while time.monotonic() < deadline and not _stopped(home, pid):
        time.sleep(0.05)
    if not _stopped(home, pid):
        print(f"agent-bridge down: broker (pid {pid}) did not stop in {DOWN_TIMEOUT:.0f}s", file=sys.stderr)
        return 1
    print(f"agent-bridge: broker (pid {pid}) stopped")
    if interrupted:
        print(f"agent-bridge: {interrupted} running job{'s' if interrupted != 1 else ''} interrupted; "
              'each can be resumed: job(id, action="continue", message) (see `agent-bridge jobs --all`)')
    return 0


def _starting_broker(home: Path) -> dict[str, Any] | None:
    """The record of the broker that holds this home's lock without being ready yet, once it
    is (it has DETACH_TIMEOUT, as for `up --detach`); None when nobody holds the lock, or the
    holder lets it go without becoming ready (a broker that could not start). TimeoutError
    when it holds the lock that long without becoming ready."""
    holder = paths.lock_holder(home)
    if holder is None:
        return None
    named = f" (pid {holder})" if holder else ""
    print(f"agent-bridge: a broker{named} is starting; waiting for it to stop it", flush=True)
    deadline = time.monotonic() + DETACH_TIMEOUT
    while True:
        record = paths.running_broker(home)
        if record is not None:
            return record
        if paths.lock_holder(home) is None:
            return None
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the broker{named} holding {home / LOCK_NAME} did not become ready in "
                               f"{DETACH_TIMEOUT:.0f}s; see {paths.log_path(home)}")
        time.sleep(0.05)


def _stopped(home: Path, pid: int) -> bool:
    """The broker removed its record (after its last checkpoint) and its process is gone."""
    record = paths.read_broker_json(home)
    if record is not None and record.get("pid") == pid:
        return not paths.pid_alive(pid)  # killed before it could clean up
    return _is_zombie_or_gone(pid)


def _is_zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return not paths.pid_alive(pid)


def status(*, as_json: bool) -> int:
    home = paths.home()
    info: dict[str, Any] = {"running": False, "home": str(home)}
    record = paths.running_broker(home)
    if record is not None:
        try:
            live = blocking.call(home, "status", timeout=2.0)
        except (blocking.BrokerUnavailable, RemoteError) as exc:
            info["error"] = f"broker pid {record['pid']} does not answer: {exc}"
        else:
            info.update(live)
            info["running"] = True
    if as_json:
        print(json.dumps(info))
        return 0 if info["running"] else NOT_RUNNING
    if not info["running"]:
        print(
            f"agent-bridge: no broker running for {home}" + (f" ({info['error']})" if "error" in info else "")
        )
        return NOT_RUNNING
    print(f"agent-bridge broker running (pid {info['pid']}) for {home}")
    print(f"  socket: {info['socket']}")
    print(f"  dashboard: {info.get('web') or 'not serving'} (tokenized URL in {home / paths.DASHBOARD_URL})")
    print(
        f"  sessions connected: {info['sessions']}; hop limit {info['hopLimit']}; schema "
        f"v{info['schemaVersion']}"
    )
    return 0

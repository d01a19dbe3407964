"""Where agent-bridge keeps its state (SPEC §2). Light: standard library only."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agent_bridge.common import jsonlimit

DB_NAME = "bridge.db"
BROKER_JSON = "broker.json"
DASHBOARD_URL = "dashboard.url"
LOG_NAME = "broker.log"
CONFIG_NAME = "config.toml"
SOCKET_NAME = "broker.sock"
LOCK_NAME = "broker.lock"  # held (flock) by the running broker for its whole life
# why the last `up` could not start a broker (for `doctor`); removed once one runs
START_FAILURE = "broker.failed"
REPORTS_DIR = "reports"  # hook identity reports left while no broker runs
# One empty file per host session with a message a hook may hand over (broker.feeds.postbox writes them;
# the PostToolUse hook's first look), and READY once a broker keeps them.
PENDING_DIR = "pending"
PENDING_READY = "ready"
PROMPTED_DIR = "prompted"  # per host session: the owner questions its UserPromptSubmit hook has shown
JOBS_DIR = "jobs"  # per job (SPEC §4.7): its runs' output and its last answer
WORKTREES_DIR = "worktrees"  # the git worktrees of worktree jobs

# sockaddr_un.sun_path is 108 bytes on Linux, 104 on the BSDs and macOS (including the NUL).
SOCKET_PATH_MAX = 103 if sys.platform == "darwin" or "bsd" in sys.platform else 107


def home(env: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """The state folder: $AGENT_BRIDGE_HOME, else the platform default."""
    env = os.environ if env is None else env
    explicit = env.get("AGENT_BRIDGE_HOME")
    if explicit:
        return Path(explicit).expanduser().absolute()
    if sys.platform == "win32":
        base = env.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "agent-bridge"
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "agent-bridge"


class HomeError(PermissionError):
    """The state folder cannot be ours: another user's, or not a folder. Nothing in it may be read,
    written or trusted."""


def check_home(path: Path) -> Path:
    """Refuse a state folder that exists and is not owned by the current user (SPEC §8).

    The one ownership check every command goes through (`cli.main`, and `ensure_home` below):
    another user who pre-created the folder could plant a database whose "decisions" the hooks
    would show, or read what we write there. A folder that does not exist yet is fine (whoever
    creates it, creates it as ours). A symlink counts by its target.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise HomeError(f"cannot use the state folder {path}: {exc.strerror}") from None
    import stat

    # a file there: no command may read "nothing" from it or write next to it
    if not stat.S_ISDIR(st.st_mode):
        raise HomeError(
            f"the state folder {path} is not a folder; refusing to use it "
            "(move it aside, or set AGENT_BRIDGE_HOME to a folder of your own)"
        )
    if sys.platform == "win32":
        owner_ok = _windows_owned_by_me(path)
    else:
        owner_ok = st.st_uid == os.geteuid()
    if not owner_ok:
        owner = f"uid {st.st_uid}" if sys.platform != "win32" else "another account"
        raise HomeError(
            f"the state folder {path} belongs to {owner}, not to you; refusing to use it "
            "(remove it, or set AGENT_BRIDGE_HOME to a folder of your own)"
        )
    return path


def _windows_owned_by_me(path: Path) -> bool:
    """Windows: the folder's owner SID equals this process token's user SID. (Not exercised by
    the test suite, which runs on Linux.)"""
    import ctypes
    from ctypes import wintypes

    advapi32 = ctypes.windll.advapi32  # type: ignore[attr-defined]
    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    owner = ctypes.c_void_p()
    descriptor = ctypes.c_void_p()
    SE_FILE_OBJECT, OWNER_SECURITY_INFORMATION = 1, 0x1
    if advapi32.GetNamedSecurityInfoW(str(path), SE_FILE_OBJECT, OWNER_SECURITY_INFORMATION,
                                      ctypes.byref(owner), None, None, None, ctypes.byref(descriptor)) != 0:
        return False
    token = wintypes.HANDLE()
    try:
        TOKEN_QUERY, TOKEN_USER = 0x0008, 1
        if not advapi32.OpenProcessToken(kernel32.GetCurrentProcess(), TOKEN_QUERY, ctypes.byref(token)):
            return False
        size = wintypes.DWORD()
        advapi32.GetTokenInformation(token, TOKEN_USER, None, 0, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        if not advapi32.GetTokenInformation(token, TOKEN_USER, buffer, size, ctypes.byref(size)):
            return False
        my_sid = ctypes.cast(buffer, ctypes.POINTER(ctypes.c_void_p))[0]  # TOKEN_USER.User.Sid
        return bool(advapi32.EqualSid(owner, ctypes.c_void_p(my_sid)))
    finally:
        if token:
            kernel32.CloseHandle(token)
        kernel32.LocalFree(descriptor)


def ensure_home(path: Path) -> Path:
    """Create the state folder 0700 (and tighten it if it already exists). Raises HomeError for
    a folder owned by another user, before anything is created in it."""
    check_home(path)
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_home(path)  # created meanwhile by someone else: still refused
    if sys.platform != "win32":
        st = path.stat()
        if st.st_mode & 0o077:
            path.chmod(0o700)
    return path


def writable_home(path: Path) -> Path:
    """`ensure_home`, and a folder this user can write in (the broker keeps its database, socket
    and log there). Raises OSError whose `strerror` names the folder and the problem."""
    try:
        ensure_home(path)
    except HomeError:
        raise
    except OSError as exc:
        raise OSError(exc.errno, f"cannot create the state folder {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        import errno

        raise OSError(
            errno.EACCES,
            f"cannot write in the state folder {path} (read-only or not yours to write); "
            "fix that, or set AGENT_BRIDGE_HOME to a folder you can write",
        )
    return path


def pending_path(home: Path, host_session_id: str) -> Path:
    """`<home>/pending/<digest>`: present while the session may have a message to hand over."""
    return home / PENDING_DIR / host_session_digest(host_session_id)


def host_session_digest(host_session_id: str) -> str:
    """The file name stem of what the home folder keeps per host session (a hook's identity
    report, a session's busy/idle mark): `sha256(host session id)[:32]`."""
    try:  # CPython's built-in SHA-256: `hashlib` loads OpenSSL, ~2 ms at every session start
        from _sha256 import sha256  # type: ignore[import-not-found, unused-ignore]
    except ImportError:  # other interpreters, Python >= 3.12 (`_sha2`)
        from hashlib import sha256

    digest: str = sha256(host_session_id.encode("utf-8")).hexdigest()
    return digest[:32]


def db_path(home_dir: Path) -> Path:
    return home_dir / DB_NAME


def log_path(home_dir: Path) -> Path:
    return home_dir / LOG_NAME


def socket_path(home_dir: Path) -> str:
    """`<home>/broker.sock` when it fits the OS limit, else a short path in the runtime dir
    (`$XDG_RUNTIME_DIR`, else `$TMPDIR` or /tmp). That is the preferred path: the broker binds
    elsewhere when its folder is not safe to use (ipc.listener.prepare_socket_path), and
    broker.json records where it did."""
    import hashlib  # here, not at the top: the hooks import this module at every session start
    import tempfile

    if sys.platform == "win32":
        user = os.environ.get("USERNAME", "user")
        digest = hashlib.sha256(str(home_dir).encode()).hexdigest()[:12]
        return rf"\\.\pipe\agent-bridge-{user}-{digest}"
    candidate = str(home_dir / SOCKET_NAME)
    if len(os.fsencode(candidate)) <= SOCKET_PATH_MAX:
        return candidate
    runtime = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    digest = hashlib.sha256(str(home_dir).encode()).hexdigest()[:16]
    folder = Path(runtime) / f"agent-bridge-{os.getuid()}"
    return str(folder / f"{digest}.sock")


def socket_folder_problem(folder: Path) -> str | None:
    """Why `folder` must not hold this user's broker socket (SPEC §8, sockets): a symlink, not a
    folder, or another user's; None when it is a real folder of ours, or absent. Looked at with
    lstat: a symlink is never followed."""
    import stat

    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{folder} cannot be checked: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{folder} is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if sys.platform != "win32" and st.st_uid != os.geteuid():
        return f"{folder} belongs to uid {st.st_uid}"
    return None


def free_path(folder: Path, stem: str, suffix: str = "") -> Path:
    """`folder/<stem><suffix>`, or `<stem>-2<suffix>`, `-3`… while that name is taken (backups)."""
    candidate = folder / f"{stem}{suffix}"
    n = 2
    while candidate.exists():
        candidate = folder / f"{stem}-{n}{suffix}"
        n += 1
    return candidate


def write_private(path: Path, text: str) -> None:
    """Write a file atomically with mode 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_broker_json(home_dir: Path) -> dict[str, Any] | None:
    """The running broker's record, or None when there is none (or it is unreadable)."""
    try:
        data = jsonlimit.loads((home_dir / BROKER_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# How `agent-bridge up` begins its refusal when another broker holds this home's lock. An MCP
# server that started a broker and hears this lost a race with another one: not a failure.
ALREADY_RUNNING = "a broker is already running for"

# How `agent-bridge up` marks a refusal that trying again cannot change (a database of a newer
# schema, a file that is not a database, a bad setting) until a file of the state folder does.
# An MCP server that hears it does not start another broker until one of START_FILES changes.
PERMANENT = "(permanent: "
START_FILES = (DB_NAME, CONFIG_NAME)


def start_files_identity(home_dir: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """(inode, size, mtime) of each of START_FILES, None for one that is missing."""
    found: list[tuple[int, int, int] | None] = []
    for name in START_FILES:
        try:
            st = os.stat(home_dir / name)
        except OSError:
            found.append(None)
        else:
            found.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(found)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate the process there
        import ctypes

        kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return False
        try:
            code = ctypes.c_ulong()
            # STILL_ACTIVE
            return bool(kernel32.GetExitCodeProcess(handle, ctypes.byref(code))) and code.value == 259
        finally:
            kernel32.CloseHandle(handle)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_holder(home_dir: Path) -> int | None:
    """The pid holding this home's broker lock (0 when held by a pid we cannot name), or None
    when nobody holds it: then no broker runs for this home, whatever broker.json says.

    Linux names the holder in /proc/locks without taking the lock. Elsewhere we try to take it
    shared for an instant (a broker starting in that instant sees it as taken and says so).
    """
    try:
        st = (home_dir / LOCK_NAME).stat()
    except OSError:
        return None
    if sys.platform.startswith("linux"):
        found = _proc_locks_holder(st)
        if found is not False:
            return found
    if sys.platform == "win32":
        return 0  # no lock to probe without taking it; callers confirm the pid otherwise
    import fcntl

    try:
        fd = os.open(home_dir / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return 0
    finally:
        os.close(fd)  # also releases the probe's lock
    return None


def _proc_locks_holder(st: os.stat_result) -> int | None | bool:
    """From /proc/locks: the pid holding an exclusive flock on the file `st`, None if none,
    False if /proc/locks cannot be read. Lines: `1: FLOCK ADVISORY WRITE 4242 08:01:1234 0 EOF`."""
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "WRITE" and fields[5] == device:
            try:
                return int(fields[4])
            except ValueError:
                return 0
    return None


def running_broker(home_dir: Path) -> dict[str, Any] | None:
    """broker.json of the broker running for this home, confirmed by its lock: the lock is held,
    and (where the holder can be named) held by the pid the record names. None otherwise: a
    record left by a killed broker names a pid that may since belong to any process."""
    record = read_broker_json(home_dir)
    if record is None:
        return None
    pid = record.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not pid_alive(pid):
        return None
    holder = lock_holder(home_dir)
    if holder is None or (holder != 0 and holder != pid):
        return None
    return record


def append_log(home_dir: Path, line: str) -> None:
    """One line in broker.log; never raises (used on paths that must not fail)."""
    import time

    try:
        ensure_home(home_dir)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        fd = os.open(log_path(home_dir), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(f"{stamp} {line}\n")
    except OSError:
        pass

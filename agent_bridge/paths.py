"""Where agent-bridge keeps its state (SPEC §2). Light: standard library only."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

DB_NAME = "bridge.db"
BROKER_JSON = "broker.json"
DASHBOARD_URL = "dashboard.url"
LOG_NAME = "broker.log"
CONFIG_NAME = "config.toml"
SOCKET_NAME = "broker.sock"
REPORTS_DIR = "reports"  # hook identity reports left while no broker runs

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


def ensure_home(path: Path) -> Path:
    """Create the state folder 0700 (and tighten it if it already exists and is ours)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if sys.platform != "win32":
        st = path.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            path.chmod(0o700)
    return path


def db_path(home_dir: Path) -> Path:
    return home_dir / DB_NAME


def log_path(home_dir: Path) -> Path:
    return home_dir / LOG_NAME


def socket_path(home_dir: Path) -> str:
    """`<home>/broker.sock` when it fits the OS limit, else a short path in the runtime dir."""
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


def read_broker_json(home_dir: Path) -> dict | None:
    """The running broker's record, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads((home_dir / BROKER_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
            return bool(kernel32.GetExitCodeProcess(handle, ctypes.byref(code))) and code.value == 259  # STILL_ACTIVE
        finally:
            kernel32.CloseHandle(handle)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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

r"""The broker's Windows transport: a named pipe only this user can open (SPEC §8).

`\\.\pipe\agent-bridge-<user>-<hash of home>` (the name `paths.socket_path` gives on Windows),
behind the same listener interface as the Unix socket: `serve_pipe(name, handler,
task_status=...)` binds, reports the name as started, then runs `handler(stream)` for each
client in its own task, as `listener.serve_unix` does.

How the pipe is restricted:
- its security descriptor is a protected DACL that allows only this user's SID (and denies
  network logons outright), built from SDDL (`security_sddl`);
- `PIPE_REJECT_REMOTE_CLIENTS`: Windows refuses connections from other machines;
- `FILE_FLAG_FIRST_PIPE_INSTANCE` on the first instance: if another process (a squatter) already
  holds the name, the broker refuses to start instead of sharing it;
- clients open it with `SECURITY_SQOS_PRESENT | SECURITY_IDENTIFICATION`, so a server that is
  not the broker could at most identify them, never act as them;
- clients check, before they send a byte, that the server's process runs as this user
  (`check_server`: GetNamedPipeServerProcessId, then its token's SID): a pipe of that name
  created by another account is not the broker (the SO_PEERCRED check of the Unix clients).

I/O is overlapped, through Trio's own Windows primitives (`trio.lowlevel.register_with_iocp`,
`wait_overlapped`, `readinto_overlapped`, `write_overlapped`); the Win32 calls Trio does not wrap
(CreateNamedPipeW, ConnectNamedPipe, the SID and security-descriptor helpers) go through ctypes,
so there is no extra dependency.

Tested on Linux (tests/reliability/test_pipe.py): the name, the flags and the SDDL, the listener
interface, and the broker's protocol through `serve_connections` over a fake pipe (a Trio memory
stream pair), and the client's server check through a mock of the Win32 calls (MockWin32 in the
test). NOT tested on a real Windows machine: everything that calls Win32 here
(`serve_pipe`, `PipeStream`, `connect_pipe`, `BlockingPipe`) has never run.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from agent_bridge.ipc import peercred

log = logging.getLogger("agent_bridge.ipc")

PIPE_PREFIX = "\\\\.\\pipe\\"

# CreateNamedPipeW / CreateFileW flags (winbase.h, fileapi.h)
PIPE_ACCESS_DUPLEX = 0x00000003
FILE_FLAG_OVERLAPPED = 0x40000000
FILE_FLAG_FIRST_PIPE_INSTANCE = 0x00080000
PIPE_TYPE_BYTE = 0x00000000
PIPE_READMODE_BYTE = 0x00000000
PIPE_WAIT = 0x00000000
PIPE_REJECT_REMOTE_CLIENTS = 0x00000008
PIPE_UNLIMITED_INSTANCES = 255
GENERIC_READ = 0x80000000
GENERIC_WRITE = 0x40000000
OPEN_EXISTING = 3
SECURITY_SQOS_PRESENT = 0x00100000
SECURITY_IDENTIFICATION = 0x00010000
SDDL_REVISION_1 = 1
TOKEN_QUERY = 0x0008
TOKEN_USER_CLASS = 1  # TOKEN_INFORMATION_CLASS.TokenUser
PROCESS_QUERY_LIMITED_INFORMATION = 0x1000

ERROR_FILE_NOT_FOUND = 2
ERROR_BROKEN_PIPE = 109
ERROR_PIPE_BUSY = 231
ERROR_PIPE_CONNECTED = 535
ERROR_IO_PENDING = 997

BUFFER_SIZE = 1 << 16  # per direction, per instance: a frame larger than this just takes several writes
BUSY_WAIT_MS = 200  # a client finding every instance busy waits this long per try for a free one
RECEIVE_CHUNK = 1 << 16

Handler = Callable[[trio.abc.Stream], Awaitable[None]]


# --- what can be checked anywhere -------------------------------------------------------------


def is_pipe_name(address: str) -> bool:
    return (
        address.startswith(PIPE_PREFIX)
        and len(address) > len(PIPE_PREFIX)
        and "\\" not in address[len(PIPE_PREFIX) :]
    )


def security_sddl(user_sid: str) -> str:
    """A protected DACL (no inherited entries): network logons denied, this user allowed all."""
    if not user_sid.startswith("S-1-") or any(c in user_sid for c in "();:"):
        raise ValueError(f"not a SID string: {user_sid!r}")
    return f"D:P(D;;GA;;;NU)(A;;GA;;;{user_sid})"


def pipe_open_mode(*, first: bool) -> int:
    return PIPE_ACCESS_DUPLEX | FILE_FLAG_OVERLAPPED | (FILE_FLAG_FIRST_PIPE_INSTANCE if first else 0)


def pipe_mode() -> int:
    return PIPE_TYPE_BYTE | PIPE_READMODE_BYTE | PIPE_WAIT | PIPE_REJECT_REMOTE_CLIENTS


def client_flags() -> int:
    return FILE_FLAG_OVERLAPPED | SECURITY_SQOS_PRESENT | SECURITY_IDENTIFICATION


async def serve_connections(
    nursery: trio.Nursery, accept: Callable[[], Awaitable[trio.abc.Stream]], handler: Handler
) -> None:
    """Accept forever; run each connection's handler in its own task in `nursery`, its stream
    closed afterwards whatever happens. A failing handler is logged, never takes this down."""
    while True:
        stream = await accept()
        nursery.start_soon(_guarded, handler, stream)


async def _guarded(handler: Handler, stream: trio.abc.Stream) -> None:
    try:
        await handler(stream)
    except Exception:  # a bad client never takes the listener down
        log.exception("connection handler failed")
    finally:
        await trio.aclose_forcefully(stream)


# --- Win32 through ctypes (Windows only) ------------------------------------------------------


def _win32() -> Any:
    if sys.platform != "win32":
        raise OSError("named pipes are the Windows transport; this platform uses the Unix socket")
    return _Win32.get()


class _Win32:
    _instance: _Win32 | None = None

    @classmethod
    def get(cls) -> _Win32:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self) -> None:
        import ctypes
        from ctypes import wintypes as w

        self.ctypes: Any = ctypes  # its Windows-only parts are not in the typeshed of other platforms
        self.w = w
        k = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        a = ctypes.WinDLL("advapi32", use_last_error=True)  # type: ignore[attr-defined]

        class SECURITY_ATTRIBUTES(ctypes.Structure):  # noqa: N801 - the Win32 name
            _fields_ = [("nLength", w.DWORD), ("lpSecurityDescriptor", w.LPVOID), ("bInheritHandle", w.BOOL)]

        class OVERLAPPED(ctypes.Structure):
            _fields_ = [
                ("Internal", ctypes.c_size_t),
                ("InternalHigh", ctypes.c_size_t),
                ("Offset", w.DWORD),
                ("OffsetHigh", w.DWORD),
                ("hEvent", w.HANDLE),
            ]

        self.SECURITY_ATTRIBUTES = SECURITY_ATTRIBUTES
        self.OVERLAPPED = OVERLAPPED
        k.CreateNamedPipeW.argtypes = [
            w.LPCWSTR,
            w.DWORD,
            w.DWORD,
            w.DWORD,
            w.DWORD,
            w.DWORD,
            w.DWORD,
            w.LPVOID,
        ]
        k.CreateNamedPipeW.restype = w.HANDLE
        k.ConnectNamedPipe.argtypes = [w.HANDLE, w.LPVOID]
        k.ConnectNamedPipe.restype = w.BOOL
        k.CreateFileW.argtypes = [w.LPCWSTR, w.DWORD, w.DWORD, w.LPVOID, w.DWORD, w.DWORD, w.HANDLE]
        k.CreateFileW.restype = w.HANDLE
        k.WaitNamedPipeW.argtypes = [w.LPCWSTR, w.DWORD]
        k.WaitNamedPipeW.restype = w.BOOL
        k.CloseHandle.argtypes = [w.HANDLE]
        k.CloseHandle.restype = w.BOOL
        k.GetCurrentProcess.restype = w.HANDLE
        k.GetNamedPipeServerProcessId.argtypes = [w.HANDLE, ctypes.POINTER(w.ULONG)]
        k.GetNamedPipeServerProcessId.restype = w.BOOL
        k.OpenProcess.argtypes = [w.DWORD, w.BOOL, w.DWORD]
        k.OpenProcess.restype = w.HANDLE
        k.LocalFree.argtypes = [w.LPVOID]
        k.LocalFree.restype = w.LPVOID
        a.OpenProcessToken.argtypes = [w.HANDLE, w.DWORD, ctypes.POINTER(w.HANDLE)]
        a.OpenProcessToken.restype = w.BOOL
        a.GetTokenInformation.argtypes = [w.HANDLE, ctypes.c_int, w.LPVOID, w.DWORD, ctypes.POINTER(w.DWORD)]
        a.GetTokenInformation.restype = w.BOOL
        a.ConvertSidToStringSidW.argtypes = [w.LPVOID, ctypes.POINTER(w.LPWSTR)]
        a.ConvertSidToStringSidW.restype = w.BOOL
        a.ConvertStringSecurityDescriptorToSecurityDescriptorW.argtypes = [
            w.LPCWSTR, w.DWORD, ctypes.POINTER(w.LPVOID), ctypes.POINTER(w.ULONG)
        ]
        a.ConvertStringSecurityDescriptorToSecurityDescriptorW.restype = w.BOOL
        self.kernel32 = k
        self.advapi32 = a
        self.INVALID_HANDLE_VALUE = w.HANDLE(-1).value

    def error(self, what: str) -> OSError:
        code = self.ctypes.get_last_error()
        exc: OSError = self.ctypes.WinError(code)
        exc.strerror = f"{what}: {exc.strerror}"
        return exc

    def user_sid(self) -> str:
        return self.process_sid(self.kernel32.GetCurrentProcess())

    def server_sid(self, pipe: int) -> str:
        """The SID of the user running the server of the connected client end `pipe`."""
        ctypes, w = self.ctypes, self.w
        pid = w.ULONG()
        if not self.kernel32.GetNamedPipeServerProcessId(pipe, ctypes.byref(pid)):
            raise self.error("GetNamedPipeServerProcessId")
        process = self.kernel32.OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, False, pid.value)
        if not process:
            raise self.error(f"OpenProcess({pid.value})")
        try:
            return self.process_sid(process)
        finally:
            self.kernel32.CloseHandle(process)

    def process_sid(self, process: Any) -> str:
        ctypes, w = self.ctypes, self.w
        token = w.HANDLE()
        if not self.advapi32.OpenProcessToken(process, TOKEN_QUERY, ctypes.byref(token)):
            raise self.error("OpenProcessToken")
        try:
            size = w.DWORD()
            self.advapi32.GetTokenInformation(token, TOKEN_USER_CLASS, None, 0, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            if not self.advapi32.GetTokenInformation(token, TOKEN_USER_CLASS, buf, size, ctypes.byref(size)):
                raise self.error("GetTokenInformation")
            psid = ctypes.cast(buf, ctypes.POINTER(w.LPVOID))[0]  # TOKEN_USER.User.Sid
            text = w.LPWSTR()
            if not self.advapi32.ConvertSidToStringSidW(psid, ctypes.byref(text)):
                raise self.error("ConvertSidToStringSidW")
            try:
                return str(text.value)
            finally:
                self.kernel32.LocalFree(text)
        finally:
            self.kernel32.CloseHandle(token)

    def security_attributes(self) -> tuple[Any, Any]:
        """(SECURITY_ATTRIBUTES, the descriptor to LocalFree once no instance is created any more)."""
        ctypes, w = self.ctypes, self.w
        descriptor = w.LPVOID()
        if not self.advapi32.ConvertStringSecurityDescriptorToSecurityDescriptorW(
            security_sddl(self.user_sid()), SDDL_REVISION_1, ctypes.byref(descriptor), None
        ):
            raise self.error("ConvertStringSecurityDescriptorToSecurityDescriptorW")
        attributes = self.SECURITY_ATTRIBUTES(ctypes.sizeof(self.SECURITY_ATTRIBUTES), descriptor, False)
        return attributes, descriptor

    def create_instance(self, name: str, attributes: Any, *, first: bool) -> int:
        handle = self.kernel32.CreateNamedPipeW(
            name, pipe_open_mode(first=first), pipe_mode(), PIPE_UNLIMITED_INSTANCES,
            BUFFER_SIZE, BUFFER_SIZE, 0, self.ctypes.byref(attributes),
        )
        if handle is None or handle == self.INVALID_HANDLE_VALUE:
            if first:
                raise self.error(f"cannot create {name} (is another process holding it?)")
            raise self.error(f"cannot create another instance of {name}")
        return int(handle)

    def close(self, handle: int) -> None:
        self.kernel32.CloseHandle(handle)


# --- the listener -----------------------------------------------------------------------------


class PipeStream(trio.abc.Stream):
    """One connected pipe handle (opened for overlapped I/O and registered with Trio's IOCP) as
    a Trio stream. One reader and one writer at a time (FramedStream guarantees it)."""

    def __init__(self, handle: int) -> None:
        self._handle = handle
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this pipe is closed")
        view = memoryview(data)
        while view:
            try:
                written = await trio.lowlevel.write_overlapped(self._handle, view)  # type: ignore[attr-defined]
            except BrokenPipeError:
                raise trio.BrokenResourceError("the other end closed the pipe") from None
            view = view[written:]

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("this pipe is closed")
        buffer = bytearray(max_bytes or RECEIVE_CHUNK)
        try:
            size = await trio.lowlevel.readinto_overlapped(self._handle, buffer)  # type: ignore[attr-defined]
        except BrokenPipeError:
            return b""  # the other end closed: end of stream
        return bytes(buffer[:size])

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            _win32().close(self._handle)  # a pending read or write ends with ClosedResourceError
        await trio.lowlevel.checkpoint()


async def serve_pipe(
    name: str,
    handler: Handler,
    *,
    state_folder: Path | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Create the pipe (its first instance binds the name), report the name as started, then
    serve each client in its own task. Windows only. `state_folder`: unused (a pipe has no
    folder; the parameter keeps serve_unix's interface)."""
    if not is_pipe_name(name):
        raise ValueError(f"not a named pipe: {name!r}")
    win = _win32()
    attributes, descriptor = win.security_attributes()
    try:
        waiting = win.create_instance(name, attributes, first=True)
        trio.lowlevel.register_with_iocp(waiting)  # type: ignore[attr-defined]

        async def accept() -> trio.abc.Stream:
            nonlocal waiting
            handle = waiting
            await _connect_instance(win, handle)
            # the next client gets a fresh instance right away
            waiting = win.create_instance(name, attributes, first=False)
            trio.lowlevel.register_with_iocp(waiting)  # type: ignore[attr-defined]
            return PipeStream(handle)

        try:
            async with trio.open_nursery() as nursery:
                task_status.started(name)
                await serve_connections(nursery, accept, handler)
        finally:
            win.close(waiting)
    finally:
        win.kernel32.LocalFree(descriptor)


async def _connect_instance(win: _Win32, handle: int) -> None:
    """Wait for a client to open this instance (overlapped ConnectNamedPipe)."""
    overlapped = win.OVERLAPPED()
    if win.kernel32.ConnectNamedPipe(handle, win.ctypes.byref(overlapped)):
        return
    code = win.ctypes.get_last_error()
    if code == ERROR_PIPE_CONNECTED:
        return  # a client connected between CreateNamedPipeW and here
    if code != ERROR_IO_PENDING:
        raise win.error("ConnectNamedPipe")
    await trio.lowlevel.wait_overlapped(handle, win.ctypes.addressof(overlapped))  # type: ignore[attr-defined]


# --- clients ----------------------------------------------------------------------------------


def _open_client(win: _Win32, name: str, flags: int) -> int | None:
    """The client end of `name`, or None while every instance is busy."""
    handle = win.kernel32.CreateFileW(name, GENERIC_READ | GENERIC_WRITE, 0, None, OPEN_EXISTING, flags, None)
    if handle is not None and handle != win.INVALID_HANDLE_VALUE:
        check_server(win, int(handle), name)
        return int(handle)
    code = win.ctypes.get_last_error()
    if code == ERROR_PIPE_BUSY:
        return None
    if code == ERROR_FILE_NOT_FOUND:
        raise FileNotFoundError(f"no broker pipe {name}")
    raise win.error(f"cannot open {name}")


def check_server(win: _Win32, handle: int, name: str) -> None:
    """The pipe's server runs as this user, or the handle is closed and NotOurBroker raised,
    before a byte is sent: the Windows side of `ipc.peercred.check_server` (another account that
    created the name first, or a squatter, is not the broker)."""
    try:
        theirs, mine = win.server_sid(handle), win.user_sid()
    except OSError:
        win.close(handle)
        raise
    if theirs != mine:
        win.close(handle)
        raise peercred.NotOurBroker(f"{name} is served by {theirs}, not by you ({mine}): not your broker; "
                                    "refusing to talk to it")


async def connect_pipe(name: str, *, timeout: float = 10.0) -> PipeStream:  # noqa: ASYNC109
    """Open the broker's pipe for overlapped I/O (the MCP server's connection)."""
    win = _win32()
    with trio.fail_after(timeout):
        while True:
            handle = _open_client(win, name, client_flags())
            if handle is not None:
                trio.lowlevel.register_with_iocp(handle)  # type: ignore[attr-defined]
                return PipeStream(handle)
            await trio.to_thread.run_sync(win.kernel32.WaitNamedPipeW, name, BUSY_WAIT_MS)


class BlockingPipe:
    """The broker's pipe for the blocking client (hooks, CLI), with the `sendall` / `recv` /
    `settimeout` a socket has. A read that times out leaves its thread behind: these are
    short-lived processes, which exit right after."""

    def __init__(self, name: str, timeout: float) -> None:
        win = _win32()
        deadline = time.monotonic() + timeout
        while True:
            handle = _open_client(win, name, SECURITY_SQOS_PRESENT | SECURITY_IDENTIFICATION)
            if handle is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"every instance of {name} stayed busy")
            win.kernel32.WaitNamedPipeW(name, BUSY_WAIT_MS)
        import msvcrt  # Windows only

        fd = msvcrt.open_osfhandle(handle, 0)  # type: ignore[attr-defined]
        self._file = open(fd, "r+b", buffering=0)  # noqa: SIM115 - closed by close()
        self._timeout = timeout
        self._stuck: threading.Thread | None = None  # a read that timed out and still blocks

    def settimeout(self, timeout: float) -> None:
        self._timeout = timeout

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._file.write(view) or 0 :]

    def recv(self, size: int) -> bytes:
        result: list[bytes | BaseException] = []

        def read() -> None:
            try:
                result.append(self._file.read(size) or b"")
            except BrokenPipeError:
                result.append(b"")
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                result.append(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self._timeout)
        if not result:
            self._stuck = reader
            raise TimeoutError("the broker did not answer in time")
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def close(self) -> None:
        if self._stuck is not None and self._stuck.is_alive():
            return  # closing under a blocked synchronous read can block too; the process exits soon
        self._file.close()

    def __enter__(self) -> BlockingPipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""An APSW VFS over the platform's own ("unix") that fails writes on demand: SQLITE_IOERR
(an I/O error) or SQLITE_FULL (a full disk), optionally only after a number of writes still
succeed, so a transaction can die half-way through writing its WAL frames."""

from __future__ import annotations

import threading

import apsw

BASE = "unix"


class FaultyVFS(apsw.VFS):
    def __init__(self, name: str = "faulty", *, makedefault: bool = False) -> None:
        self.name = name
        self._lock = threading.Lock()  # the store's worker thread writes, the test thread arms
        self._mode: str | None = None
        self._grace = 0
        self.failed = 0  # writes refused so far
        self.writes = 0  # writes let through so far
        super().__init__(name, BASE, makedefault=makedefault)

    def arm(self, mode: str, *, after_writes: int = 0) -> None:
        """Fail every write ("ioerr" or "full") once `after_writes` more writes have succeeded."""
        assert mode in ("ioerr", "full")
        with self._lock:
            self._mode, self._grace = mode, after_writes

    def clear(self) -> None:
        with self._lock:
            self._mode = None

    def check_write(self) -> None:
        with self._lock:
            if self._mode is None:
                self.writes += 1
                return
            if self._grace > 0:
                self._grace -= 1
                self.writes += 1
                return
            self.failed += 1
            mode = self._mode
        if mode == "ioerr":
            raise apsw.IOError("injected I/O error")
        raise apsw.FullError("injected: disk full")

    def xOpen(self, name, flags):  # noqa: N802 - the VFS method name
        return FaultyFile(self, name, flags)


class FaultyFile(apsw.VFSFile):
    def __init__(self, vfs: FaultyVFS, name, flags) -> None:
        self._vfs = vfs
        super().__init__(BASE, name, flags)

    def xWrite(self, data, offset):  # noqa: N802
        self._vfs.check_write()
        return super().xWrite(data, offset)

    def xTruncate(self, newsize):  # noqa: N802
        self._vfs.check_write()
        return super().xTruncate(newsize)

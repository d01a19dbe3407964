"""This machine's NKEY identity (SPEC §10): a user seed in a 0600 file, and its public key.

The seed is the machine's only credential with the hub. It is created on first use
(`nkeys.encode_seed(os.urandom(32), PREFIX_BYTE_USER)`) and written atomically with mode 0600 from the
first byte (paths.write_private). A seed file readable or writable by anyone but its owner is refused,
not repaired: someone else may have read it already, and the fix (a new seed, the hub told the new key)
is the owner's to make.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from agent_bridge.federation import keys
from agent_bridge.federation.errors import IdentityError, require

SEED_MODE = 0o600
SEED_MAX = 256  # an NKEY seed is 58 characters; anything much longer is not one


@dataclass(frozen=True)
class Identity:
    seed_path: Path
    public_key: str  # "U…"
    created: bool  # made by this call

    def seed(self) -> str:
        """The seed itself, read again on demand (kept out of the record and its repr)."""
        return read_seed(self.seed_path)


def public_key_of(seed: str) -> str:
    nkeys = require("nkeys")
    try:
        key_pair = nkeys.from_seed(bytearray(seed.encode()))
        public = key_pair.public_key
    except Exception:  # nkeys raises its own ErrInvalidSeed and friends, and binascii errors
        raise IdentityError("not an NKEY seed") from None
    text = public.decode() if isinstance(public, bytes | bytearray) else str(public)
    if not text.startswith("U"):
        raise IdentityError(
            f"an NKEY seed of the wrong kind (public key {text[:1]}…; a machine needs a "
            "user seed, starting SU)"
        )
    return text


def new_seed() -> str:
    nkeys = require("nkeys")
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode() if isinstance(seed, bytes | bytearray) else str(seed)


def check_mode(path: Path) -> None:
    """IdentityError unless `path` is a regular file of ours that only we can read and write."""
    try:
        st = path.stat()
    except OSError as exc:
        raise IdentityError(f"{path}: cannot read the machine's seed: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise IdentityError(f"{path}: the machine's seed is not a regular file")
    if sys.platform == "win32":
        return
    if st.st_uid != os.geteuid():
        raise IdentityError(f"{path}: the machine's seed belongs to uid {st.st_uid}, not to you; refusing it")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise IdentityError(
            f"{path}: the machine's seed has mode {mode:04o}, expected 0600 (only you may read it); "
            "refusing it. Someone may have read it: make a new one (move this one aside, run "
            "`agent-bridge machine`) and give the hub the new public key"
        )


def read_seed(path: Path) -> str:
    check_mode(path)
    try:
        with open(path, encoding="ascii") as f:
            seed = f.read(SEED_MAX + 1).strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not ASCII"
        raise IdentityError(f"{path}: cannot read the machine's seed: {reason}") from None
    if len(seed) > SEED_MAX or not seed.startswith("SU"):
        raise IdentityError(f"{path}: not an NKEY user seed (one line starting SU)")
    if not keys.is_user_seed(seed):
        raise IdentityError(f"{path}: not an NKEY seed (its checksum does not hold)")
    return seed


def load(path: Path) -> Identity:
    """The identity in `path`; IdentityError (one line) when it is missing, loose or not a user seed."""
    seed = read_seed(path)
    try:
        return Identity(path, public_key_of(seed), created=False)
    except IdentityError as exc:
        raise IdentityError(f"{path}: {exc}") from None


def ensure(path: Path) -> Identity:
    """The identity in `path`, creating the seed when there is none yet: written whole to a private
    temporary file (0600 from its first byte, fsynced), then linked into place, which fails if another
    first run got there first (that one's seed is kept)."""
    if path.exists():
        return load(path)
    seed = new_seed()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SEED_MODE)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(seed + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        return load(path)
    except OSError as exc:
        raise IdentityError(f"{path}: cannot create the machine's seed: {exc.strerror}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return Identity(path, public_key_of(seed), created=True)

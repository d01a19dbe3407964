"""NKEY strings checked without the nkeys package: hub-config validates public keys with the standard
library alone, and a seed's checksum is verified before nkeys sees it (nkeys.from_seed does not check it).

An NKEY is base32 (no padding) of: prefix byte(s), a 32-byte key, a CRC-16/XMODEM of the rest, little
endian. A user public key is "U" + 55 characters (prefix 20 << 3); a user seed "SU" + 56.
"""

from __future__ import annotations

import base64
import binascii

PREFIX_BYTE_USER = 20 << 3  # "U"
PREFIX_BYTE_SEED = 18 << 3  # "S"
PUBKEY_LEN = 56
SEED_LEN = 58


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM (polynomial 0x1021, start 0), as NKEYs use it."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _decode(text: str) -> bytes | None:
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        return None
    if len(raw) < 3 or crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little"):
        return None
    return raw


def is_user_public_key(key: str) -> bool:
    """An NKEY user public key whose checksum holds."""
    if len(key) != PUBKEY_LEN or not key.startswith("U"):
        return False
    raw = _decode(key)
    return raw is not None and len(raw) == 35 and raw[0] == PREFIX_BYTE_USER


def is_user_seed(seed: str) -> bool:
    """An NKEY user seed ("SU…") whose checksum holds."""
    if len(seed) != SEED_LEN or not seed.startswith("SU"):
        return False
    raw = _decode(seed)
    # two prefix bytes: 5 bits of "seed", then 5 bits of the key's kind ("user")
    return (
        raw is not None
        and len(raw) == 36
        and raw[0] & 0xF8 == PREFIX_BYTE_SEED
        and (((raw[0] & 0x07) << 5) | ((raw[1] & 0xF8) >> 3)) == PREFIX_BYTE_USER
    )

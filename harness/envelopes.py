"""The wire envelope as the tests open and forge it, written from docs/wire-format.md (magic, version,
flags and header length; the JSON header; the body; BLAKE2b-128 of all before it) rather than with
eden_serve.wire's own code, so that a test checks the format and not the code against itself."""

from __future__ import annotations

import hashlib
import json
import struct

PREFIX = struct.Struct("<8sHHI")
MAGIC = b"EDENWIRE"
DIGEST_BYTES = 16


def split(payload: bytes, *, version: int) -> tuple[dict, bytes]:
    """The header and the body of a sealed payload of ``version``, its prefix and digest checked."""
    magic, found, flags, header_len = PREFIX.unpack_from(payload)
    assert (magic, found, flags) == (MAGIC, version, 0)
    assert hashlib.blake2b(payload[:-DIGEST_BYTES], digest_size=DIGEST_BYTES).digest() == payload[-DIGEST_BYTES:]
    start = PREFIX.size
    return json.loads(payload[start : start + header_len]), payload[start + header_len : -DIGEST_BYTES]


def reframe(header: dict | bytes, body: bytes, *, version: int, flags: int = 0) -> bytes:
    """A payload sealed around ``header`` (a dict, or bytes taken as they are) and ``body``."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    out = PREFIX.pack(MAGIC, version, flags, len(head)) + head + body
    return out + hashlib.blake2b(out, digest_size=DIGEST_BYTES).digest()

"""The keyed digest: an HMAC that proves a payload was made by a cloud holding the edge's key.

The envelope's BLAKE2b digest catches corruption, but anyone can recompute it. With a key shared by
cloud and edge, the cloud puts a tag in front of the payload (any format version) and the edge
refuses a payload whose tag it cannot recompute, before reading anything else of it::

    offset  size  field
    0       8     magic b"EDENHMAC"
    8       32    HMAC-SHA256 under the shared key of _DOMAIN + the payload
    40      P     the payload, as :func:`eden_serve.wire.encode` made it

An edge without a key reads tagged payloads without checking them, so keys can be rolled out cloud
first. A tag proves origin, not freshness: a recorded payload can be sent again (docs/tls.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import warnings
from pathlib import Path

from ..errors import BadInputError, UnauthenticPayloadError

TAG_MAGIC = b"EDENHMAC"
TAG_SIZE = 32
TAGGED_PREFIX = len(TAG_MAGIC) + TAG_SIZE
KEY_FILE_ENV = "EDEN_WIRE_KEY_FILE"
MIN_KEY_BYTES = 16
# A tag made for this purpose is never valid for another use of the same key.
_DOMAIN = b"eden-serve wire payload\x00"
_FIX = f"give cloud and edge the same key file ({KEY_FILE_ENV}, eden-serve serve --wire-key-file)"


def check_secret_file(path: str | Path, what: str) -> None:
    """Refuses a secret's file that other users may write (they could replace it), and warns (one
    line) about one they may read."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # reading it says why
    if mode & (stat.S_IWOTH | stat.S_IWGRP):
        raise BadInputError(f"{what} {str(path)!r} may be written by other users (mode {mode & 0o777:04o}); chmod 600 it")
    if mode & stat.S_IROTH:
        warnings.warn(f"{what} {str(path)!r} is readable by other users (mode {mode & 0o777:04o}); chmod 600 it")


def read_key(path: str | Path) -> bytes:
    """The key in the file ``path``: its bytes without surrounding whitespace, at least
    :data:`MIN_KEY_BYTES` of them (``openssl rand -hex 32`` makes a good one), in a file that no
    one else may write (:func:`check_secret_file`)."""
    check_secret_file(path, "the wire key file")
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise BadInputError(f"cannot read the wire key file {str(path)!r}: {exc.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise BadInputError(f"the wire key file {str(path)!r} holds {len(key)} bytes, fewer than {MIN_KEY_BYTES}; "
                            "make one with: openssl rand -hex 32")
    return key


def key_from_environment() -> bytes | None:
    """The key of the file that :data:`KEY_FILE_ENV` names, or None where it is unset."""
    path = os.environ.get(KEY_FILE_ENV)
    return read_key(path) if path else None


def _tag(payload: bytes | memoryview, key: bytes) -> bytes:
    mac = hmac.new(key, _DOMAIN, hashlib.sha256)
    mac.update(payload)
    return mac.digest()


def sign(payload: bytes, key: bytes) -> bytes:
    """``payload`` with its tag in front."""
    return b"".join((TAG_MAGIC, _tag(payload, key), payload))


def is_tagged(data: bytes | bytearray | memoryview) -> bool:
    return bytes(data[: len(TAG_MAGIC)]) == TAG_MAGIC


def verify(data: bytes | bytearray | memoryview, key: bytes | None) -> memoryview:
    """The payload inside ``data`` once its tag checks out under ``key``; with no key, a tag is
    dropped unchecked and an untagged payload passed on as it is."""
    view = memoryview(data).cast("B")
    if key is None:
        return view[TAGGED_PREFIX:] if is_tagged(view) and len(view) >= TAGGED_PREFIX else view
    if not is_tagged(view) or len(view) < TAGGED_PREFIX:
        raise UnauthenticPayloadError(f"payload carries no keyed tag, and this edge accepts only its cloud's; {_FIX}")
    payload = view[TAGGED_PREFIX:]
    if not hmac.compare_digest(_tag(payload, key), view[len(TAG_MAGIC) : TAGGED_PREFIX]):
        raise UnauthenticPayloadError(f"payload's keyed tag does not match: it was not made by this edge's cloud; {_FIX}")
    return payload

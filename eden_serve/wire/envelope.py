"""The envelope of a payload: prefix, JSON header, body, digest; and the checks of header fields.

Byte layout (integers little-endian)::

    offset   size  field
    0        8     magic b"EDENWIRE"
    8        2     format version, u16: 2 (condition tokens), 3 (the frames codec) or 4 (the
                   bitstream codec); 1 is refused
    10       2     flags, u16, reserved: must be 0
    12       4     header length H, u32, at most MAX_HEADER_BYTES
    16       H     header: a UTF-8 JSON object
    16+H     B     body: version 2 the tensors (``tensors.py``), one zstd frame when the codec ends in
                   "+zstd"; version 3 the frames (``pixels.py``); version 4 the packet table and
                   the video's own packets (``bitstream.py``)
    16+H+B   16    BLAKE2b-128 digest of every byte before it

The digest detects corruption; it is no signature, so authenticate the channel (TLS) against forgery.
"""

from __future__ import annotations

import hashlib
import json
import struct

from typing import NamedTuple

import numpy as np

from ..config import MAX_SEED, EdenConfig
from ..errors import ChunkTooLargeError, CodecError, ModelMismatchError, PayloadTooLargeError, UnsupportedVersionError

MAGIC = b"EDENWIRE"
# The version names the body's layout. A token codec's payload keeps version 2, which edges of
# earlier releases read; the frames codec's is version 3.
TOKENS_VERSION = 2
FRAMES_VERSION = 3
BITSTREAM_VERSION = 4
FORMAT_VERSION = BITSTREAM_VERSION  # the newest this release reads and writes
MAX_HEADER_BYTES = 64 * 1024
# Format-wide caps, so that a payload can never make a receiver allocate without bound; receivers
# lower them (:class:`Limits`). 8K UHD (4320x7680) is 129,600 tokens per frame.
MAX_TOKENS = 1 << 17
MAX_FRAMES = 1 << 10
MAX_SIDE = 1 << 16  # pixels per frame side
PREFIX = struct.Struct("<8sHHI")
DIGEST_SIZE = 16
_CLOUD_DIGEST_CHARS = 64  # SHA-256, hex
REENCODE = "re-encode it with eden_serve.wire.encode of the same eden-serve release"
_F32_MAX = float(np.finfo(np.float32).max)


def seal(header: dict, body_parts: list, version: int = TOKENS_VERSION) -> bytes:
    """The payload of ``header`` and the body written out from ``body_parts`` (bytes-like objects)."""
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    prefix = PREFIX.pack(MAGIC, version, 0, len(head))
    digest = hashlib.blake2b(prefix + head, digest_size=DIGEST_SIZE)
    for part in body_parts:
        digest.update(part)
    return b"".join((prefix, head, *body_parts, digest.digest()))


def open_envelope(data: memoryview) -> tuple[int, dict, memoryview]:
    """(version, header, body) of a payload, after the prefix, the version and the digest are checked."""
    total = len(data)
    if total < PREFIX.size + DIGEST_SIZE:
        raise CodecError(f"payload is only {total} bytes, too short for EDEN conditions; send the whole payload")
    magic, version, flags, header_len = PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(f"payload does not start with {MAGIC!r}, so it is not EDEN conditions; send the cloud encoder's output")
    if version not in (TOKENS_VERSION, FRAMES_VERSION, BITSTREAM_VERSION) or flags:
        what = f"wire format version {version}" if flags == 0 else f"flags {flags:#06x}"
        raise UnsupportedVersionError(
            f"payload uses {what}, but this edge reads only versions {TOKENS_VERSION}, {FRAMES_VERSION} and "
            f"{BITSTREAM_VERSION} without flags; run the same eden-serve release on cloud and edge"
        )
    body_start = PREFIX.size + header_len
    body_end = total - DIGEST_SIZE
    if header_len > MAX_HEADER_BYTES or body_start > body_end:
        raise CodecError(
            f"payload declares a {header_len}-byte header, which does not fit in its {total} bytes "
            f"(or exceeds {MAX_HEADER_BYTES}); it is truncated or corrupt, send it again"
        )
    if hashlib.blake2b(data[:body_end], digest_size=DIGEST_SIZE).digest() != data[body_end:]:
        raise CodecError("payload digest does not match its contents; it was truncated or corrupted in transit, send it again")
    return version, parse_json(data[PREFIX.size : body_start]), data[body_start:body_end]


def peek_header(data: bytes | bytearray | memoryview) -> dict | None:
    """A payload's header as it states it, nothing checked (neither the digest nor a field): for
    choosing an order only, before :func:`open_envelope` judges it. None where ``data`` does not
    start as a payload does."""
    view = memoryview(data).cast("B")
    if len(view) < PREFIX.size:
        return None
    magic, _, _, header_len = PREFIX.unpack_from(view)
    if magic != MAGIC or header_len > min(MAX_HEADER_BYTES, len(view) - PREFIX.size):
        return None
    try:
        return parse_json(view[PREFIX.size : PREFIX.size + header_len])
    except CodecError:
        return None


def parse_json(raw: memoryview) -> dict:
    def reject_constant(token: str) -> None:
        raise ValueError(f"{token} is not allowed")

    def unique_keys(pairs: list[tuple[str, object]]) -> dict:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            raise ValueError("duplicate key")
        return obj

    try:
        header = json.loads(bytes(raw).decode("utf-8"), parse_constant=reject_constant, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError) as exc:  # covers UnicodeDecodeError, JSONDecodeError and int digit limits
        raise CodecError(f"malformed payload: header is not valid JSON ({str(exc):.100}); {REENCODE}") from exc
    if not isinstance(header, dict):
        raise CodecError(f"malformed payload: header is a JSON {type(header).__name__}, not an object; {REENCODE}")
    return header


def invalid(name: str, problem: str, *, payload: bool = True) -> CodecError:
    if payload:
        return CodecError(f"malformed payload: header field {name} {problem}; {REENCODE}")
    return CodecError(f"chunk.{name} {problem}; encode the conditions the cloud encoder made for this config")


def integer(value: object, name: str, hi: int, *, lo: int = 0, payload: bool = True) -> int:
    # type() rather than isinstance(): JSON true/false must not pass as 1/0.
    if type(value) is not int or not lo <= value <= hi:
        raise invalid(name, f"must be an integer in [{lo}, {hi}], got {value!r:.40}", payload=payload)
    return value


def integer_pair(value: object, name: str, hi: int, *, payload: bool = True) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise invalid(name, f"must be a pair of integers, got {value!r:.40}", payload=payload)
    return tuple(integer(v, name, hi, lo=1, payload=payload) for v in value)


def float32(value: object, name: str) -> float:
    if type(value) is not float or not abs(value) <= _F32_MAX or float(np.float32(value)) != value:
        raise invalid(name, f"must be a finite float32 value, got {value!r:.40}")
    return value


def float32_list(value: object, name: str, length: int) -> list[float]:
    if not isinstance(value, list) or len(value) != length:
        raise invalid(name, f"must be a list of {length} float32 values, got {value!r:.60}")
    return [float32(v, name) for v in value]


def to_float32(value: object, name: str) -> float:
    """A finite number as its float32 value (the encoding side)."""
    number = float(value)
    if not abs(number) <= _F32_MAX:  # also false for NaN
        raise invalid(name, f"is {number}, not a finite float32", payload=False)
    return float(np.float32(number))


class Limits(NamedTuple):
    """A receiver's caps, on top of the format's own (``decode``'s ``max_*`` arguments; None: none)."""

    tokens: int | None = None  # per frame
    frames: int | None = None  # per chunk
    chunk_tokens: int | None = None  # all the chunk's frames together
    pixels: int | None = None  # per frame


def check_model(header: dict, config: EdenConfig) -> None:
    """The payload was made for a model of ``config``'s dimensions."""
    hidden_dim = integer(header["hidden_dim"], "hidden_dim", 1 << 20)
    fingerprint = header["fingerprint"]
    if not isinstance(fingerprint, str):
        raise invalid("fingerprint", f"must be a string, got {fingerprint!r:.40}")
    if hidden_dim != config.hidden_dim:
        raise ModelMismatchError(
            f"payload carries {hidden_dim}-dim tokens but this edge's model has hidden_dim {config.hidden_dim}; "
            "deploy matching weights (the same config) to cloud and edge"
        )
    if fingerprint != config.fingerprint():
        raise ModelMismatchError(
            f"payload was made by a model with fingerprint {fingerprint:.40} but this edge runs "
            f"{config.fingerprint()} ({config.name}); deploy matching weights to both sides"
        )


def check_limits(size: tuple[int, int], n: int, frames: int, limits: Limits) -> None:
    """Frames of ``size`` (``n`` tokens each, ``frames`` of them) within the receiver's limits: 413 otherwise."""
    where = f"{frames} frames of {size[1]}x{size[0]}"
    if limits.pixels is not None and size[0] * size[1] > limits.pixels:
        raise PayloadTooLargeError(
            f"payload carries {where}, over this edge's limit of {limits.pixels} pixels per frame; send smaller frames"
        )
    limit = MAX_TOKENS if limits.tokens is None else min(limits.tokens, MAX_TOKENS)
    if n > limit:
        raise PayloadTooLargeError(
            f"payload carries {where} of {n} tokens each, but this edge accepts at most {limit}; send smaller frames"
        )
    if limits.frames is not None and frames > limits.frames:
        raise ChunkTooLargeError(f"payload carries {where}, over this edge's {limits.frames} frames per chunk; send shorter chunks")
    if limits.chunk_tokens is not None and frames * n > limits.chunk_tokens:
        raise ChunkTooLargeError(
            f"payload carries {where}, {frames * n} tokens in all, over this edge's {limits.chunk_tokens} per chunk; "
            "send shorter chunks"
        )


def cut_pairs(value: object, pairs: int) -> list[int]:
    """The pairs across a scene cut: at most ``pairs`` pair numbers, increasing."""
    if not isinstance(value, list) or len(value) > pairs:
        raise invalid("cuts", f"must be a list of at most {pairs} pair numbers, got {value!r:.60}")
    cuts, last = [], -1
    for entry in value:
        last = integer(entry, "cuts", pairs - 1, lo=last + 1)
        cuts.append(last)
    return cuts


def cloud_digest(value: object, *, payload: bool = True) -> str:
    """The digest of the cloud weights that a payload's conditions are to be derived with."""
    if not isinstance(value, str) or len(value) != _CLOUD_DIGEST_CHARS or value.strip("0123456789abcdef"):
        raise invalid("cloud", f"must be the cloud weights' digest, {_CLOUD_DIGEST_CHARS} hex digits, got {value!r:.70}", payload=payload)
    return value


def seed_list(value: object, length: int) -> list[int]:
    """The noise seed of each of ``length`` pairs."""
    if not isinstance(value, list) or len(value) != length:
        raise invalid("seeds", f"must be a list of {length} integers, got {value!r:.60}")
    return [integer(s, "seeds", MAX_SEED) for s in value]

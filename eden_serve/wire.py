"""What crosses the wire between the cloud encoder and the edge DiT+decoder, and its byte format.

:class:`Conditions` is everything the edge needs besides its own weights. Positional embeddings and
padding are *not* here: the edge recomputes them from ``grid`` and ``size``.

Byte layout of a payload (integers little-endian)::

    offset   size  field
    0        8     magic b"EDENWIRE"
    8        2     format version, u16 (this module writes and reads version 1)
    10       2     flags, u16, reserved: must be 0
    12       4     header length H, u32, at most MAX_HEADER_BYTES
    16       H     header: a UTF-8 JSON object, described below
    16+H     B     body: a safetensors blob, zstd-compressed (one frame) when the codec ends in "+zstd"
    16+H+B   16    BLAKE2b-128 digest of every byte before it

The header has exactly these keys: ``fingerprint`` and ``hidden_dim`` (of the model that made the
payload), ``codec``, ``grid``, ``size``, ``seed``, ``mean``, ``std``, ``difference`` (float32 values,
stored exactly), ``raw_size`` (byte length of the uncompressed safetensors blob) and ``tensors``
(``{name: {"dtype", "shape"}}``, the safetensors names and dtypes the codec implies; the byte offsets
live in the safetensors blob's own header, which safetensors checks against the blob).

Codecs (``CODECS``; each also exists with a lossless ``+zstd`` suffix):

* ``fp32``: exact. ``fp16`` / ``bf16``: plain round-to-nearest casts. fp16 keeps 11 significant
  bits but overflows above 65504; LayerNorm outputs with sane weights stay far below that, and
  :func:`encode` refuses rather than send infinities. bf16 keeps fp32's range with 8 bits.
* ``int8``: symmetric per-channel quantisation, one float32 scale per [frame, channel] (tensor
  ``<name>.scale`` of shape [2, 1, D]); it fits LayerNorm outputs, whose spread is set per channel
  by the LN weight, and measures better than ``int8-token``: one float32 scale per [frame, token]
  (shape [2, N, 1]). Value = int8 * scale, so the error is at most scale / 2 = absmax / 254.

``DEFAULT_CODEC`` is ``bf16+zstd``: 2.56x smaller than fp32 (15% smaller than fp16+zstd: bf16's
high byte is nearly all exponent, which zstd squeezes), a relative error of at most 2**-8 whatever
the token distribution, and no overflow. int8's error depends on outliers, so it is opt-in for thin links;
``python -m eden_serve.bench_wire`` prints the measurements behind this choice.

:func:`decode` never unpickles and checks, in order: prefix, magic, version, header length against
the data, the digest, the header's types and ranges, model fingerprint and width, grid against size,
the token count against the limits, the body size against what the header implies, and only then
decompresses (bounded by the validated size) and parses the tensors. It only raises
:class:`CodecError` (or its subclasses). The digest detects corruption; it is no signature, so
authenticate the channel itself (TLS) against forgery.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import safetensors.torch
import torch
import zstandard

from .config import MAX_SEED, EdenConfig
from .errors import BadInputError, CodecError, ModelMismatchError, PayloadTooLargeError, UnsupportedVersionError


@dataclass
class Conditions:
    cond_dit: torch.Tensor  # [2, N, D] float32, frame 0 first; N = grid[0] * grid[1]
    cond_dec: torch.Tensor  # [2, N, D] float32
    mean: float  # the pair's averaged normalisation statistics (float32 values)
    std: float
    difference: float  # standardised frame-difference scalar (float32 value)
    grid: tuple[int, int]  # (ph, pw): patch grid of the padded frames
    size: tuple[int, int]  # (height, width) of the original frames
    seed: int = 0  # noise seed of the edge sampler


MAGIC = b"EDENWIRE"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
# Format-wide cap on tokens per frame, so a payload can never make a receiver allocate without
# bound; 8K UHD (4320x7680) is 129,600 tokens. Receivers lower it with decode(max_tokens=...).
MAX_TOKENS = 1 << 17
MAX_SIDE = 1 << 16  # pixels per frame side

_PREFIX = struct.Struct("<8sHHI")
_DIGEST_SIZE = 16
_F32_MAX = float(np.finfo(np.float32).max)
_ST_HEADER_MAX = 4096  # safetensors' own header for our <= 4 tensors is ~300 bytes
_TENSORS = ("cond_dit", "cond_dec")
_SCALARS = ("mean", "std", "difference")
_FLOATS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_INT8_REDUCE = {"int8": 1, "int8-token": -1}  # the axis one scale spans: tokens, resp. channels
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8"}
_ZSTD_LEVEL = 3  # higher levels cost several times the CPU for under 1% smaller float payloads
_HEADER_KEYS = {"fingerprint", "hidden_dim", "codec", "grid", "size", "seed", *_SCALARS, "raw_size", "tensors"}
_REENCODE = "re-encode it with eden_serve.wire.encode of the same eden-serve release"

CODECS: tuple[str, ...] = tuple(e + z for z in ("", "+zstd") for e in (*_FLOATS, *_INT8_REDUCE))
DEFAULT_CODEC = "bf16+zstd"


class Codec(NamedTuple):
    encoding: str  # fp32 | fp16 | bf16 | int8 | int8-token
    zstd: bool

    @property
    def name(self) -> str:
        return self.encoding + ("+zstd" if self.zstd else "")


def parse_codec(name: str) -> Codec:
    if not isinstance(name, str) or name not in CODECS:
        raise BadInputError(f"unknown codec {name!r:.60}; choose one of {', '.join(CODECS)}")
    encoding, suffix, _ = name.partition("+")
    return Codec(encoding, bool(suffix))


def encode(cond: Conditions, config: EdenConfig, codec: str = DEFAULT_CODEC) -> bytes:
    """Serialise ``cond`` for a receiver running a model with the same ``config``."""
    spec = parse_codec(codec)
    size = _pair(cond.size, "size", payload=False)
    grid = _pair(cond.grid, "grid", payload=False)
    n = _tokens(grid, size, config)
    if n > MAX_TOKENS:
        raise CodecError(f"{size[0]}x{size[1]} frames give {n} tokens, over the wire limit of {MAX_TOKENS}; downscale them")
    seed = _int(cond.seed, "seed", MAX_SEED, payload=False)
    scalars = {}
    for key in _SCALARS:
        value = float(getattr(cond, key))
        if not abs(value) <= _F32_MAX:  # also false for NaN
            raise _invalid(key, f"is {value}, not a finite float32", payload=False)
        scalars[key] = float(np.float32(value))
    shape = (2, n, config.hidden_dim)
    tensors = {}
    for name in _TENSORS:
        x = getattr(cond, name)
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or tuple(x.shape) != shape:
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise _invalid(name, f"must be a float tensor of shape {shape} for grid {grid}, got {got}", payload=False)
        x = x.detach().to("cpu", torch.float32).contiguous()
        if not _finite(x):
            raise _invalid(name, "contains NaN or infinity", payload=False)
        tensors.update(_pack(name, x, spec.encoding))
    blob = safetensors.torch.save(tensors)
    header = {
        "fingerprint": config.fingerprint(),
        "hidden_dim": config.hidden_dim,
        "codec": spec.name,
        "grid": list(grid),
        "size": list(size),
        "seed": seed,
        **scalars,
        "raw_size": len(blob),
        "tensors": _describe(_layout(spec.encoding, n, config.hidden_dim)),
    }
    body = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(blob) if spec.zstd else blob
    return _frame(header, body)


def decode(data: bytes, config: EdenConfig, *, max_tokens: int | None = None) -> Conditions:
    """Parse and validate a payload for a receiver running ``config``.

    ``max_tokens`` caps N = grid[0] * grid[1] (on top of :data:`MAX_TOKENS`); it is checked before
    anything proportional to the payload's declared size is allocated.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"payload must be bytes, got {type(data).__name__}; pass the raw request body")
    data = bytes(data)
    total = len(data)
    if total < _PREFIX.size + _DIGEST_SIZE:
        raise CodecError(f"payload is only {total} bytes, too short for EDEN conditions; send the whole payload")
    magic, version, flags, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(f"payload does not start with {MAGIC!r}, so it is not EDEN conditions; send the cloud encoder's output")
    if version != FORMAT_VERSION or flags:
        what = f"wire format version {version}" if version != FORMAT_VERSION else f"flags {flags:#06x}"
        raise UnsupportedVersionError(
            f"payload uses {what}, but this edge reads only version {FORMAT_VERSION} without flags; "
            "run the same eden-serve release on cloud and edge"
        )
    body_start = _PREFIX.size + header_len
    body_end = total - _DIGEST_SIZE
    if header_len > MAX_HEADER_BYTES or body_start > body_end:
        raise CodecError(
            f"payload declares a {header_len}-byte header, which does not fit in its {total} bytes "
            f"(or exceeds {MAX_HEADER_BYTES}); it is truncated or corrupt, send it again"
        )
    if hashlib.blake2b(memoryview(data)[:body_end], digest_size=_DIGEST_SIZE).digest() != data[body_end:]:
        raise CodecError("payload digest does not match its contents; it was truncated or corrupted in transit, send it again")
    header = _parse_json(data[_PREFIX.size : body_start])

    hidden_dim = _int(header["hidden_dim"], "hidden_dim", 1 << 20)
    fingerprint = header["fingerprint"]
    if not isinstance(fingerprint, str):
        raise _invalid("fingerprint", f"must be a string, got {fingerprint!r:.40}")
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
    codec = header["codec"]
    if codec not in CODECS:
        raise _invalid("codec", f"is {codec!r:.40}, not one this edge knows ({', '.join(CODECS)})")
    spec = parse_codec(codec)
    size = _pair(header["size"], "size")
    grid = _pair(header["grid"], "grid")
    n = _tokens(grid, size, config)
    limit = MAX_TOKENS if max_tokens is None else min(max_tokens, MAX_TOKENS)
    if n > limit:
        raise PayloadTooLargeError(
            f"payload carries {n} tokens ({size[0]}x{size[1]} frames) but this edge accepts at most {limit}; "
            "send smaller frames or raise the edge's pixel limit"
        )
    seed = _int(header["seed"], "seed", MAX_SEED)
    scalars = {key: _float32(header[key], key) for key in _SCALARS}

    layout = _layout(spec.encoding, n, config.hidden_dim)
    if not _same_description(header["tensors"], _describe(layout)):
        raise _invalid("tensors", f"does not list what codec {codec} makes for grid {grid}")
    data_bytes = sum(math.prod(shape) * dtype.itemsize for dtype, shape in layout.values())
    raw_size = _int(header["raw_size"], "raw_size", 2**63 - 1)
    if not data_bytes + 8 < raw_size <= data_bytes + 8 + _ST_HEADER_MAX:
        raise _invalid("raw_size", f"is {raw_size} bytes, but the tensors alone take {data_bytes}")
    blob = _unpack_body(data[body_start:body_end], spec.zstd, raw_size)
    try:
        tensors = safetensors.torch.load(blob)
    except Exception as exc:  # safetensors raises its own SafetensorError for any malformed blob
        raise CodecError(f"malformed payload: invalid safetensors body ({exc}); {_REENCODE}") from exc
    if tensors.keys() != layout.keys() or any(
        tensors[k].dtype != dtype or list(tensors[k].shape) != shape for k, (dtype, shape) in layout.items()
    ):
        raise CodecError(f"malformed payload: its tensors differ from its header (codec {codec}, grid {grid}); {_REENCODE}")
    return Conditions(
        cond_dit=_unpack("cond_dit", tensors, spec.encoding),
        cond_dec=_unpack("cond_dec", tensors, spec.encoding),
        grid=grid,
        size=size,
        seed=seed,
        **scalars,
    )


def _pack(name: str, x: torch.Tensor, encoding: str) -> dict[str, torch.Tensor]:
    if encoding in _FLOATS:
        y = x.to(_FLOATS[encoding])
        if not _finite(y):
            peak = x.abs().max().item()
            raise CodecError(f"conditions.{name} reaches {peak:.6g}, beyond the {encoding} range; use codec bf16 or fp32")
        return {name: y}
    scale = x.abs().amax(dim=_INT8_REDUCE[encoding], keepdim=True) / 127
    # An all-zero token/channel has scale 0: its values are 0, so store q = 0 rather than 0/0.
    q = torch.where(scale > 0, x / scale, 0.0).round_().clamp_(-127, 127).to(torch.int8)
    return {name: q, f"{name}.scale": scale}


def _unpack(name: str, tensors: dict[str, torch.Tensor], encoding: str) -> torch.Tensor:
    x = tensors[name].float()
    if encoding in _INT8_REDUCE:
        x = x * tensors[f"{name}.scale"]
    if not _finite(x):
        raise CodecError(f"payload {name} decodes to NaN or infinity; the sender's cloud encoder is broken, check its weights")
    return x


def _finite(x: torch.Tensor) -> bool:
    # min/max propagate NaN and are ~15x faster than isfinite(x).all(), which allocates a mask.
    lo, hi = torch.aminmax(x)
    return bool(torch.isfinite(lo) and torch.isfinite(hi))


def _layout(encoding: str, n: int, d: int) -> dict[str, tuple[torch.dtype, list[int]]]:
    """Name -> (dtype, shape) of every tensor in the body."""
    if encoding in _FLOATS:
        return {name: (_FLOATS[encoding], [2, n, d]) for name in _TENSORS}
    scale_shape = [2, 1, d] if _INT8_REDUCE[encoding] == 1 else [2, n, 1]
    layout = {}
    for name in _TENSORS:
        layout[name] = (torch.int8, [2, n, d])
        layout[f"{name}.scale"] = (torch.float32, scale_shape)
    return layout


def _describe(layout: dict[str, tuple[torch.dtype, list[int]]]) -> dict[str, dict]:
    return {name: {"dtype": _ST_DTYPES[dtype], "shape": shape} for name, (dtype, shape) in layout.items()}


def _same_description(got: object, expected: dict[str, dict]) -> bool:
    # Field by field with exact types, so true/1 or 2.0/2 do not pass for one another.
    if not isinstance(got, dict) or got.keys() != expected.keys():
        return False
    for name, want in expected.items():
        entry = got[name]
        if not isinstance(entry, dict) or entry.keys() != want.keys() or entry["dtype"] != want["dtype"]:
            return False
        shape = entry["shape"]
        if not isinstance(shape, list) or any(type(v) is not int for v in shape) or shape != want["shape"]:
            return False
    return True


def _unpack_body(body: bytes, compressed: bool, raw_size: int) -> bytes:
    if not compressed:
        if len(body) != raw_size:
            raise _invalid("raw_size", f"is {raw_size} bytes, but the body has {len(body)}")
        return body
    try:
        # zstd allocates what the frame declares, ignoring max_output_size, so check that first.
        declared = zstandard.get_frame_parameters(body).content_size
        if declared != raw_size:
            raise _invalid("raw_size", f"is {raw_size} bytes, but the zstd frame declares {declared}")
        blob = zstandard.ZstdDecompressor().decompress(body, max_output_size=raw_size, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise CodecError(f"malformed payload: invalid zstd body ({exc}); {_REENCODE}") from exc
    if len(blob) != raw_size:
        raise _invalid("raw_size", f"is {raw_size} bytes, but the body decompresses to {len(blob)}")
    return blob


def _frame(header: dict, body: bytes) -> bytes:
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(head))
    digest = hashlib.blake2b(prefix + head, digest_size=_DIGEST_SIZE)
    digest.update(body)
    return b"".join((prefix, head, body, digest.digest()))


def _parse_json(raw: bytes) -> dict:
    def reject_constant(token: str) -> None:
        raise ValueError(f"{token} is not allowed")

    def unique_keys(pairs: list[tuple[str, object]]) -> dict:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            raise ValueError("duplicate key")
        return obj

    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=reject_constant, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError) as exc:  # covers UnicodeDecodeError and JSONDecodeError
        raise CodecError(f"malformed payload: header is not valid JSON ({str(exc):.100}); {_REENCODE}") from exc
    if not isinstance(header, dict) or header.keys() != _HEADER_KEYS:
        found = sorted(header) if isinstance(header, dict) else type(header).__name__
        raise CodecError(f"malformed payload: header has {str(found):.200}, not the keys {sorted(_HEADER_KEYS)}; {_REENCODE}")
    return header


def _invalid(name: str, problem: str, *, payload: bool = True) -> CodecError:
    if payload:
        return CodecError(f"malformed payload: header field {name} {problem}; {_REENCODE}")
    return CodecError(f"conditions.{name} {problem}; encode the conditions the cloud encoder made for this config")


def _int(value: object, name: str, hi: int, *, lo: int = 0, payload: bool = True) -> int:
    # type() rather than isinstance(): JSON true/false must not pass as 1/0.
    if type(value) is not int or not lo <= value <= hi:
        raise _invalid(name, f"must be an integer in [{lo}, {hi}], got {value!r:.40}", payload=payload)
    return value


def _pair(value: object, name: str, *, payload: bool = True) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise _invalid(name, f"must be a pair of integers, got {value!r:.40}", payload=payload)
    return tuple(_int(v, name, MAX_SIDE, lo=1, payload=payload) for v in value)


def _float32(value: object, name: str) -> float:
    if type(value) is not float or not abs(value) <= _F32_MAX or float(np.float32(value)) != value:
        raise _invalid(name, f"must be a finite float32 value, got {value!r:.40}")
    return value


def _tokens(grid: tuple[int, int], size: tuple[int, int], config: EdenConfig) -> int:
    expected = config.patch_grid(*size)
    if grid != expected:
        raise CodecError(
            f"grid {grid} does not fit {size[0]}x{size[1]} frames, which pad to multiples of {config.pad_multiple} and "
            f"give {expected} with patch size {config.patch_size}; the sender's model config differs or its conditions are malformed"
        )
    return grid[0] * grid[1]

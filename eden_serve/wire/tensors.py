"""How a chunk's condition tokens become the body's bytes, and back.

Each of ``cond_dit`` and ``cond_dec`` is [F, N, D] on the cloud (F frames, N tokens, D channels).
The encodings:

* ``fp32``, ``fp16``, ``bf16``: the values in that format (round to nearest). fp16 overflows above
  65504, and :func:`pack` refuses rather than send infinities; bf16 keeps fp32's range with 8 bits.
* ``int8``: symmetric quantisation, one float32 scale per [frame, channel] ([F, 1, D]), which fits
  LayerNorm outputs; ``int8-token``: one per [frame, token] ([F, N, 1]). Value = q * scale, so the
  error is at most scale / 2 = absmax / 254. Scales are per frame, so a frame's values do not depend
  on which chunk carries it.

With ``+zstd`` (``delta``), each frame after the first is stored as its change from the frame before,
exactly: floats as the XOR of their bit patterns, split into byte planes per frame (all low bytes,
then all high bytes: a video's consecutive frames share most high bytes, which zstd then squeezes),
int8 as differences modulo 256. docs/wire-format.md has the measurements behind this.

Body layout, in order, for ``cond_dit`` then ``cond_dec``: the values (F x N x D elements, frame by
frame; with ``delta`` and floats, frame f is its byte planes [size, N * D]), then for int8 its
scales (float32, little-endian).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

from ..errors import CodecError

FLOATS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
INT8_AXIS = {"int8": 1, "int8-token": -1}  # the axis one scale spans: the tokens, resp. the channels
CODECS: tuple[str, ...] = tuple(e + z for z in ("", "+zstd") for e in (*FLOATS, *INT8_AXIS))
# The unsigned integer of each element size: floats are XORed and split by their bit patterns.
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_TORCH_INT = {2: torch.int16, 4: torch.int32}


class Codec(NamedTuple):
    encoding: str  # fp32 | fp16 | bf16 | int8 | int8-token
    zstd: bool

    @property
    def name(self) -> str:
        return self.encoding + ("+zstd" if self.zstd else "")

    @classmethod
    def named(cls, name: str) -> "Codec":
        """The codec of one of :data:`CODECS`."""
        encoding, suffix, _ = name.partition("+")
        return cls(encoding, bool(suffix))


class Tokens(NamedTuple):
    """[F, N, D] tokens as they travel: float values, or int8 values and their scales."""

    values: torch.Tensor
    scale: torch.Tensor | None = None

    def frames(self, start: int, stop: int) -> torch.Tensor:
        """Frames ``start`` to ``stop`` (exclusive) in float32: [stop - start, N, D]."""
        x = self.values[start:stop].float()
        return x if self.scale is None else x.mul_(self.scale[start:stop])


def layout(encoding: str, frames: int, n: int, d: int) -> list[tuple[str, int]]:
    """(name, bytes) of every part of the body, in order."""
    parts = []
    for name in ("cond_dit", "cond_dec"):
        if encoding in FLOATS:
            parts.append((name, frames * n * d * FLOATS[encoding].itemsize))
        else:
            parts.append((name, frames * n * d))
            scales = frames * (d if INT8_AXIS[encoding] == 1 else n)
            parts.append((f"{name}.scale", 4 * scales))
    return parts


def pack(name: str, x: torch.Tensor, encoding: str, delta: bool) -> list[np.ndarray]:
    """float32 [F, N, D] -> the body parts of one tensor, as arrays to write out in order."""
    if encoding in FLOATS:
        y = x.to(FLOATS[encoding])
        if not finite(y):
            peak = x.abs().max().item()
            raise CodecError(f"conditions.{name} reaches {peak:.6g}, beyond the {encoding} range; use codec bf16 or fp32")
        size = y.element_size()
        bits = y.view(_TORCH_INT[size]).numpy().view(_UINT[size]) if size in _TORCH_INT else y.numpy().view(np.uint32)
        if not delta:
            return [bits]
        changes = bits.copy()
        np.bitwise_xor(bits[1:], bits[:-1], out=changes[1:])
        # [F, N, D, size] bytes -> [F, size, N * D]: each frame's byte planes.
        return [changes.view(np.uint8).reshape(len(bits), -1, size).transpose(0, 2, 1)]
    scale = x.abs().amax(dim=INT8_AXIS[encoding], keepdim=True) / 127
    # An all-zero group has scale 0: its values are 0, so store q = 0 rather than 0/0.
    q = torch.where(scale > 0, x / scale, 0.0).round_().clamp_(-127, 127).to(torch.int8).numpy().view(np.uint8)
    if delta:
        q = np.concatenate([q[:1], q[1:] - q[:-1]])  # uint8: modulo 256
    return [q, scale.numpy()]


def unpack(read: Callable[[int], np.ndarray], encoding: str, delta: bool, frames: int, n: int, d: int) -> Tokens:
    """The inverse of :func:`pack`: ``read(count)`` gives the next ``count`` bytes of the body as a
    writable uint8 array that the result may keep."""
    if encoding in FLOATS:
        dtype = FLOATS[encoding]
        size = dtype.itemsize
        values = read(frames * n * d * size)
        if delta:
            planes = np.empty(size * n * d, np.uint8)
            for frame in values.reshape(frames, size * n * d):
                planes[:] = frame  # [size, N * D] -> [N * D, size], in place through one frame of room
                frame.reshape(n * d, size)[:] = planes.reshape(size, n * d).T
            bits = values.view(_UINT[size]).reshape(frames, n * d)
            np.bitwise_xor.accumulate(bits, axis=0, out=bits)
        tensor = torch.from_numpy(values)
        tensor = tensor.view(dtype) if size == 4 else tensor.view(_TORCH_INT[size]).view(dtype)
        if not finite(tensor):
            raise CodecError("payload tokens are NaN or infinite; the sender's cloud encoder is broken, check its weights")
        return Tokens(tensor.reshape(frames, n, d))
    q = read(frames * n * d).reshape(frames, n, d)
    if delta:
        np.cumsum(q, axis=0, dtype=np.uint8, out=q)  # modulo 256
    scale_shape = (frames, 1, d) if INT8_AXIS[encoding] == 1 else (frames, n, 1)
    scale = torch.from_numpy(read(4 * int(np.prod(scale_shape))).view(np.float32).reshape(scale_shape))
    # A scale is absmax / 127 of float32 values, so 127 times it is finite: a larger one would turn
    # q * scale infinite.
    if not finite(scale * 127) or bool((scale < 0).any()):
        raise CodecError("payload int8 scales are negative, NaN or infinite; the sender's cloud encoder is broken")
    return Tokens(torch.from_numpy(q.view(np.int8)), scale)


def finite(x: torch.Tensor) -> bool:
    # min/max propagate NaN and are ~15x faster than isfinite(x).all(), which allocates a mask.
    if x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x)
    return bool(torch.isfinite(lo) and torch.isfinite(hi))

"""A payload kind: one object that knows the whole job of one codec name, from the cloud's frames to
the edge's conditions, so that the rest of the code asks it and never compares the name.

The cloud's half: what the cloud makes of a chunk's frames (:meth:`Kind.make`: tokens, the frames
themselves, or a source video's own packets), how that is sealed into a payload (:meth:`Kind.seal`)
and what the cloud answers a client with (:meth:`Kind.answer`; the client makes the payload whole
again with :meth:`Kind.complete`). The edge's half: a payload opened (:meth:`Kind.open`, by its
format version) and turned into conditions on the edge's device (:meth:`Kind.conditions`).

A kind works with the two sides through what they offer, :class:`Cloud`, :class:`Edge`,
:class:`Source` and :class:`Held` below, so that the wire imports neither the models nor the media
it serves. The kinds live beside their formats (:mod:`.tokens`, :mod:`.pixels`, :mod:`.bitstream`)
and are registered in ``eden_serve.wire``.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np
import torch

from ..config import EdenConfig
from ..errors import CodecError
from .envelope import Limits, open_envelope


class Cloud(Protocol):
    """What a kind's cloud half asks of the cloud (:class:`eden_serve.cloud.encoder.CloudEncoder`)."""

    config: EdenConfig

    def encode_chunk(self, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None,
                     on_device: bool = False, depth: int = 8):
        """The frames' token chunk (:class:`~.tokens.Chunk`), on the host, or ``on_device`` where made."""

    def frames_chunk(self, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None, depth: int = 8):
        """The frames as pixels of ``depth`` bits (8 or 16) and the cloud's decisions (:class:`~.pixels.FramesChunk`)."""


class Source(Protocol):
    """A chunk's frames in a video the cloud holds (a server-side source)."""

    pixels: np.ndarray | None  # the frames as decoded, [F, H, W, 3], where the cloud read them: what the frames were made of

    def packets(self) -> tuple:
        """(stream parameters, the packets from the key frame at or before the chunk's first frame
        in decode order, the frames shown from that key frame before the chunk's first)."""


def source_pixels(source: Source | None) -> np.ndarray | None:
    """The pixels a source's frames were made of, where there are: CloudEncoder.frames_chunk takes them as they are."""
    return getattr(source, "pixels", None)


class Held(Protocol):
    """What a client holds of a source video: its packets, read to write the originals."""

    def packets(self, wanted: list[tuple[int, int | None, int]]) -> list[bytes]:
        """The bytes of the packets listed by (pts, dts, length)."""


class Edge(Protocol):
    """What a kind's edge half asks of the edge (:class:`eden_serve.edge.conditions.EdgeSide`)."""

    config: EdenConfig

    def receive(self, chunk):
        """A token chunk with its tensors on the edge's device."""

    def embed(self, chunk):
        """A frames chunk's token chunk, from the edge's own copy of E_cond, on its device."""

    def decode(self, chunk):
        """The RGB frames [F, H, W, 3] (uint8, or uint16 for a stream deeper than 8 bits) that a bitstream chunk's packets decode to."""


class Kind:
    """One codec name's payloads. ``version``: the wire format that carries them (None: they cross
    no wire); ``listed``: offered wherever a codec is asked for (False: only where :attr:`from_source`
    holds); ``from_source``: made of a video the cloud holds, not of frames alone; ``carries``:
    the chunk class the cloud makes; ``fallback``: the codec a client sends a chunk with instead
    when this kind failed on it with one of ``fallback_on``."""

    name: str
    version: int | None = None
    listed: bool = True
    from_source: bool = False
    carries: type
    # The codec that carries a chunk this kind failed on, and the failures (errors' kinds) it cures.
    fallback: str | None = None
    fallback_on: frozenset[str] = frozenset()

    @property
    def crosses(self) -> bool:
        """Whether its chunks cross as payloads (what crosses between two halves in one process does not)."""
        return self.version is not None

    def make(self, cloud: Cloud, frames: Sequence[torch.Tensor], seed: int = 0, scene_threshold: float | None = None,
             source: Source | None = None, depth: int = 8):
        """What the cloud makes of ``frames`` (pair j seeded ``seed + j``), whose pixels were of ``depth``
        bits (16: deeper than 8 bits), which the edge's middles keep."""
        raise NotImplementedError

    def seal(self, chunk, config: EdenConfig) -> bytes:
        """The payload of ``chunk`` for a receiver running ``config``."""
        if not isinstance(chunk, self.carries):
            raise CodecError(f"codec {self.name} does not carry a {type(chunk).__name__}: it carries {self.carried}")
        return self.encode(chunk, config)

    carried: str  # what the codec carries, said where it is given something else

    def encode(self, chunk, config: EdenConfig) -> bytes:
        raise NotImplementedError

    def open(self, header: dict, body: memoryview, config: EdenConfig, limits: Limits):
        """The chunk of a payload of this kind's format (its envelope checked), checked in the
        order of ``eden_serve.wire.decode``'s docstring."""
        raise NotImplementedError

    def cross(self, chunk, cloud: EdenConfig, edge: EdenConfig):
        """``chunk`` as an edge running ``edge`` opens it, and the payload's size: sealed by a cloud
        running ``cloud`` and opened, in one process."""
        payload = self.seal(chunk, cloud)
        _, header, body = open_envelope(memoryview(payload))
        return self.open(header, body, edge, Limits()), len(payload)

    def answer(self, payload: bytes) -> bytes:
        """What the cloud sends a client for ``payload`` (sealed and signed)."""
        return payload

    def complete(self, answer: bytes, held: Held | None) -> bytes:
        """The payload again, from the cloud's ``answer`` and what the client holds."""
        return answer

    def conditions(self, chunk, edge: Edge):
        """The opened ``chunk``'s token chunk on the edge's device."""
        raise NotImplementedError

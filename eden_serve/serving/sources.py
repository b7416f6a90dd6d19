"""The cloud's requests that name a server-side source instead of uploading frames
(docs/cloud-sources.md): field ``source``, a video's path under ``handler.media_root``, with
``start`` and ``frames`` (a chunk of frames ``start`` ... ``start + frames - 1``), or with
``ask=probe`` (the video's frame count, rate, size and streams), or with ``ask=packets``, ``stream``
and ``start`` (a page of that stream's compressed packets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .. import wire
from ..cloud.limits import check_tokens
from ..cloud.sources import FileCache, SourceFile, SourceVideo, Work
from ..config import EdenConfig
from ..errors import BadInputError, ChunkTooLargeError
from ..media.frames import check_sides
from ..media.packets import PacketReader
from ..sandbox.decoder import pixel_dtype
from ..wire.bitstream import Packet, StreamParameters
from ..wire.envelope import Limits
from ..wire.pages import pack
from .fields import ASKS, JSON, OCTET_STREAM, SOURCE_HELP, parse_index, text
from .worker import Settings


class ProbeJob(NamedTuple):
    source: str


class PacketsJob(NamedTuple):
    source: str
    stream: int | None  # None: the video
    start: int  # the page's first packet
    after: tuple | None  # (pts, dts, size) of the packet before it, where the client holds it


def parse_source(request: dict, settings: Settings) -> ProbeJob | PacketsJob | tuple[str, range]:
    """A probe, a page of packets, or the source and the frames a chunk request names (checked
    against the chunk limit before anything is opened)."""
    source = text(request["source"], "source", "utf-8")
    ask = text(request["ask"], "ask") if request.get("ask") is not None else "chunk"
    if ask not in ASKS:
        raise BadInputError(f"ask must be one of {', '.join(ASKS)}, got {ask!r:.40}; {SOURCE_HELP}")
    if ask == "probe":
        return ProbeJob(source)
    if ask == "packets":
        stream = parse_index(request["stream"], "stream") if request.get("stream") is not None else None
        return PacketsJob(source, stream, parse_index(request.get("start"), "start", 0), parse_after(request.get("after")))
    start, count = parse_index(request.get("start"), "start", 0), parse_index(request.get("frames"), "frames")
    if count > settings.max_chunk_frames:
        raise ChunkTooLargeError(f"{count} frames in one request, over this server's {settings.max_chunk_frames}; send shorter chunks")
    if count < 2:
        raise BadInputError(f"frames must be at least 2 (a pair), got {count}")
    return source, range(start, start + count)


INT64 = range(-2**63, 2**63)  # what a packet's times and size are in FFmpeg


def parse_after(value) -> tuple | None:
    """The ``after`` field: ``PTS:DTS:SIZE`` of the packet before a page (``none`` for a missing time),
    each an int64 as FFmpeg keeps them."""
    if value is None:
        return None
    parts = text(value, "after").split(":")
    try:
        if len(parts) != 3 or any(len(p) > 20 for p in parts):
            raise ValueError
        pts, dts = (None if p == "none" else int(p) for p in parts[:2])
        after = pts, dts, int(parts[2])
        if any(n is not None and n not in INT64 for n in after):
            raise ValueError
        return after
    except ValueError:
        raise BadInputError(f"after must be PTS:DTS:SIZE, 64-bit integers (or none for a time), got {parts!r:.60}") from None


def source_file(settings: Settings, name: str) -> SourceFile:
    root = settings.media_root
    return SourceFile(None if root is None else Path(root), name)


def work_of(settings: Settings) -> Work:
    return Work(settings.max_decoded_pixels, settings.max_demuxed_packets, settings.max_source_packets, settings.decode_deadline_s)


def open_source(settings: Settings, name: str) -> SourceVideo:
    return SourceVideo(source_file(settings, name), settings.max_pixels, work_of(settings))


def answer(settings: Settings, job: ProbeJob | PacketsJob) -> tuple[bytes, str]:
    """The body and content type of a probe (JSON) or of a page of packets (:mod:`~eden_serve.wire.pages`)."""
    video = open_source(settings, job.source)
    if isinstance(job, ProbeJob):
        return json.dumps(video.probe()).encode(), JSON
    return pack(video.page(job.stream, job.start, job.after)), OCTET_STREAM


class SourceChunk(NamedTuple):
    """The frames ``frames`` of the source ``name``, as the bitstream kind asks for them
    (:class:`eden_serve.wire.kinds.Source`): its packets read only where that kind is asked for;
    ``pixels``, where read, the frames decoded (:func:`read_source`)."""

    settings: Settings
    name: str
    frames: range
    pixels: np.ndarray | None = None

    def packets(self) -> tuple[StreamParameters, list[Packet], int]:
        reader = packet_reader(source_file(self.settings, self.name), self.settings.max_pixels, work_of(self.settings))
        span = reader.needed(self.frames.start, self.frames.stop - 1)
        return reader.parameters, reader.packets(span), span.skip


# The PacketReader of a source (its packets' times, read once), kept like the cloud's scans.
packet_reader = FileCache(lambda source, max_pixels, work: PacketReader(Path(source.name), max_pixels, source.open, work))


def source_depth(settings: Settings, name: str) -> int:
    """16 where the source's video is deeper than 8 bits, else 8: the depth its frames are read at (:func:`read_source`)."""
    pix_fmt = open_source(settings, name).scan.pix_fmt
    return 16 if pix_fmt and pixel_dtype(pix_fmt) == np.uint16 else 8


def read_source(settings: Settings, name: str, frames: range, config: EdenConfig, max_tokens: int,
                max_chunk_tokens: int) -> np.ndarray:
    """[F, H, W, 3] RGB pixels (uint8, or uint16 for a video deeper than 8 bits): the frames a
    request names, held to the limits uploaded frames are held to (judged from the stream's headers
    before a frame is decoded). :func:`~eden_serve.media.frames.frames_on` makes the model's frames
    of them on its device, and the frames and bitstream kinds take them as they are
    (:attr:`SourceChunk.pixels`)."""
    video = open_source(settings, name)
    width, height = video.scan.width, video.scan.height
    check_sides(width, height, wire.MAX_SIDE, name)
    check_tokens(width, height, len(frames), config, Limits(tokens=max_tokens, chunk_tokens=max_chunk_tokens,
                                                            pixels=settings.max_pixels), name)
    return np.stack(video.read(frames.start, len(frames)))

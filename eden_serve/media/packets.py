"""A video's own packets, for the bitstream kind (wire format 4, :mod:`eden_serve.wire.bitstream`):
read from a file in decode order (:class:`PacketReader`), which of them a chunk of frames needs
(:meth:`PacketReader.needed`), and decoded again (:func:`decode`, from :mod:`eden_serve.sandbox.decoder`;
:func:`decode_chunk`) to exactly the pixels that :class:`~.video.VideoClip` gives, through the same conversion.

Frames are numbered in display order, as VideoClip numbers them: by time stamp, one frame a packet.
A video whose packets are untimed (raw streams) is refused: the frames codec carries those. Packets
its container discards (an edit list's hidden frames, leading or trailing) are frames too, numbered
by their time as the cloud numbers them (:class:`~eden_serve.cloud.scans.Scan`): a chunk never holds one, and the
decoder, which decodes them all the same, gives theirs outside the chunk's times.

A chunk starts at the last key frame at or before its first frame. From a key frame that opens an
open GOP, the frames timed before it (its leading pictures) reference the GOP before and may or may
not come out of a decoder starting there; they are dropped by time, whatever the decoder does, and
then ``skip`` frames more. Reordering (B-frames) decides how far the packets go: to the last one
shown within the chunk.
"""

from __future__ import annotations

from pathlib import Path
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import numpy as np

from ..errors import BadInputError, TooMuchWorkError
from ..sandbox.decoder import decode
from ..wire.bitstream import DECODERS, REORDER_SLACK, BitstreamChunk, Packet, StreamParameters
from .base import PIPE
from .containers import main_video
from .encoding import import_av
from .video import VideoClip

__all__ = ["Packet", "PacketReader", "Span", "StreamParameters", "decode", "decode_chunk"]

@dataclass(frozen=True)
class Work:
    """What one request may make the cloud read and decode (``handler.max_decoded_pixels``,
    ``max_demuxed_packets``, ``max_source_packets``): judged before the work from the file's scan,
    and counted while it runs (413 ``too_much_work``)."""

    decoded_pixels: int = 1 << 30  # frames decoded for a range (from its key frame) x their pixels
    demuxed_packets: int = 1 << 16  # packets read past to reach a page, or a range read from the start
    source_packets: int = 1 << 20  # packets of a source's video stream, read once per file
    deadline_s: float = 30.0  # a range's decoding, a page's reading

    def check(self, amount: int, limit: int, what: str, setting: str) -> None:
        if amount > limit:
            raise TooMuchWorkError(f"{what}: over this cloud's {limit} for one request (handler.{setting}); ask for less at once")


class Span(NamedTuple):
    """The packets a chunk of frames needs, by decode index, and the frames to drop before it."""

    key: int  # the key frame to start decoding at
    end: int  # the last packet needed
    skip: int  # frames shown from the key frame on before the chunk's first


class PacketReader:
    """The video stream of a file (:func:`~.containers.main_video`), as packets: ``parameters`` to decode them with, iterate for
    the packets in decode order (each read from the file again), ``len()`` the frames."""

    def __init__(self, path: Path, max_pixels: int | None = None, opener=None, work: Work | None = None):
        """``opener()``: a new PyAV container of the file (a cloud's opens a source by descriptor,
        :class:`~.sources.SourceFile`); ``path`` then only names it in messages. ``work``: what a
        cloud's request may read (None: a local file, unbounded)."""
        self.work = work
        if str(path) == PIPE:
            raise BadInputError("the bitstream codec reads a video file twice, so it cannot take a pipe; use the frames codec")
        self.path = path
        self.open = opener or (lambda: import_av().open(str(path)))
        clip = VideoClip(path, max_pixels, self.open(), reopen=self.open)  # the same stream and checks as a local run's
        try:
            self.parameters = parameters_of(clip.stream, path)
            self._pts, self._dts, self._keys = self._index(clip.container.demux(clip.stream))
        finally:
            clip.close()
        self._display = sorted(range(len(self._pts)), key=self._pts.__getitem__)
        self._decode_index = {pts: index for index, pts in enumerate(self._pts)}
        # How many packets past a frame's own its decoder may hold the frame back (B-frames): the most
        # that any frame is decoded after its place in display order. FFmpeg's h264 and hevc give a
        # chunk's frames once these many follow (x264's defaults: 2), without being told the end.
        self.reorder = max((decoded - shown for shown, decoded in enumerate(self._display)), default=0)

    def _index(self, demuxed) -> tuple[list[int], list[int | None], list[int]]:
        pts, dts, keys, seen = [], [], [], set()
        try:
            for packet in demuxed:
                if not packet.size:  # the demuxer ends a stream with an empty packet
                    continue
                # A packet whose frame the container discards (an edit list's) is kept, numbered by its time as the
                # cloud numbers it: the edge's decoder, told nothing of it, gives its frame, which falls outside the chunk's times.
                problem = "is untimed" if packet.pts is None else "repeats an earlier time stamp" if packet.pts in seen else None
                if problem:
                    raise BadInputError(f"{self.path}: packet {len(pts)} of its video {problem}, which the bitstream codec does not "
                                        "carry; use the frames codec")
                seen.add(packet.pts)
                if self.work is not None:
                    self.work.check(len(pts) + 1, self.work.source_packets, f"{self.path}'s video has more packets", "max_source_packets")
                if packet.is_keyframe:
                    keys.append(len(pts))
                pts.append(packet.pts)
                dts.append(packet.dts)
        except import_av().error.FFmpegError as exc:
            raise BadInputError(f"{self.path}: cannot read its video's packets ({exc})") from None
        if not keys or keys[0] != 0:
            raise BadInputError(f"{self.path}: its video does not start with a key frame; use the frames codec")
        return pts, dts, keys

    def __len__(self) -> int:
        return len(self._pts)

    def __iter__(self) -> Iterator[Packet]:
        av = import_av()
        try:
            with self.open() as container:
                stream = main_video(container, str(self.path))
                index = 0
                for packet in container.demux(stream):
                    if packet.size:
                        yield Packet(bytes(packet), packet.pts, packet.dts, packet.is_keyframe, index)
                        index += 1
        except av.error.FFmpegError as exc:
            raise BadInputError(f"{self.path}: cannot read its video's packets ({exc})") from None

    def packets(self, span: Span) -> list[Packet]:
        """Packets ``span.key`` to ``span.end`` (decode order), demuxed from a seek to the key frame
        rather than from the file's start, which a cloud would otherwise read again for every chunk
        of a long video; from the start where the seek lands past the key frame."""
        return self._read(span, seek=True) or self._read(span, seek=False)

    def _read(self, span: Span, seek: bool) -> list[Packet] | None:
        av = import_av()
        if not seek and self.work is not None:  # from the start, up to the last packet needed
            self.work.check(span.end + 1, self.work.demuxed_packets, f"{span.end + 1} packets to read", "max_demuxed_packets")
        found: list[Packet] = []
        try:
            with self.open() as container:
                stream = main_video(container, str(self.path))
                index = None  # of the packet in hand, in decode order
                if seek:
                    container.seek(self._pts[span.key], stream=stream, backward=True, any_frame=False)
                for packet in container.demux(stream):
                    if not packet.size:
                        continue
                    if index is not None:
                        index += 1
                    elif not seek:
                        index = 0
                    else:  # the first packet after the seek: its time (unique, checked when indexed) says where it landed
                        index = self._decode_index.get(packet.pts)
                        if index is None or index > span.key:
                            return None
                    if index > span.end:
                        break
                    if index >= span.key:
                        # Timed as read from the start, as the client's pages have them: Matroska
                        # stores no dts, and FFmpeg's guess of it is none for the first packets
                        # after a seek, which then differed from the client's (every such chunk of
                        # H.264 with B-frames past the first GOP fell back to the frames codec).
                        found.append(Packet(bytes(packet), packet.pts, self._dts[index], packet.is_keyframe, index))
        except av.error.FFmpegError as exc:
            raise BadInputError(f"{self.path}: cannot read its video's packets ({exc})") from None
        return found

    def frames(self) -> list[int]:
        """For each frame, in display order, the decode index of its packet: once that packet and
        every one before it from a key frame is decoded, the frame can be shown."""
        return list(self._display)

    def needed(self, first: int, last: int) -> Span:
        """The packets that frames ``first`` to ``last`` (display order, inclusive) need, and the
        :attr:`reorder` packets after them where each is shown after the chunk: with those, a
        decoder gives the chunk's frames without being told the packets ended, so the edge can go on
        with the next chunk's packets (:mod:`eden_serve.edge.continued`). A packet shown before the
        chunk is never among them: it would move the frames the edge counts from the key frame."""
        if not 0 <= first <= last < len(self):
            raise BadInputError(f"frames {first} to {last} are not frames of {self.path}, which has {len(self)}")
        packets = self._display[first : last + 1]
        start, shown_last = self._pts[packets[0]], self._pts[packets[-1]]
        key = max(k for k in self._keys if k <= min(packets) and self._pts[k] <= start)
        end = max(packets)
        skip = sum(self._pts[key] <= self._pts[d] < start for d in range(key, end + 1))
        after = range(end + 1, min(end + 1 + self.reorder, len(self)))
        within = after.stop - key <= skip + len(packets) + REORDER_SLACK  # what the edge takes of a chunk
        if within and all(self._pts[d] > shown_last for d in after):
            end = after.stop - 1 if after else end
        return Span(key, end, skip)


def parameters_of(stream, path: Path) -> StreamParameters:
    """The parameters of a PyAV video stream, as its container states them."""
    context = stream.codec_context
    name = context.codec.name
    if name not in DECODERS:
        raise BadInputError(f"{path}: its video decodes with {name}, which the bitstream codec does not carry (it carries "
                            f"{', '.join(DECODERS)}); use the frames codec")
    if context.pix_fmt is None:
        raise BadInputError(f"{path}: its video's pixel format is unknown; use the frames codec")
    return StreamParameters(
        name, bytes(context.extradata or b""), context.width, context.height, context.pix_fmt, context.codec_tag,
        int(context.color_range), int(context.colorspace), int(context.color_primaries), int(context.color_trc),
    )


def decode_chunk(chunk: BitstreamChunk, max_pixels: int | None = None) -> np.ndarray:
    """The uint8 frames [F, H, W, 3] that a bitstream chunk's packets decode to (:func:`decode`)."""
    return decode(chunk.parameters, chunk.packets, chunk.skip, chunk.frames, max_pixels)

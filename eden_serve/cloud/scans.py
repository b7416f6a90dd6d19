"""What a server-side source's video says before a frame of it is decoded, read once per file and
kept for the last few (:class:`FileCache`): each frame's time stamp and the key frames (where a
range may start decoding), and what a client plans a run with and the output keeps (size, rate,
colour, how it is shown, labels, streams). Read by :class:`~.sources.SourceVideo`."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from fractions import Fraction

from ..errors import BadInputError
from ..media.colour import Colour
from ..media.containers import (Labels, container_start, display_matrix, dynamic_hdr, first_look, frame_rate, main_video,
                               pixel_aspect, stream_start)
from ..media.damage import stated_end, until_failure
from ..media.encoding import import_av
from ..media.frames import check_size
from ..media.packets import Work
from ..media.webm_alpha import marked_alpha
from ..wire.pages import MAX_CODED_BITS

SCANS_KEPT = 8  # files whose packet times a cloud worker keeps


@dataclass(frozen=True)
class Scan:
    """What the packets of a file's first video stream say, read without decoding them."""

    width: int
    height: int
    pix_fmt: str
    codec: str
    rate: Fraction
    time_base: Fraction
    times: list[int] | None  # each frame's time stamp, in display order (None: the stream has none)
    decoded_at: list[int | None]  # each packet's dts, in the file's order, as read from the start
    starts: list[int]  # each key frame's time stamp, in order: where a read may start decoding
    frames: int  # packets of the stream: its frames
    video_bytes: int
    streams: list[dict]
    colour: Colour
    display_matrix: tuple[int, ...] | None  # its first frame's (a rotation, a mirror)
    aspect: Fraction | None  # the sample aspect ratio (anamorphic pixels)
    labels: Labels  # the title, chapters and tags that the output keeps
    dynamic_hdr: tuple[str, ...]  # its dynamic HDR metadata (HDR10+, Dolby Vision), named: no output keeps it
    alpha_left_out: bool  # VP8's or VP9's alpha beside each frame (a WebM's), which the pages do not carry
    decoding: dict  # what the container tells the decoder beside the extradata (:func:`_decoding`)
    start: Fraction | None  # when the video's first frame is shown, in seconds, as the container states it
    earliest: Fraction | None  # when the file's first stream starts (the container's start time), in seconds
    stated: dict  # where the container states the video ends (:func:`~eden_serve.media.damage.stated_end`)
    hidden: frozenset[int] = frozenset()  # the time stamps of the frames the container discards (an edit list hides)


def _scan(source, max_pixels: int, max_packets: int = Work.source_packets) -> Scan:
    av = import_av()
    with source.open() as container:
        stream = main_video(container, source.name)
        check_size(stream.width, stream.height, max_pixels, source.name)
        times, decoded_at, starts, size, count, hidden = [], [], [], 0, 0, set()
        try:
            for packet in until_failure(container.demux(stream)):
                if not packet.size:  # the demuxer ends the stream with an empty packet
                    continue
                count += 1
                Work().check(count, max_packets, f"{source.name}'s video has more packets", "max_source_packets")
                size += packet.size
                times.append(packet.pts)
                decoded_at.append(packet.dts)
                if packet.is_discard and packet.pts is not None:
                    hidden.add(packet.pts)
                if packet.is_keyframe and packet.pts is not None:
                    starts.append(packet.pts)
        except av.error.FFmpegError as exc:
            raise BadInputError(f"{source.name}: cannot read the video's packets ({exc})") from None
        timed = None if None in times else sorted(times)
        if timed is not None and len(set(timed)) != len(timed):
            raise BadInputError(f"{source.name}: two frames share a time stamp; the video's timing is broken")
        context = stream.codec_context
        rate = frame_rate(stream)
        streams = [{"index": s.index, "type": s.type, "codec": s.codec_context.name if s.codec_context else None,
                    "language": s.metadata.get("language")} for s in container.streams]
        with source.open() as again:  # from the start, past the packets read
            colour, (first, in_band) = Colour.of_stream(context), first_look(again)
        aspect = pixel_aspect(stream)
        return Scan(stream.width, stream.height, context.format.name if context.format else "", context.name, rate,
                    Fraction(stream.time_base or 1 / rate), timed, decoded_at, sorted(starts), count, size, streams,
                    colour.with_side_data(first) if colour.may_hold_metadata and first else colour,
                    display_matrix(first), aspect, Labels.of(container, stream), dynamic_hdr(stream, first, in_band),
                    marked_alpha(stream), _decoding(context),
                    stream_start(stream), container_start(container),
                    stated_end(container, stream), frozenset(hidden))


def _decoding(context) -> dict:
    """What a decoder takes from the container beside the extradata, where stated: the codec tag
    (ProRes's depth: ``ap4h`` decodes at 12 bits) and a coded sample's bits (QuickTime RLE's)."""
    found = {}
    try:
        tag = context.codec_tag
    except (ValueError, UnicodeDecodeError):
        tag = None
    if isinstance(tag, str) and re.fullmatch(r"[\x20-\x7e]{4}", tag):
        found["codec_tag"] = tag
    if 0 < context.bits_per_coded_sample <= MAX_CODED_BITS:
        found["bits_per_coded_sample"] = context.bits_per_coded_sample
    return found


class FileCache:
    """``make(source, *args)``, kept for the last :data:`SCANS_KEPT` files (each a
    :class:`~.sources.SourceFile`) while each file's size and modification time stay: a cloud
    worker reads a file's packet times once, not per request. Files are known by device and
    inode, whatever name reached them, and requests for a file being read wait for that read
    rather than start their own."""

    def __init__(self, make):
        self.make = make
        self._kept: OrderedDict[tuple, Future] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, source, *args):
        key = (*source.key, *args)
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                kept = self._kept[key] = Future()
                owner = True
            else:
                self._kept.move_to_end(key)
                owner = False
        if owner:
            try:
                kept.set_result(self.make(source, *args))
            except BaseException as exc:
                with self._lock:
                    self._kept.pop(key, None)
                kept.set_exception(exc)
            with self._lock:
                while len(self._kept) > SCANS_KEPT:
                    self._kept.popitem(last=False)
        return kept.result()


scan = FileCache(_scan)  # the Scan of a path

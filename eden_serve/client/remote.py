"""A server-side source as the client reads it (docs/cloud-sources.md): the cloud holds the video,
the client plans the run from the cloud's probe and writes the output where it runs.

The originals come down as the video's own compressed packets, a page at a time
(:mod:`eden_serve.wire.pages`), and are decoded here by the decoder a local run uses: frame for frame the pixels
and times :class:`~eden_serve.media.video.VideoClip` gives for the same file, so the output is written by the same
:class:`~eden_serve.media.video_writer.VideoWriter` (``--fps``, scene cuts, ``--resume``). Each frame names the source
(:attr:`~.base.Frame.source`), so that a chunk of originals is asked of the cloud by its frame
numbers rather than uploaded.
"""

from __future__ import annotations

import heapq
import json
import re
import threading
import warnings
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator, Sequence

from ..errors import BadInputError, CodecError
from ..media.audio import PageDecoder, transcoded
from ..media.base import Clip, Frame
from ..media.colour import Colour
from ..media.containers import Labels, lead
from ..media.damage import Damage
from ..media.encoding import added, import_av
from ..media.frames import check_size
from ..media.palette import given_as
from ..media.subtitles import converted
from ..media.video import VideoClip
from ..sandbox.decoder import owned_packet
from ..wire.pages import MAX_CODED_BITS, Packet, Page, unpack

PREFIX = "cloud:"
MAX_DYNAMIC_HDR = 8  # kinds of dynamic HDR metadata a probe names, at most
HELD_PACKETS = 1024  # at least: more than the frames of every chunk in flight
# (stream, first packet, the packet before it) -> the page's bytes; stream None: the video.
Fetch = Callable[[int | None, int, "Packet | None"], bytes]


def source_name(src) -> str | None:
    """The name under the cloud's media root that ``src`` gives as ``cloud:NAME``, else None."""
    text = str(src)
    return text[len(PREFIX):] if isinstance(src, str) and text.startswith(PREFIX) else None


def _audio_copy(av, container, first: Page):
    """An output stream for the packets of ``first``'s audio, as they are. PyAV's streams that take
    parameters need an encoder of the codec (the cloud names the stream by its decoder: mp3float),
    opened before the header is written: it is opened here on a sample format it takes (Opus's takes
    no planar samples, which its decoder states), and the source's own header then replaces the one
    it made (an encoder's own AAC header says LC whatever the source's profile). It encodes nothing."""
    output = container.add_stream(av.Codec(first.stream["codec"], "r").canonical_name, rate=first.stream["sample_rate"])
    context = output.codec_context
    formats = [f.name for f in context.codec.audio_formats or ()]
    context.layout = first.stream["layout"]
    context.format = first.stream["format"] if not formats or first.stream["format"] in formats else formats[0]
    context.open()
    context.extradata = first.extradata or None
    return output


def _display(matrix) -> tuple[int, ...] | None:
    """A probe's display matrix: nine 32-bit integers, or None."""
    if matrix is None:
        return None
    if not isinstance(matrix, list) or len(matrix) != 9 or any(type(v) is not int or not -2**31 <= v < 2**31 for v in matrix):
        raise CodecError("the cloud's probe: display_matrix must be nine 32-bit integers")
    return tuple(matrix)


def _dynamic_hdr(names) -> tuple[str, ...]:
    """A probe's dynamic HDR metadata, named ("HDR10+", "Dolby Vision (profile 8)"): a few short
    names, which the output's warning repeats, so a cloud writes no line of its own choosing."""
    if not isinstance(names, list) or len(names) > MAX_DYNAMIC_HDR or not all(
            isinstance(n, str) and re.fullmatch(r"[\w+() .-]{1,40}", n, re.ASCII) for n in names):
        raise CodecError(f"the cloud's probe: dynamic_hdr must be a list of at most {MAX_DYNAMIC_HDR} names "
                         "(letters, digits, spaces, + ( ) . -; at most 40 each)")
    return tuple(dict.fromkeys(names))


def _alpha_left_out(given, path: Path) -> None:
    """One warning where the probe says the video's alpha is left out of its pages (VP8's or VP9's,
    which Matroska holds beside each frame): the output is opaque, as a local run's where the alpha
    is not read. A cloud from before states nothing, and nothing is said."""
    if type(given) is not bool:
        raise CodecError("the cloud's probe: alpha_left_out must be true or false")
    if given:
        warnings.warn(f"{path}: its VP8 or VP9 video carries alpha beside each frame, which a cloud source's pages do not "
                      "carry (its packets alone): the alpha is left out, and the output is opaque")


def _decoding(given) -> dict:
    """A probe's ``decoding``: what the decoder takes from the container beside the extradata (a
    ``codec_tag`` of four printable ASCII characters, ``bits_per_coded_sample`` from 1 to
    :data:`~eden_serve.wire.pages.MAX_CODED_BITS`); a cloud from before states none, and the decoder
    opens as it did (QuickTime RLE refused, ProRes 4444 decoded at 10 bits)."""
    if not isinstance(given, dict) or not set(given) <= {"codec_tag", "bits_per_coded_sample"}:
        raise CodecError("the cloud's probe: decoding must hold codec_tag and bits_per_coded_sample at most")
    tag, bits = given.get("codec_tag"), given.get("bits_per_coded_sample")
    if tag is not None and not (isinstance(tag, str) and re.fullmatch(r"[\x20-\x7e]{4}", tag)):
        raise CodecError("the cloud's probe: decoding's codec_tag must be four printable ASCII characters")
    if bits is not None and not (type(bits) is int and 0 < bits <= MAX_CODED_BITS):
        raise CodecError(f"the cloud's probe: decoding's bits_per_coded_sample must be an integer from 1 to {MAX_CODED_BITS}")
    return dict(given)


def _seconds(value, what: str) -> Fraction | None:
    """A probe's time in seconds, ``N/D`` (negative too), within 2**32 s, or None."""
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,20}(/[1-9]\d{0,19})?", value) and abs(Fraction(value)) < 1 << 32:
        return Fraction(value)
    raise CodecError(f"the cloud's probe: {what} must be null or a time in seconds N/D within 2**32")


def _time(packet) -> Fraction:
    stamp = packet.dts if packet.dts is not None else packet.pts
    return (stamp or 0) * packet.time_base


def _fraction(value, what: str) -> Fraction:
    try:
        fraction = Fraction(value)
    except (TypeError, ValueError, ZeroDivisionError):
        fraction = Fraction(0)
    if fraction <= 0:
        raise CodecError(f"the cloud's probe: {what} {str(value)[:20]!r} is not a positive fraction")
    return fraction


class RemoteVideo(VideoClip):
    """The server-side video ``name`` from its ``probe`` (the cloud's answer) and ``fetch``."""

    container = None  # no local file: the writer copies no streams from one
    start = earliest = None  # from the probe (a cloud from before states neither: no output is moved)
    piped = False

    def __init__(self, name: str, probe: dict, fetch: Fetch, max_pixels: int | None = None):
        Clip.__init__(self, Path(PREFIX + name))
        av = import_av()
        self._error = av.error.FFmpegError
        self.name, self.probe, self.fetch = name, probe, fetch
        if not isinstance(probe, dict) or type(probe.get("frames")) is not int or probe["frames"] < 0 or not isinstance(
                probe.get("streams"), list):
            raise CodecError("the cloud's probe is not a probe document (frames, rate, streams)")
        self.rate, self.time_base = _fraction(probe.get("rate"), "rate"), _fraction(probe.get("time_base"), "time base")
        self.length = probe["frames"] or None
        try:  # as a local file's stream states it; a cloud from before colour was probed states none
            self.colour = Colour.from_fields(probe["colour"]) if "colour" in probe else Colour()
        except ValueError as exc:
            raise CodecError(f"the cloud's probe: {exc}") from None
        self.display_matrix, self.aspect = _display(probe.get("display_matrix")), probe.get("sample_aspect_ratio")
        self.aspect = self.aspect and _fraction(self.aspect, "sample aspect ratio")  # a cloud from before states neither
        try:  # a cloud from before labels were probed states none
            self.labels = Labels.from_fields(probe["labels"]) if "labels" in probe else None
        except ValueError as exc:
            raise CodecError(f"the cloud's probe: {exc}") from None
        self.dynamic_hdr = _dynamic_hdr(probe.get("dynamic_hdr", []))  # a cloud from before states none
        _alpha_left_out(probe.get("alpha_left_out", False), self.path)
        self.alpha = self.alpha_pix_fmt = None  # decoded by FFmpeg's own decoder: the colour alone
        self.decoding = _decoding(probe.get("decoding", {}))  # a cloud from before states none
        # When the video and the file's first stream start: the output is moved by them as a local
        # file's is (:func:`~eden_serve.media.containers.lead`).
        self.start, self.earliest = _seconds(probe.get("start"), "start"), _seconds(probe.get("streams_start"), "streams_start")
        self.damage()  # where the container states the video ends, checked (a file cut short is said as its reading ends)
        self.first = unpack(fetch(None, 0, None))
        self._held: list[Packet] = []  # the video's latest packets, in decode order (_hold)
        self._lock = threading.Lock()
        video = self.first.stream
        if video.get("type") != "video" or not {"width", "height", "pix_fmt"} <= set(video):
            raise CodecError("the cloud's first page is not of a video stream")
        if max_pixels is not None:
            check_size(video["width"], video["height"], max_pixels, str(self.path))
        self.stream = SimpleNamespace(codec_context=self.decoder())  # what the writer copies: codec, size, pixel format
        if video["pix_fmt"] == "pal8":  # a palette's alpha, which FFmpeg's format does not list (:func:`~eden_serve.media.palette.given_as`)
            self.alpha_pix_fmt = given_as(self._first_picture())
        # Stream index -> its language, of the audio and subtitle streams to copy.
        self.others = {s["index"]: s.get("language") for s in probe["streams"] if isinstance(s, dict)
                       and s.get("type") in ("audio", "subtitle") and type(s.get("index")) is int}

    def page(self, start: int, stream: int | None = None, first: Page | None = None, after: Packet | None = None) -> Page:
        """The page of ``stream`` (None: the video) from packet ``start``, which follows packet
        ``after`` (where the cloud seeks to), of the same stream as its ``first``."""
        page = unpack(self.fetch(stream, start, after))
        first = first or (self.first if stream is None else None)
        if first is not None and page.stream != first.stream or stream is not None and page.stream["index"] != stream:
            raise CodecError(f"the cloud's page at packet {start} is of another stream than asked")
        return page

    def copied(self, container, dst: Path) -> Iterator | None:
        """The source's labels onto ``container`` and its video stream, and output streams for the
        source's audio and subtitles, with their packets merged in time order, fetched a page at a
        time as the writer reaches them (None: none to copy), as
        :class:`~eden_serve.media.video_writer.VideoWriter` does for a local file: audio the output cannot
        hold as it is re-encoded (:mod:`eden_serve.media.audio`), or left out where it holds no
        audio; text subtitles converted to its own text format (:mod:`eden_serve.media.subtitles`),
        or left out where it has none; each with a warning."""
        av = import_av()
        if self.labels is not None:
            self.labels.apply(container, container.streams.video[0], lead(self))  # its chapters moved as the streams are
        streams = []
        for index, language in self.others.items():
            first = self.page(0, index)
            kind, codec = first.stream["type"], first.stream["codec"]
            output, made = (self._audio if kind == "audio" else self._subtitles)(av, container, first, dst)
            if output is None:
                warnings.warn(f"{dst.name} cannot hold the input's {codec} {kind} (stream {index}); it is left out")
                continue
            if made is None:
                output.time_base = first.time_base
            if isinstance(language, str):
                output.metadata["language"] = language
            streams.append(self._packets(first, index, output, av, made))
        return heapq.merge(*streams, key=_time) if streams else None

    def _subtitles(self, av, container, first: Page, dst: Path) -> tuple:
        """The output stream of the subtitles whose first page is ``first``, and what converts them
        (:class:`~eden_serve.media.subtitles.Converted`) where ``container`` cannot hold them as they
        are, as a local file's (SRT into MP4: mov_text); None for both where it cannot hold them."""
        codec = first.stream["codec"]  # its decoder's name (pgssub): decided by the codec's, as a local file's
        try:
            decoder = av.CodecContext.create(codec, "r")
        except (self._error, ValueError):
            return None, None
        if (output := added(container, decoder.codec.canonical_name, lambda c: c.add_mux_stream(codec))) is not None:
            return output, None
        decoder.extradata = first.extradata or None  # an ASS track's header
        made = converted(container, SimpleNamespace(codec_context=decoder), dst)
        return (None, None) if made is None else (made.output, made)

    def _audio(self, av, container, first: Page, dst: Path) -> tuple:
        """The output stream of the audio whose first page is ``first``, and what re-encodes it
        (:class:`~eden_serve.media.audio.Transcoded`) where ``container`` cannot hold it as it is;
        None for both where the container holds no audio."""
        stream = first.stream
        try:  # decided as a local file's copy is, on a scratch muxer (FLAC into MOV, PCM into MP4 or MPEG-TS)
            output = added(container, av.Codec(stream["codec"], "r").canonical_name, lambda c: _audio_copy(av, c, first))
            if output is not None:
                return output, None
            decoder = PageDecoder(stream["codec"], first.extradata, stream["sample_rate"], stream["layout"])
            made = transcoded(container, SimpleNamespace(codec_context=decoder), dst)
        except (self._error, ValueError, KeyError):
            raise BadInputError(f"output {str(dst)!r} cannot hold the source's {stream['codec']} audio as it is, nor "
                                f"this client re-encode it; write a {Path(self.name).suffix} file instead") from None
        return (None, None) if made is None else (made.output, made)

    def _packets(self, page: Page, index: int, output, av, made=None) -> Iterator:
        """The output's packets of stream ``index`` from its first ``page``: the source's own, or
        those ``made`` (:class:`~eden_serve.media.audio.Transcoded`,
        :class:`~eden_serve.media.subtitles.Converted`) of them."""
        first = page
        while True:
            for p in page.packets:
                packet = av.Packet(p.data) if made is None else owned_packet(p.data, av)
                if made is not None and p.skips is not None:  # an audio packet's samples to drop
                    packet = made.decoder.packet(packet, p.skips)
                packet.pts, packet.dts, packet.duration, packet.time_base = p.pts, p.dts, p.duration, page.time_base
                if made is None:
                    packet.stream = output
                    yield packet
                else:
                    yield from made.packets(packet)
            if page.next is None:
                break
            page = self.page(page.next, index, first, page.packets[-1] if page.packets else None)
        if made is not None:
            yield from made.packets(av.Packet())  # empty: flushes the decoder and the encoder

    def decoder(self):
        av = import_av()
        stream = self.first.stream
        try:
            context = av.CodecContext.create(stream["codec"], "r")
        except (self._error, ValueError):
            raise BadInputError(f"{self.path}: this client cannot decode {stream['codec']!r} video") from None
        context.extradata = self.first.extradata or None
        context.width, context.height, context.pix_fmt = stream["width"], stream["height"], stream["pix_fmt"] or None
        if "codec_tag" in self.decoding:  # ProRes's depth (4444: 12 bits), as a local decoder has it from the file
            context.codec_tag = self.decoding["codec_tag"]
        if "bits_per_coded_sample" in self.decoding:  # QuickTime RLE's decoder opens only with them
            context.bits_per_coded_sample = self.decoding["bits_per_coded_sample"]
        # The container's tags, which a local decoder has from the file where the bitstream states none.
        colour = self.colour
        context.color_primaries, context.color_trc, context.colorspace = colour.primaries, colour.transfer, colour.matrix
        context.color_range = colour.range
        if self.aspect:  # the container's, which a local decoder has from the file
            context.sample_aspect_ratio = self.aspect
        context.thread_type = "AUTO"
        return context

    def _first_picture(self):
        """The first page's first picture (a paletted video's: its packets are whole pictures), or None."""
        av = import_av()
        if not self.first.packets:
            return None
        decoder = self.decoder()
        try:  # flushed: a frame-threaded decoder holds its first pictures back
            return next(iter([*decoder.decode(owned_packet(self.first.packets[0].data, av)), *decoder.decode(None)]), None)
        except self._error:
            return None

    def _video_packets(self, hidden: set[int]) -> Iterator:
        """The video's packets, as PyAV's, a page at a time; the times of those the container discards put in ``hidden``."""
        av = import_av()
        page = self.first
        time_base = page.time_base
        while True:
            for p in page.packets:
                self._hold(p)
                if p.discard and p.pts is not None:  # an edit list's: its frame is dropped (Damage.hidden)
                    hidden.add(p.pts)
                packet = owned_packet(p.data, av)  # not lent: a frame-threaded decoder let go of mid-stream hung
                packet.pts, packet.dts, packet.duration, packet.time_base = p.pts, p.dts, p.duration, time_base
                packet.is_keyframe = p.key  # a packet not marked so, PNG's decoder adds to the picture before it
                yield packet
            if page.next is None:
                break
            page = self.page(page.next, after=page.packets[-1] if page.packets else None)

    def _hold(self, packet: Packet) -> None:
        """Keep ``packet`` for the bitstream payloads of the chunks to come: the packets since the
        key frame before the last :data:`HELD_PACKETS`, so the GOP of every chunk in flight."""
        with self._lock:
            if packet.key and len(self._held) > HELD_PACKETS:
                drop = max((i for i, p in enumerate(self._held) if p.key and i <= len(self._held) - HELD_PACKETS), default=0)
                self._held = self._held[drop:]
            self._held.append(packet)

    def packets(self, wanted: list[tuple[int, int | None, int]]) -> list[bytes]:
        """The bytes of the packets that ``wanted`` lists by (pts, dts, length), consecutive in
        decode order, from those held; CodecError where they are not held as listed."""
        with self._lock:
            held = list(self._held)
        starts = [i for i, p in enumerate(held) if (p.pts, p.dts) == wanted[0][:2]] if wanted else []
        found = held[starts[0]:starts[0] + len(wanted)] if starts else []
        if [(p.pts, p.dts, len(p.data)) for p in found] != wanted:
            raise CodecError("the packets a bitstream chunk names are not those held here")
        return [p.data for p in found]

    def __iter__(self) -> Iterator:
        """The frames, read on past damage as a local file's are (:mod:`~eden_serve.media.damage`):
        each numbered (:attr:`~eden_serve.media.base.Frame.at`) as the cloud numbers the file's
        frames, by time stamp, so a chunk after a lost frame names its own frames, and one across
        it names none (its frames are sent)."""
        damage, given = self.damage(), 0
        try:
            for given, frame in enumerate(self.timed(damage.decoded(None, self.decoder(), self._video_packets(damage.hidden)), self.name,
                                                     damage=damage), 1):
                frame.at = frame.index if damage.untimed else damage.at(frame.raw.pts)
                yield frame
        except self._error as exc:
            raise BadInputError(f"{self.path}: cannot decode the video ({exc})") from None
        damage.report(given)

    def damage(self) -> Damage:
        try:
            return Damage.stated(self.probe.get("stated", {}), self.time_base, self.path)
        except ValueError as exc:
            raise CodecError(f"the cloud's probe: {exc}") from None

    def identity(self) -> dict:
        """What a resumed run checks it continues: the cloud's account of the file."""
        return {"cloud": self.name, **{key: self.probe.get(key) for key in ("bytes", "video_bytes", "frames", "rate")}}

    def close(self) -> None:
        pass


def open_remote(name: str, ask: Callable[[dict[str, str]], bytes], max_pixels: int | None = None) -> RemoteVideo:
    """The server-side source ``name``; ``ask`` posts a form to the cloud's encoder and returns its answer."""
    try:
        probe = json.loads(ask({"source": name, "ask": "probe"}))
    except ValueError:
        raise CodecError(f"the cloud's probe of {name!r} is not JSON") from None

    def fetch(stream: int | None, start: int, after: Packet | None) -> bytes:
        form = {"source": name, "ask": "packets", "start": str(start)}
        if after is not None:  # the packet before the page: the cloud seeks to it
            form["after"] = ":".join("none" if v is None else str(v) for v in (after.pts, after.dts, len(after.data)))
        return ask(form if stream is None else {**form, "stream": str(stream)})

    return RemoteVideo(name, probe, fetch, max_pixels)


def named_fields(frames: Sequence[Frame]) -> dict[str, str] | None:
    """The fields that name a chunk's frames on the cloud where they are consecutive originals of
    one server-side source; None where they must be sent (middles of a 4x run's second level,
    frames resized for --process-size)."""
    source = frames[0].source
    if source is None or any(f.source != source or f.at != frames[0].at + i for i, f in enumerate(frames)):
        return None  # (or across frames lost to damage here, which the cloud counts)
    return {"source": source, "start": str(frames[0].at), "frames": str(len(frames))}

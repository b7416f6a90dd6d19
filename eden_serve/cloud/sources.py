"""Server-side sources: videos the cloud holds under its media root (``handler.media_root``), which
a request names, with a frame range, instead of uploading the frames (docs/cloud-sources.md).

A name is a relative path under the root, checked and opened by :mod:`.names` (never leaving it).

:class:`SourceVideo` reads the first video stream as :class:`~eden_serve.media.video.VideoClip` does (the same
decoder, the same RGB conversion, so the same pixels as a local run), but a frame range starts
decoding at the key frame at or before it: the packets' times, read once per file without decoding
(:class:`~.scans.Scan`, kept for a few files), say which, and the demuxer seeks there. Every frame asked for
is matched by its time stamp, and a seek that lands wrong falls back to decoding from the start.
Pictures shown before the range that nothing references (H.264's, HEVC's) are left undecoded, and
a range goes on from where the file's range before left the decoder where that costs less
(:mod:`.ranges`).
"""

from __future__ import annotations

import bisect
import os
import stat
import time
import weakref
from pathlib import Path

import numpy as np

from ..errors import BadInputError, SourceForbiddenError
from ..media import MOOV
from ..media.audio import skips
from ..media.encoding import import_av
from ..media.packets import Work
from ..media.containers import main_video, self_contained
from ..media.damage import until_failure
from ..media.video import VideoClip, rgb
from ..wire.pages import MAX_PAGE_BYTES, MAX_PAGE_PACKETS, Packet, Page
from .names import open_beneath, resolve
from .ranges import CURSORS, Cursor
from .scans import FileCache, Scan, scan  # noqa: F401 (FileCache, Scan: the serving layer's and the tests' names for them)

# The containers the cloud opens (docs/cloud-sources.md), by their first bytes, and PyAV's demuxer
# of each: forcing it keeps FFmpeg from probing the file as a playlist, a concatenation list or
# any other format that names other files or URLs inside it.
CONTAINERS = {"MP4 or MOV": "mov", "Matroska or WebM": "matroska"}
# Demuxer options: no protocol but local files for anything a demuxer opens besides the input,
# and none of a MOV's data references to other files.
_DEMUXER_OPTIONS = {"protocol_whitelist": "file", "enable_drefs": "0"}


class SourceFile:
    """A source opened once, by descriptor, after the name's checks: every later read opens the
    same file through that descriptor (no second walk of the name, so no race with a rename), as
    one of :data:`CONTAINERS`. Messages name it by ``name``, never by its path on the server."""

    def __init__(self, root: Path | None, name: str):
        path = resolve(root, name)
        self.name = name
        base = os.path.realpath(root)
        self.fd = open_beneath(base, str(path), name)
        weakref.finalize(self, os.close, self.fd)
        status = os.fstat(self.fd)
        opened = os.readlink(f"/proc/self/fd/{self.fd}")  # a directory renamed out of the root meanwhile
        if os.path.commonpath([base, opened]) != base:
            raise SourceForbiddenError(f"source {name!r} was moved out of the media root while it was opened")
        if not stat.S_ISREG(status.st_mode):
            raise BadInputError(f"source {name!r} is not a regular file")
        self.key = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
        self.size = status.st_size
        self.format = self._container(os.pread(self.fd, 12, 0))

    def _container(self, start: bytes) -> str:
        shown = self_contained(start)
        if shown in CONTAINERS:
            return CONTAINERS[shown]
        raise BadInputError(f"source {self.name!r} is not a video in a container the cloud opens ({', '.join(CONTAINERS)})")

    @property
    def through(self) -> str:
        """A path that opens the file opened, whatever its name is now: its descriptor's."""
        return f"/proc/self/fd/{self.fd}"

    def open(self):
        """A PyAV container of the file, reading through its own descriptor of the file opened."""
        av = import_av()
        reader = os.fdopen(os.open(self.through, os.O_RDONLY | os.O_CLOEXEC), "rb")
        try:
            return av.open(reader, format=self.format, options=_DEMUXER_OPTIONS)
        except (av.error.FFmpegError, ValueError, OSError) as exc:  # OSError: PyAV's seek in a file cut to nothing since
            reader.close()
            shown = self_contained(os.pread(self.fd, 12, 0))
            if CONTAINERS.get(shown) != self.format:  # changed since it was opened (cut to nothing)
                raise BadInputError(f"{self.name}: not a readable video ({exc})") from None
            # Its first bytes name the container it was opened as: damaged, as a local run says of such a file.
            raise BadInputError(f"{self.name}: its first bytes say {shown}, which FFmpeg cannot read ({getattr(exc, 'strerror', None) or exc}): "
                                f"the file is damaged or cut short{MOOV if self.format == 'mov' else ''}") from None

    def clip(self, max_pixels: int | None) -> VideoClip:
        """The source as a local run reads a video (:class:`~eden_serve.media.video.VideoClip`),
        opened as :meth:`open` opens it and named by its name."""
        return VideoClip(Path(self.name), max_pixels, self.open(), reopen=self.open)


class SourceVideo:
    """A server-side video: its :meth:`probe` and the frames of a range (:meth:`read`)."""

    def __init__(self, source: SourceFile | Path, max_pixels: int, work: Work = Work()):
        """``source``: opened under the media root, or a path (its directory as the root)."""
        self.source = source if isinstance(source, SourceFile) else SourceFile(Path(source).parent, Path(source).name)
        self.work = work
        self.scan = scan(self.source, max_pixels, work.source_packets)
        self.started = time.monotonic()  # the request's: its reads share the deadline
        self.pixels = self.scan.width * self.scan.height
        self.decoded = 0  # pictures the last read decoded up to its last: what a seek and a skip saved show here
        self.pictures = 0  # pictures shown from where it started decoding to its last, decoded or left out

    def probe(self) -> dict:
        """What a client plans a run with: the frame count, rate, size, colour, the file's streams and
        labels, and what its output leaves out, which a client says: the dynamic HDR metadata, and
        VP8's or VP9's alpha, which a page's packets do not carry (Matroska holds it beside them);
        what its decoder takes from the container (:func:`~.scans._decoding`); and when the video and
        the file's first stream start, which a local run moves its output by (:func:`~eden_serve.media.containers.lead`)."""
        s = self.scan
        return {"frames": s.frames, "rate": str(s.rate), "time_base": str(s.time_base), "width": s.width, "height": s.height,
                "codec": s.codec, "pix_fmt": s.pix_fmt, "colour": s.colour.fields(), "video_bytes": s.video_bytes,
                "key_frames": len(s.starts), "bytes": self.source.size, "streams": s.streams,
                "display_matrix": s.display_matrix and list(s.display_matrix), "sample_aspect_ratio": s.aspect and str(s.aspect),
                "labels": s.labels.fields(), "dynamic_hdr": list(s.dynamic_hdr), "alpha_left_out": s.alpha_left_out,
                "decoding": dict(s.decoding), "start": _seconds(s.start), "streams_start": _seconds(s.earliest),
                "stated": s.stated}

    def clip(self, max_pixels: int | None) -> VideoClip:
        """The source as a local run reads a video, with the colour its probe states."""
        clip = self.source.clip(max_pixels)
        clip.colour = self.scan.colour
        return clip

    def read(self, first: int, count: int) -> list[np.ndarray]:
        """Frames ``first`` ... ``first + count - 1`` (display order) as RGB pixels (8-bit, or 16-bit
        for a deeper video), converted as :class:`~eden_serve.media.video.VideoClip` converts them."""
        total = self.scan.frames
        if first < 0 or count < 1 or first + count > total:
            raise BadInputError(f"frames {first} to {first + count - 1} asked for, but {self.source.name} holds {total} "
                                f"(0 to {total - 1})")
        times = self.scan.times
        if times is None:  # no time stamps to match: count frames from the start
            return self._decode(None, first, count)
        wanted = times[first:first + count]
        if hidden := [first + i for i, stamp in enumerate(wanted) if stamp in self.scan.hidden]:  # never decoded: refused before the work
            raise BadInputError(f"frames {first} to {first + count - 1} asked for, but frame {hidden[0]} of {self.source.name} is "
                                "hidden by its edit list (its container discards it; a local run never shows it)")
        at = bisect.bisect_right(self.scan.starts, wanted[0]) - 1
        frames = self._decode(self.scan.starts[at], first, count, wanted) if at > 0 else None
        return frames or self._decode(None, first, count, wanted)

    def _decode(self, seek: int | None, first: int, count: int, wanted: list[int] | None = None) -> list[np.ndarray] | None:
        """The frames asked for, decoding from the key frame the demuxer seeks to at or before
        ``seek`` (None: from the start), or on from the file's last range (:mod:`.ranges`); None
        where frames asked for were not met (a seek that landed past them)."""
        av = import_av()
        self.decoded = self.pictures = 0
        if seek is None or wanted is None:  # from the start: up to the last frame asked for
            self._decoding(first + count)
        else:  # from the key frame: the frames shown from it to the last one asked for
            self._decoding(bisect.bisect_right(self.scan.times, wanted[-1]) - bisect.bisect_left(self.scan.times, seek))
        try:
            found = self._counted(first, count) if wanted is None else self._timed(seek, wanted)
        except av.error.FFmpegError as exc:
            raise BadInputError(f"{self.source.name}: cannot decode the video ({exc})") from None
        keys = range(first, first + count) if wanted is None else wanted
        if len(found) < count:
            if seek is not None:
                return None
            raise BadInputError(f"{self.source.name}: frames {first} to {first + count - 1} do not all decode")
        return [found[key] for key in keys]

    def _counted(self, first: int, count: int) -> dict[int, np.ndarray]:
        """Frames ``first`` to ``first + count - 1`` counted from the start (a stream without times)."""
        found: dict[int, np.ndarray] = {}
        with self.source.open() as container:
            stream = main_video(container, self.source.name)
            stream.thread_type = "AUTO"
            for i, frame in enumerate(container.decode(stream)):
                self.decoded = self.pictures = i + 1
                self._decoding(self.decoded)
                if i >= first:
                    self._sized(frame, i)
                    found[i] = rgb(frame)
                if len(found) == count:
                    break
        return found

    def _timed(self, seek: int | None, wanted: list[int]) -> dict[int, np.ndarray]:
        """The frames of the time stamps ``wanted``, on from the file's cursor where it reaches them
        at no more cost, else from the key frame at or before ``seek``. The work bound counts every
        picture read that is shown up to the range's last, decoded or left out."""
        cursor = CURSORS.take(self.source.key, seek, wanted[0]) or Cursor(self.source.open(), seek)
        try:
            given = cursor.read(wanted, self._read_one)
            for stamp, frame in given.items():
                self._sized(frame, bisect.bisect_left(self.scan.times, stamp))
        except BaseException:
            cursor.close()
            raise
        self.decoded = cursor.decoded
        pixels: dict[int, np.ndarray] = {}
        if cursor.ended or len(given) < len(wanted):
            cursor.close()
        else:
            # The range's last frame stays held for the next range, which another request may take
            # as soon as the cursor is given: converted before. PyAV converts a frame through a
            # converter kept on it, and two threads converting one frame at once hang in swscale.
            held = {id(frame) for frame in cursor.held}
            pixels = {stamp: rgb(frame) for stamp, frame in given.items() if id(frame) in held}
            CURSORS.give(self.source.key, cursor)
        return {stamp: pixels[stamp] if stamp in pixels else rgb(frame) for stamp, frame in given.items()}

    def _sized(self, frame, index: int) -> None:
        """Refuses a frame of another size than the video's, which the request was judged by (a
        stream whose pictures change size midway): before, the chunk's frames failed to stack,
        an internal error (500) that the client asked again four times."""
        if (frame.width, frame.height) != (self.scan.width, self.scan.height):
            raise BadInputError(f"{self.source.name}: frame {index} is {frame.width}x{frame.height}, unlike the video's frames "
                                f"before it ({self.scan.width}x{self.scan.height}): frames differ in size")

    def _read_one(self) -> None:
        self.pictures += 1
        self._decoding(self.pictures)

    def _decoding(self, frames: int) -> None:
        self.work.check(frames * self.pixels, self.work.decoded_pixels,
                        f"{frames} frames of {self.scan.width}x{self.scan.height} to decode", "max_decoded_pixels")
        self._in_time()

    def _demuxing(self, packets: int) -> None:
        self.work.check(packets, self.work.demuxed_packets, f"{packets} packets to read before the page", "max_demuxed_packets")
        self._in_time()

    def _in_time(self) -> None:
        seconds = time.monotonic() - self.started
        self.work.check(seconds, self.work.deadline_s, f"{seconds:.1f} s of reading {self.source.name}", "decode_deadline_s")

    def page(self, index: int | None, start: int, after: tuple | None = None) -> Page:
        """Packets ``start`` ... of stream ``index`` (None: the video), in the file's order, as
        many as a page holds (:mod:`eden_serve.wire.pages`). ``after``: (pts, dts, size) of packet ``start - 1``,
        which the demuxer seeks to rather than reading the stream from its start; where it is not
        met there, the stream is read from its start."""
        stamp = None if after is None else after[1] if after[1] is not None else after[0]
        found = self._page(index, start, after, stamp) if start and stamp is not None else None
        return found or self._page(index, start, None, None)

    def _page(self, index: int | None, start: int, after: tuple | None, stamp: int | None) -> Page | None:
        av = import_av()
        self.demuxed = 0  # packets read for the last page: what a seek saved shows here
        if after is None:  # read from the stream's start
            self._demuxing(start)
        try:
            with self.source.open() as container:
                streams = container.streams
                if index is None:
                    index = main_video(container, self.source.name).index
                if not 0 <= index < len(streams) or streams[index].type not in ("video", "audio", "subtitle"):
                    raise BadInputError(f"{self.source.name} has no video, audio or subtitle stream {index}")
                stream = streams[index]
                # The scanned video's dts, as read from the start: Matroska stores none, and after a
                # seek FFmpeg's guess of them is none for the first packets (B-frames), where the
                # client's, from pages read from the start, are known (:meth:`~.scans.Scan`).
                decoded_at = self.scan.decoded_at if index == main_video(container, self.source.name).index else None
                if after is not None:
                    container.seek(stamp, stream=stream, backward=True)
                packets, size, following, n = [], 0, None, None if after is not None else 0
                for packet in until_failure(container.demux(stream)):  # a failing demuxer ends the stream, as the scan has it
                    if not packet.size:
                        continue
                    self.demuxed += 1
                    self._demuxing(self.demuxed - len(packets))  # the packets read past to reach the page
                    if n is None:  # still looking for the packet before the page
                        if _is(packet, after, decoded_at is not None and self.scan.times is not None):
                            n = start
                        elif packet.dts is None and decoded_at is not None and after[1] is not None:
                            continue  # not yet known after the seek: the demuxer's guess follows in a few packets
                        elif (packet.dts if packet.dts is not None else packet.pts or 0) > stamp:
                            return None
                        continue
                    if n >= start:
                        if len(packets) == MAX_PAGE_PACKETS or (packets and size + packet.size > MAX_PAGE_BYTES):
                            following = n
                            break
                        dts = decoded_at[n] if decoded_at is not None and n < len(decoded_at) else packet.dts
                        packets.append(Packet(bytes(packet), packet.pts, dts, packet.duration or 0, packet.is_keyframe, skips(packet),
                                              packet.is_discard))
                        size += packet.size
                    n += 1
                if n is None:
                    return None
                return Page(_parameters(stream), bytes(stream.codec_context.extradata or b""), packets, following)
        except av.error.FFmpegError as exc:
            raise BadInputError(f"{self.source.name}: cannot read stream {index}'s packets ({exc})") from None


def _is(packet, after: tuple, unique: bool) -> bool:
    """Whether ``packet`` is the one ``after`` names by its (pts, dts, size); where its dts is not
    known after a seek, by its pts and size alone, in a stream whose time stamps are ``unique``
    (the scanned video's: :func:`~.scans._scan` refuses two frames at one time)."""
    if (packet.pts, packet.dts, packet.size) == after:
        return True
    return unique and packet.dts is None and packet.pts is not None and (packet.pts, packet.size) == (after[0], after[2])


def _seconds(time: Fraction | None) -> str | None:
    return None if time is None else str(time)


def _parameters(stream) -> dict:
    """What a client needs to decode (video) or mux (audio, subtitles) a stream's packets."""
    context = stream.codec_context
    found = {"index": stream.index, "type": stream.type, "codec": context.name, "time_base": str(stream.time_base)}
    if stream.type == "video":
        found |= {"width": context.width, "height": context.height, "pix_fmt": context.format.name if context.format else ""}
    elif stream.type == "audio":
        found |= {"sample_rate": context.sample_rate, "layout": context.layout.name, "format": context.format.name}
    return found

"""What is read of a video file besides its frames: the container its first bytes show, for a file
from someone else (a page's upload, a cloud's source); its first frame, whose side data holds
HDR10's metadata and the display matrix, within a bounded read; the dynamic HDR metadata it carries
(HDR10+, Dolby Vision), which no output keeps; whether it is interlaced; and its labels (title,
chapters, the video's language), which the output keeps."""

from __future__ import annotations

import io
import re
import struct
import warnings
from dataclasses import dataclass
from fractions import Fraction

from ..errors import BadInputError
from . import inband
from .encoding import import_av, side_data

# What FFmpeg's command line counts a stream's "default" flag as, in pixels, when it chooses a video stream.
DEFAULT_STREAM_PIXELS = 5_000_000
FIRST_FRAME_PACKETS = 64  # read at most for the first frame's HDR metadata: more than any reordering holds back


def self_contained(start: bytes) -> str | None:
    """The container that a file's first 12 bytes show, among those that hold their media
    themselves: None for anything else, playlists (HLS) and concatenation lists above all, which
    name other files for the demuxer to open. For a file from someone else, checked before FFmpeg
    probes it, since probing alone opens what a list names."""
    if start[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip", b"pnot"):
        return "MP4 or MOV"
    signatures = {b"\x1a\x45\xdf\xa3": "Matroska or WebM", b"YUV4MPEG2": "Y4M", b"FLV": "FLV", b"OggS": "Ogg",
                  b"\x00\x00\x01\xba": "MPEG-PS", b"GIF87a": "GIF", b"GIF89a": "GIF", b"\x89PNG": "PNG"}
    for signature, name in signatures.items():
        if start.startswith(signature):
            return name
    if start.startswith(b"RIFF") and start[8:12] in (b"AVI ", b"WEBP"):
        return "AVI" if start[8:12] == b"AVI " else "WebP"
    if start[:1] == b"\x47":  # MPEG-TS: a sync byte every 188 bytes, which the demuxer checks itself
        return "MPEG-TS"
    return None


def main_video(container, name: str):
    """The video stream of ``container`` (a file called ``name``) that a player shows, as FFmpeg's
    command line chooses it: of the streams FFmpeg can decode, not a cover picture, the largest, the
    default one counting 5 million pixels more; the first of equals. Every opening of one file
    chooses the same stream.

    BadInputError where there is none: no video stream, only cover pictures (an MP3's), or only
    streams whose codec FFmpeg does not know or whose parameters a damaged file lost."""
    av = import_av()
    video = container.streams.video
    if not video:
        raise BadInputError(f"{name}: has no video stream")
    moving = [s for s in video if not s.disposition & av.stream.Disposition.attached_pic]
    if not moving:
        raise BadInputError(f"{name}: has no video stream, only a cover picture")
    usable = [s for s in moving if s.codec_context is not None]
    if not usable:
        raise BadInputError(f"{name}: its video cannot be decoded: its codec is unknown to FFmpeg here, or the "
                            "file is damaged (cut short before the codec's parameters)")
    default = av.stream.Disposition.default
    return max(usable, key=lambda s: (s.codec_context.width * s.codec_context.height
                                      + DEFAULT_STREAM_PIXELS * bool(s.disposition & default), -s.index))


def first_frame(container):
    """The first frame of ``container``'s video, whose side data holds HDR10's metadata, or None where
    its first :data:`FIRST_FRAME_PACKETS` packets give none (a file from elsewhere bounds the work)."""
    return first_look(container)[0]


def first_look(container, decode: bool = True) -> tuple:
    """What the first packets of ``container``'s video show: its first frame (:func:`first_frame`;
    None where not ``decode``), and the dynamic HDR metadata its first :data:`inband.PACKETS`
    packets carry in band (Dolby Vision's RPUs, HDR10+'s messages, :mod:`.inband`), named."""
    try:
        stream = main_video(container, "")
    except BadInputError:
        return None, ()
    # The codec's name, not its decoder's: an AV1 stream's decoder is libdav1d.
    kind, extradata = stream.codec_context.codec.canonical_name, bytes(stream.codec_context.extradata or b"")
    frame, named, looked = None, [], 0
    try:
        for n, packet in enumerate(container.demux(stream)):
            if n == FIRST_FRAME_PACKETS or (frame is not None or not decode) and looked == inband.PACKETS:
                break
            if packet.size and looked < inband.PACKETS:
                looked += 1
                named += inband.in_band(kind, bytes(packet), extradata)
            for decoded in packet.decode() if decode and frame is None else ():
                frame = decoded
                break
    except import_av().error.FFmpegError:
        pass
    return frame, tuple(dict.fromkeys(named))


# A frame's side data that is dynamic HDR metadata (per-scene or per-frame tone mapping): HDR10+ (SMPTE
# ST 2094-40, from HEVC's SEI or AV1's metadata), Dolby Vision's RPU, HDR Vivid (CUVA 005.1).
DYNAMIC_SIDE_DATA = {"DYNAMIC_HDR_PLUS": "HDR10+", "DOVI_RPU_BUFFER": "Dolby Vision", "DOVI_METADATA": "Dolby Vision",
                     "DYNAMIC_HDR_VIVID": "HDR Vivid"}
# A Dolby Vision configuration record as FFmpeg's Matroska muxer writes it: BlockAddIDType (4 bytes:
# dvcC, dvvC or dvwC by profile), then BlockAddIDExtraData (its 24 bytes).
_DOVI_TYPE = re.compile(rb"\x41\xe7\x84dv[cvw]C\x41\xed\x98(.{24})", re.DOTALL)


def dolby_vision(stream) -> int | None:
    """The Dolby Vision profile of a video ``stream`` whose container states a configuration record
    (MP4's and MOV's ``dvcC``/``dvvC``, Matroska's BlockAdditionMapping, MPEG-TS's descriptor); None
    where it states none. PyAV 18 exposes no stream's side data, where FFmpeg's demuxers put the
    record, so a Matroska header of the stream alone is written in memory, from which its muxer
    writes the record back, and read there."""
    av = import_av()
    written = io.BytesIO()
    try:
        with av.open(written, "w", format="matroska") as output:
            output.add_stream_from_template(stream, opaque=True)
            output.start_encoding()  # the header alone: no packet is read or written
    except (av.error.FFmpegError, ValueError):
        return None
    found = _DOVI_TYPE.search(written.getvalue())
    return found.group(1)[2] >> 1 if found else None


def dynamic_hdr(stream, frame, in_band: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The dynamic HDR metadata a video ``stream``, its first ``frame`` (None: not read) and its
    first packets (``in_band``, :func:`first_look`'s) carry, named."""
    names = [DYNAMIC_SIDE_DATA[d.type.name] for d in side_data(frame) if d.type.name in DYNAMIC_SIDE_DATA]
    if "Dolby Vision" not in names and (profile := dolby_vision(stream)) is not None:
        names.append(f"Dolby Vision (profile {profile})")
    # RPUs with no record: named without a profile, which is the RPU's to say and not read here.
    dolby = any(name.startswith(inband.DOLBY_VISION) for name in names)
    names += [name for name in in_band if not (dolby and name == inband.DOLBY_VISION)]
    return tuple(dict.fromkeys(names))


def display_matrix(frame) -> tuple[int, ...] | None:
    """A decoded frame's display matrix (a phone's rotation, a mirror), where it carries one."""
    kind = import_av().sidedata.sidedata.Type.DISPLAYMATRIX
    data = next((bytes(d) for d in side_data(frame) if d.type == kind), None) if frame else None
    return struct.unpack("<9i", data) if data is not None and len(data) == 36 else None


def frame_rate(stream) -> Fraction:
    """A video stream's frame rate: its average, unless the demuxer states its clock for it, a frame
    every tick, above the rate its frames are stamped at (FFmpeg 8's raw DV demuxer states 60000
    frames a second, its 1/60000 clock, for a 25 fps video); then that rate, as FFmpeg's command
    line guesses it."""
    average, guessed, tick = stream.average_rate, stream.guessed_rate, stream.time_base
    if average and guessed and tick and average > guessed and average * tick >= 1:
        return Fraction(guessed)
    return Fraction(average or guessed or 25)


def pixel_aspect(stream) -> Fraction | None:
    """A video stream's sample aspect ratio (anamorphic pixels), as FFmpeg's command line reads it:
    the container's (an MP4's or MOV's ``pasp``), else the codec's. ProRes, DNxHD and raw video keep
    theirs in the container alone, which their decoder's context leaves out."""
    aspect = stream.sample_aspect_ratio  # av_guess_sample_aspect_ratio
    return Fraction(aspect) if aspect else None


# The muxers that write a stream's display matrix (the ISO family's track matrix, Matroska's projection).
DISPLAY_MATRIX_FORMATS = {"mov", "mp4", "3gp", "3g2", "ipod", "ismv", "f4v", "matroska", "webm"}


def show_as(output, stream, matrix: tuple[int, ...] | None) -> None:
    """Tell the ``output``'s video ``stream`` to be shown by ``matrix`` (the input's rotation or mirror),
    where it carries one; an output with no place for it is said in one warning: its pictures are
    stored as the input's (a phone's sideways), so a player shows them unturned."""
    if matrix is None:
        return
    stream.set_display_matrix(matrix)
    if output.format.name not in DISPLAY_MATRIX_FORMATS and matrix != (65536, 0, 0, 0, 65536, 0, 0, 0, 1 << 30):
        warnings.warn(f"the output ({output.format.name}) has no place for the input's display matrix (a rotation or "
                      "mirror a player applies): its pictures are shown as stored, unturned; write MP4, MOV or Matroska "
                      "to keep it")


# Where an output keeps a pixel aspect ratio: the ISO family's muxers write it (``pasp``) for any codec,
# the others only inside a stream that states it (Matroska's muxer takes it from a stream field PyAV
# does not set: VP9, AV1, FFV1 or ProRes in Matroska, FFV1 in AVI or NUT, and Y4M lose it).
ASPECT_FORMATS = {"mov", "mp4", "3gp", "3g2", "ipod", "ismv", "f4v"}
ASPECT_CODECS = {"h264", "hevc", "mpeg4", "mpeg1video", "mpeg2video", "mjpeg", "h263", "h263p", "dvvideo", "gif", "png", "apng"}


def shaped_as(output, stream, aspect: Fraction | None) -> None:
    """Give the ``output``'s video ``stream`` the input's pixel ``aspect`` ratio, where it has one; an
    output that has no place for it is said in one warning, as a player then shows the picture squeezed."""
    if not aspect:
        return
    stream.codec_context.sample_aspect_ratio = aspect
    codec = stream.codec_context.codec.canonical_name
    if aspect != 1 and output.format.name not in ASPECT_FORMATS and (codec not in ASPECT_CODECS or output.format.name == "yuv4mpegpipe"):
        warnings.warn(f"the output ({output.format.name}, {codec}) has no place for the input's pixel aspect ratio "
                      f"{aspect.numerator}:{aspect.denominator}: a player shows its picture squeezed; write MP4 or MOV, "
                      "or H.264 or HEVC, to keep it")


def stream_start(stream) -> Fraction | None:
    """When ``stream``'s first frame is shown, in seconds, as the container states it (None: not stated)."""
    return None if stream.start_time is None or not stream.time_base else stream.start_time * stream.time_base


def container_start(container) -> Fraction | None:
    """When the file's first stream starts, in seconds, as the container states it (None: not stated)."""
    start = getattr(container, "start_time", None)  # in microseconds
    return None if start is None else Fraction(start, 1_000_000)


def lead(clip) -> Fraction:
    """How much later the output's streams and chapters are moved than the input's (FFmpeg's
    ``output_ts_offset``), all alike, so that they keep their distances:
    - a video whose first frame is shown before time 0 (an MPEG-TS whose clock wrapped within it,
      every 26.5 hours) is moved that much later, so that it starts at 0, where an MP4 or MOV starts
      showing: their edit list made a player, and FFmpeg, drop every frame before it;
    - a file whose every stream starts late (an MPEG-TS recording or an HLS segment, whose clock
      starts anywhere) is moved earlier, so that its first stream starts at 0, as FFmpeg's command
      line moves it: a 0.2 s clip of a broadcast 600 s into its clock lasted 600.2 s in Matroska,
      nothing shown before its end. A stream that starts after another (an MP4's video after its
      audio) keeps its distance."""
    start = getattr(clip, "start", None)
    if start is None:
        return Fraction(0)
    if start < 0:
        return -start
    earliest = getattr(clip, "earliest", None)  # of every stream: the container's start time
    return -min(start, earliest) if earliest is not None and earliest > 0 else Fraction(0)


def tag_for_players(output, stream) -> None:
    """HEVC in MP4 or MOV tagged ``hvc1`` (its parameter sets in the sample entry), not FFmpeg's
    default ``hev1``: Apple's players (QuickTime, Safari, iOS and macOS) play only ``hvc1``, which an
    iPhone's clips are, and which every other player reads too; an input they played came back one
    they refused (FFmpeg's command line alike, unless told ``-tag:v hvc1``)."""
    if stream.codec_context.codec.canonical_name == "hevc" and output.format.name in ASPECT_FORMATS:
        stream.codec_context.codec_tag = "hvc1"


# Tags that a muxer writes itself, or that describe the input's encoding and would be wrong for the
# output's: an MP4's brands, the encoder's name, Matroska's statistics (the input's frame and byte
# counts, its bit rate), each maybe with a language after a dash.
ENCODING_TAGS = re.compile(r"(major_brand|minor_version|compatible_brands|encoder|duration|bps|number_of_frames"
                           r"|number_of_bytes|_statistics_\w+)(-\w+)?", re.IGNORECASE)


# What a cloud's probe states of a source's labels, at most: whatever is past it is left out there
# and refused from a cloud here, so a hostile cloud writes no unbounded labels into the output.
MAX_TAGS = 64  # in one set: the container's, the video's, a chapter's
MAX_CHAPTERS = 256
MAX_LABEL_CHARACTERS = 1 << 16  # of every tag's name and value together


def _kept(tags) -> dict:
    return {k: v for k, v in tags.items() if not ENCODING_TAGS.fullmatch(k)}


@dataclass(frozen=True)
class Labels:
    """The input's labels that an output keeps, as FFmpeg's command line keeps them: the container's
    tags (title, date, comment...) and chapters, its video stream's tags (language, title) and
    flags; not the tags of the input's own encoding (:data:`ENCODING_TAGS`). The output's frames
    have the input's times, so each chapter starts and ends where it did."""

    tags: dict[str, str]
    video_tags: dict[str, str]
    disposition: int
    chapters: list[dict]  # PyAV's: id, start, end, time_base (a Fraction), metadata

    @classmethod
    def of(cls, source, video) -> Labels:
        """The labels of the ``source`` container and its ``video`` stream. An MP4's or MOV's track
        title (its ``udta`` ``name``) is read by FFmpeg as ``name``, which no muxer writes (MP4's
        and MOV's write ``title`` there): it is kept as the title."""
        video_tags = _kept(video.metadata)
        if "mov" in source.format.name.split(",") and "name" in video_tags and "title" not in video_tags:
            video_tags["title"] = video_tags.pop("name")
        return cls(_kept(source.metadata), video_tags, int(video.disposition), source.chapters())

    def apply(self, output, stream, later: Fraction = Fraction(0)) -> None:
        """Onto the ``output`` container and its video ``stream``, the chapters ``later`` seconds
        later (where the output's streams are moved so); moved earlier, one that would start before
        0 starts there, and one that would end there is left out, as FFmpeg's command line moves them
        (Matroska's muxer refuses a chapter before 0)."""
        output.metadata.update(self.tags)
        stream.metadata.update(self.video_tags)
        stream.disposition = self.disposition
        if self.chapters:
            moved = [c | {"start": max(0, c["start"] + round(later / c["time_base"])), "end": c["end"] + round(later / c["time_base"])}
                     for c in self.chapters]
            output.set_chapters([c for c in moved if c["end"] > 0])

    def fields(self) -> dict:
        """As JSON, within the bounds :meth:`from_fields` checks: what is past them is left out."""
        room = [MAX_LABEL_CHARACTERS]

        def bounded(tags: dict) -> dict:
            kept = {}
            for k, v in tags.items():
                if len(kept) < MAX_TAGS and isinstance(k, str) and isinstance(v, str) and len(k) + len(v) <= room[0]:
                    kept[k], room[0] = v, room[0] - len(k) - len(v)
            return kept

        tags, video_tags = bounded(self.tags), bounded(self.video_tags)  # before the chapters': the title first
        chapters = [{"id": c["id"], "start": c["start"], "end": c["end"], "tags": bounded(c["metadata"]),
                     "time_base": f"{c['time_base'].numerator}/{c['time_base'].denominator}"} for c in self.chapters[:MAX_CHAPTERS]]
        return {"tags": tags, "video_tags": video_tags, "disposition": self.disposition, "chapters": chapters}

    @classmethod
    def from_fields(cls, fields) -> Labels:
        """The labels that :meth:`fields` states; ValueError naming what is wrong or past the bounds."""
        if not isinstance(fields, dict) or set(fields) != {"tags", "video_tags", "disposition", "chapters"}:
            raise ValueError("labels must hold exactly tags, video_tags, disposition and chapters")
        chapters, room = fields["chapters"], [MAX_LABEL_CHARACTERS]

        def tags(value, what: str) -> dict:
            if not isinstance(value, dict) or len(value) > MAX_TAGS or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise ValueError(f"{what} must be at most {MAX_TAGS} tags, names and values strings")
            room[0] -= sum(len(k) + len(v) for k, v in value.items())
            if room[0] < 0:
                raise ValueError(f"the tags hold more than {MAX_LABEL_CHARACTERS} characters")
            return _kept(value)

        if type(fields["disposition"]) is not int or not 0 <= fields["disposition"] < 1 << 31:
            raise ValueError("disposition must be a 31-bit integer")
        if not isinstance(chapters, list) or len(chapters) > MAX_CHAPTERS:
            raise ValueError(f"chapters must be a list of at most {MAX_CHAPTERS}")
        return cls(tags(fields["tags"], "tags"), tags(fields["video_tags"], "video_tags"), fields["disposition"],
                   [_chapter(c, tags) for c in chapters])


def _chapter(fields, tags) -> dict:
    if not isinstance(fields, dict) or set(fields) != {"id", "start", "end", "time_base", "tags"} or not all(
            type(fields[k]) is int and -1 << 63 <= fields[k] < 1 << 63 for k in ("id", "start", "end")):
        raise ValueError("a chapter must hold exactly id, start, end (integers), time_base and tags")
    base = fields["time_base"]
    if not isinstance(base, str) or not re.fullmatch(r"[1-9][0-9]{0,9}/[1-9][0-9]{0,9}", base):
        raise ValueError(f"a chapter's time base must be a fraction a/b, got {str(base)[:20]!r}")
    return {"id": fields["id"], "start": fields["start"], "end": fields["end"], "time_base": Fraction(base),
            "metadata": tags(fields["tags"], "a chapter's tags")}


def copy_labels(source, video, output, stream, later: Fraction = Fraction(0)) -> None:
    """The ``source`` container's labels and its ``video`` stream's (:class:`Labels`) onto
    ``output`` and its video ``stream``, the chapters ``later`` seconds later."""
    Labels.of(source, video).apply(output, stream, later)


# FFmpeg's field orders (AVFieldOrder) of a stream whose frames are not whole pictures: top or bottom field first.
INTERLACED = {2: "top field first", 3: "bottom field first", 4: "top field first", 5: "bottom field first"}


def say_interlaced(stream, path) -> None:
    """One warning where the video is interlaced: the model takes each frame as one picture, both
    fields woven, so a middle's moving edges comb, and the output is written as progressive video."""
    order = INTERLACED.get(stream.codec_context.field_order)
    if order is not None:
        warnings.warn(f"{path}: the video is interlaced ({order}): its middles are made of whole frames, fields woven, "
                      f"so moving edges comb; deinterlace it first (FFmpeg's bwdif or yadif filter) for clean middles")

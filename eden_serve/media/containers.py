"""What is read of a video file besides its frames: the container its first bytes show, for a file
from someone else (a page's upload, a cloud's source); its first frame, whose side data holds
HDR10's metadata and the display matrix, within a bounded read; whether it is interlaced; and its
labels (title, chapters, the video's language), which the output keeps."""

from __future__ import annotations

import re
import struct
import warnings

from ..errors import BadInputError
from .encoding import import_av

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
    try:
        stream = main_video(container, "")
    except BadInputError:
        return None
    try:
        for n, packet in enumerate(container.demux(stream)):
            if n == FIRST_FRAME_PACKETS:
                return None
            for frame in packet.decode():
                return frame
    except import_av().error.FFmpegError:
        return None
    return None


def display_matrix(frame) -> tuple[int, ...] | None:
    """A decoded frame's display matrix (a phone's rotation, a mirror), where it carries one."""
    kind = import_av().sidedata.sidedata.Type.DISPLAYMATRIX
    data = next((bytes(d) for d in getattr(frame, "side_data", ()) if d.type == kind), None) if frame else None
    return struct.unpack("<9i", data) if data is not None and len(data) == 36 else None


# Tags that a muxer writes itself, or that describe the input's encoding and would be wrong for the
# output's: an MP4's brands, the encoder's name, Matroska's statistics (the input's frame and byte
# counts, its bit rate), each maybe with a language after a dash.
ENCODING_TAGS = re.compile(r"(major_brand|minor_version|compatible_brands|encoder|duration|bps|number_of_frames"
                           r"|number_of_bytes|_statistics_\w+)(-\w+)?", re.IGNORECASE)


def copy_labels(source, video, output, stream) -> None:
    """The ``source`` container's tags (title, date, comment...) and chapters onto ``output``, and its
    ``video`` stream's tags (language, title) and flags onto the output's video ``stream``, as
    FFmpeg's command line keeps them; not the tags of the input's own encoding (:data:`ENCODING_TAGS`).
    The output's frames have the input's times, so each chapter starts and ends where it did."""
    output.metadata.update({k: v for k, v in source.metadata.items() if not ENCODING_TAGS.fullmatch(k)})
    stream.metadata.update({k: v for k, v in video.metadata.items() if not ENCODING_TAGS.fullmatch(k)})
    stream.disposition = video.disposition
    chapters = source.chapters()
    if chapters:
        output.set_chapters(chapters)


# FFmpeg's field orders (AVFieldOrder) of a stream whose frames are not whole pictures: top or bottom field first.
INTERLACED = {2: "top field first", 3: "bottom field first", 4: "top field first", 5: "bottom field first"}


def say_interlaced(stream, path) -> None:
    """One warning where the video is interlaced: the model takes each frame as one picture, both
    fields woven, so a middle's moving edges comb, and the output is written as progressive video."""
    order = INTERLACED.get(stream.codec_context.field_order)
    if order is not None:
        warnings.warn(f"{path}: the video is interlaced ({order}): its middles are made of whole frames, fields woven, "
                      f"so moving edges comb; deinterlace it first (FFmpeg's bwdif or yadif filter) for clean middles")

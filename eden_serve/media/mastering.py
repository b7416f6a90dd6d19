"""HDR10's metadata written by the container, for the encoders whose stream has no place for it
(FFV1, VP9, ProRes): docs/video.md, "Depth and colour".

The Matroska, MP4 and MOV muxers write a stream's mastering display and content light level
(Matroska's MasteringMetadata and MaxCLL, MP4's and MOV's ``mdcv`` and ``clli``) from its coded side
data, which PyAV 18 cannot set. FFmpeg's Matroska demuxer makes that side data of the Colour element it reads, and
``avcodec_parameters_to_context`` copies it into a new encoder's context (FFmpeg 7 and later), where
``avcodec_parameters_from_context`` takes it to the output stream as PyAV starts the file. So the
output stream is made from a template: the one track of a Matroska header written here, holding
only the codec, the size and the Colour element. No frame of it is read. PyAV makes the stream's
encoder the template's codec's first (FFmpeg's ``prores``, not ``prores_ks`` or ``prores_aw``):
another encoder of the codec keeps its own stream, and the metadata is left out, said in one line.
"""

from __future__ import annotations

import io
import struct
from dataclasses import replace

from .colour import PARAMS_OPTION, Colour
from .encoding import import_av

# Output formats whose muxer writes HDR10's metadata from a stream's side data.
HOLDING = {"matroska", "webm", "mp4", "mov"}
# Matroska's codec ID of each encoder that has no place for the metadata in its stream.
CODEC_IDS = {"ffv1": "V_FFV1", "libvpx-vp9": "V_VP9", "prores": "V_PRORES"}


def _element(key: int, payload: bytes) -> bytes:
    """An EBML element: its ID, its size as an 8-byte variable-length integer, its payload."""
    return key.to_bytes((key.bit_length() + 7) // 8, "big") + (len(payload) | 1 << 56).to_bytes(8, "big") + payload


def _uint(key: int, value: int) -> bytes:
    return _element(key, value.to_bytes(8, "big"))


def _float(key: int, value) -> bytes:
    return _element(key, struct.pack(">d", float(value)))


def template(colour: Colour, codec_id: str, width: int, height: int) -> bytes:
    """A Matroska header of one video track of ``codec_id`` whose Colour element states ``colour``'s
    metadata; the tags are the encoder's to state, as for any output."""
    found = b""
    if colour.light:
        found += _uint(0x55BC, colour.light[0]) + _uint(0x55BD, colour.light[1])  # MaxCLL, MaxFALL
    if colour.mastering:
        m = colour.mastering
        points = [*m.red, *m.green, *m.blue, *m.white, m.luminance[1], m.luminance[0]]
        found += _element(0x55D0, b"".join(_float(0x55D1 + i, value) for i, value in enumerate(points)))
    video = _uint(0xB0, width) + _uint(0xBA, height) + _element(0x55B0, found)
    track = _uint(0xD7, 1) + _uint(0x73C5, 1) + _uint(0x83, 1) + _element(0x86, codec_id.encode()) + _element(0xE0, video)
    header = _element(0x1A45DFA3, _element(0x4282, b"matroska") + _uint(0x4287, 4) + _uint(0x4285, 2))
    segment = _element(0x1549A966, _uint(0x2AD7B1, 1000000)) + _element(0x1654AE6B, _element(0xAE, track))
    return header + _element(0x18538067, segment + _element(0x1F43B675, _uint(0xE7, 0)))  # and an empty cluster


def add_video_stream(container, name: str, rate, colour: Colour, size: tuple[int, int]):
    """A new stream of encoder ``name`` (at ``rate``, ``size`` width and height) in the output
    ``container``, and the colour left for its encoder to write: where the encoder has no place for
    HDR10's metadata and the container has, the stream is made from a :func:`template` that states
    it, and the encoder is left the tags alone (so nothing is said about the metadata)."""
    av = import_av()
    if (colour.mastering is None and colour.light is None) or name in PARAMS_OPTION or name not in CODEC_IDS \
            or container.format.name not in HOLDING:
        return container.add_stream(name, rate=rate), colour
    with av.open(io.BytesIO(template(colour, CODEC_IDS[name], *size)), format="matroska") as made:
        source = made.streams.video[0]
        if av.codec.Codec(source.codec_context.codec.name, "w").name != name:  # the template makes the codec's first encoder
            return container.add_stream(name, rate=rate), colour
        stream = container.add_stream_from_template(source, opaque=False)
    stream.codec_context.framerate = rate
    stream.codec_context.flags |= int(av.codec.context.Flags.global_header)  # as add_stream sets it for these formats
    return stream, replace(colour, mastering=None, light=None)

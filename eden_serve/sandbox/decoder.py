"""A video stream's packets decoded to RGB frames with PyAV and numpy alone: the edge's decoder of
bitstream payloads, in its worker for a payload its cloud signed and in the sandbox's children for
the others, and the conversion every decoded video frame takes (:func:`rgb`, VideoClip's too): to
8-bit RGB, or to 16-bit RGB where the stream's pixel format is deeper than 8 bits (:func:`pixel_dtype`).

``parameters`` is a stream's :class:`~eden_serve.wire.bitstream.StreamParameters`, or an object with
its attributes: the sandbox's children hold no wire module, which imports PyTorch. Each packet has
``data``, ``pts``, ``dts`` and ``key``.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import CodecError, DigestMismatchError, PayloadTooLargeError

# Decoders check max_pixels against sizes rounded up to their coding blocks and strides, so the
# decoder's limit is the declared size rounded up to the largest block (AV1's superblock).
_BLOCK = 128
DECODER_THREADS = 4  # a fixed count: a sandboxed child's tasks are capped (confine.MAX_TASKS)
# Slice threads, not frame threads: a frame-threaded decoder holds back DECODER_THREADS - 1 frames
# until it has more packets or is told they ended, which ends it, so a kept decoder (edge/continued.py,
# kept.py) could not give a chunk's last frames and go on with the next chunk's packets: none of 16
# chunks went on, against 14 with slice threads (benchmarks/decoder_threads.py, which times both).
DECODER_THREAD_TYPE = "SLICE"
# Decoders that leave out, as told per packet, a picture no other references (H.264's nal_ref_idc 0,
# HEVC's sub-layer non-reference pictures): a chunk late in a long GOP decodes its key frame's
# B-frames for nothing. x264's and x265's defaults there: 40% of the frames before a chunk skipped,
# the chunk's frames equal bit for bit (mpeg4 and mpeg2video alike; VP8, VP9 and AV1 reorder none).
SKIPS_UNREFERENCED = frozenset({"h264", "hevc"})


@functools.lru_cache(maxsize=64)
def pixel_dtype(pix_fmt: str) -> type:
    """np.uint16 for a pixel format of more than 8 bits a component (yuv420p10le, p010le, gbrp12le...),
    else np.uint8: the RGB pixels :func:`rgb` makes of its frames."""
    import av

    try:
        components = av.VideoFormat(pix_fmt).components
    except ValueError:
        raise CodecError(f"malformed payload: its stream's pixel format {pix_fmt!r:.40} is not one FFmpeg knows") from None
    return np.uint16 if max(c.bits for c in components) > 8 else np.uint8


def rgb(frame) -> np.ndarray:
    """A decoded frame as the RGB pixels [H, W, 3] that the model and every codec take: PyAV's own
    conversion (swscale, bilinear, by the frame's colour matrix and range, which the decoder takes
    from the bitstream or, where the bitstream leaves them out, from its context), to rgb24, or to
    rgb48 where the frame is deeper than 8 bits. :func:`decode` and
    :class:`~eden_serve.media.video.VideoClip` both convert through it, for the same pixels."""
    if pixel_dtype(frame.format.name) == np.uint16:
        return frame.to_ndarray(format="rgb48le")
    return frame.to_ndarray(format="rgb24")


def warm_up() -> None:
    """Imports what decoding imports on its first frame (PyAV, and what a frame's conversion imports
    as it goes), by converting blank frames of both depths: a sandbox child opens no file, so it can
    import nothing. Without PyAV, nothing: :func:`decode` refuses each payload, saying so."""
    try:
        import av
    except ImportError:
        return
    for pix_fmt in ("yuv420p", "yuv420p10le"):
        rgb(av.VideoFrame(16, 16, pix_fmt))


def decode(parameters, packets: list, skip: int, count: int, max_pixels: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Frames ``skip`` to ``skip + count - 1`` of ``packets`` (counted from their first, a key
    frame, in display order) as RGB [count, H, W, 3] of :func:`pixel_dtype`, the pixels VideoClip
    gives (into ``out``, where given). The decoder refuses, as it parses the stream's own headers, any frame
    larger than ``parameters`` declare, and every frame, skipped ones too, must have that size."""
    stream = Stream(parameters, packets, max_pixels)
    first = first_shown(packets, skip) if parameters.decoder in SKIPS_UNREFERENCED else None
    pixels = np.empty((count, parameters.height, parameters.width, 3), pixel_dtype(parameters.pix_fmt)) if out is None else out
    got = 0
    for frame, shown in stream.frames(packets, first):
        if (shown >= skip) if first is None else (frame.pts >= first):  # unreferenced ones never come out
            pixels[got] = rgb(frame)
            got += 1
            if got == count:
                return pixels
    raise CodecError(f"malformed payload: its packets show {stream.shown} frames from the key frame on, fewer than the "
                     f"{skip} skipped and {count} declared")


class Stream:
    """A decoder of one stream's packets from a key frame on, which may be fed a payload's packets in
    several turns (:meth:`frames`): :func:`decode` feeds it one payload; the edge keeps one between
    the payloads of a stream's chunks (:mod:`eden_serve.edge.continued`)."""

    def __init__(self, parameters, packets: list, max_pixels: int | None = None):
        height, width = parameters.height, parameters.width
        if not packets:
            raise CodecError("malformed payload: it holds no packets")
        if max_pixels is not None and width * height > max_pixels:
            raise PayloadTooLargeError(f"the packets are for frames of {width}x{height}, over this edge's limit of {max_pixels} pixels")
        try:
            import av
        except ImportError:
            raise DigestMismatchError("this edge has no PyAV (the video extra) to decode the cloud's packets with; send this "
                                      "chunk with the frames codec") from None
        self.av, self.parameters = av, parameters
        self.context = _decoder(parameters, av)
        self.start = packets[0].pts  # the key frame's: frames timed before it are an open GOP's leading pictures
        self.fed = 0  # packets decoded (or left out), from the key frame
        self.shown = 0  # frames given, from the key frame on
        self.drained = False  # the decoder was told the packets ended: it can take no more

    def frames(self, packets: list, first: int | None = None, drain: bool = True):
        """``(frame, shown)`` for each frame the decoder gives, in display order, from the key frame
        on, as ``packets`` from the :attr:`fed`-th on are decoded, then, where ``drain``, as the
        decoder is told they ended. Packets shown before ``first`` (a time stamp) that nothing
        references are left out, for the decoders that can (:data:`SKIPS_UNREFERENCED`)."""
        av, context = self.av, self.context
        skips = first is not None and self.parameters.decoder in SKIPS_UNREFERENCED
        ahead = [*packets[self.fed:], None] if drain else packets[self.fed:]
        try:
            for packet in ahead:
                where = f"packet {self.fed}" if packet else "the end of the packets"
                if skips and packet is not None:  # shown before the chunk: needed only as a reference
                    context.skip_frame = "NONREF" if packet.pts < first else "DEFAULT"
                self.drained = packet is None
                self.fed += packet is not None
                for frame in context.decode(None if packet is None else _av_packet(packet, av)):
                    _check_size(frame, self.parameters, self.shown)
                    if frame.pts is None or frame.pts < self.start:
                        continue  # a leading picture of an open GOP
                    self.shown += 1
                    yield frame, self.shown - 1
        except (av.error.FFmpegError, ValueError) as exc:
            raise CodecError(f"malformed payload: {where} does not decode as {self.parameters.decoder} ({str(exc):.200})") from None


def first_shown(packets: list, skip: int) -> int | None:
    """The time stamp of the chunk's first frame, ``skip`` frames after the key frame: frames are
    numbered by their packets' times. None where the packets do not each state a time of their own."""
    stamps = [packet.pts for packet in packets]
    if any(type(stamp) is not int for stamp in stamps) or len(set(stamps)) != len(stamps):
        return None
    shown = sorted(stamp for stamp in stamps if stamp >= stamps[0])
    return shown[skip] if 0 <= skip < len(shown) else None


def _decoder(parameters, av):
    try:
        context = av.CodecContext.create(parameters.decoder, "r")
    except (av.error.FFmpegError, ValueError):
        raise DigestMismatchError(f"this edge's FFmpeg has no {parameters.decoder} decoder, so it cannot decode the cloud's "
                                  "packets; send this chunk with the frames codec") from None
    context.extradata = parameters.extradata or None
    context.width, context.height = parameters.width, parameters.height
    context.codec_tag = parameters.codec_tag
    for name in ("color_range", "colorspace", "color_primaries", "color_trc"):
        setattr(context, name, getattr(parameters, name))
    context.thread_type = DECODER_THREAD_TYPE  # the frames are the same whatever the threads (tests/test_decoder_threads.py)
    context.thread_count = DECODER_THREADS
    context.options = {"max_pixels": str(_padded(parameters.width) * _padded(parameters.height))}
    return context


def _padded(side: int) -> int:
    return -(-side // _BLOCK) * _BLOCK


def _av_packet(packet, av):
    out = owned_packet(packet.data, av)
    out.pts, out.dts, out.is_keyframe = packet.pts, packet.dts, packet.key
    return out


def owned_packet(data: bytes, av):
    """PyAV's packet of ``data``, copied into FFmpeg's own memory: PyAV's ``Packet(bytes)`` lends
    FFmpeg the Python object, which a decoder's thread can then let go of only holding the GIL,
    while PyAV frees a codec context holding it and waiting for those threads: a frame-threaded
    decoder let go of with packets in hand (mid-stream, or after refusing a frame) hung the process.
    The edge's decoder and the client's (a cloud source's frame threads) feed their decoders these."""
    out = av.Packet(len(data))
    out.update(data)
    return out


def _check_size(frame, parameters, shown: int) -> None:
    if (frame.width, frame.height, frame.format.name) != (parameters.width, parameters.height, parameters.pix_fmt):
        raise CodecError(f"malformed payload: frame {shown} decodes as {frame.format.name} {frame.width}x{frame.height}, but the "
                         f"header declares {parameters.pix_fmt} {parameters.width}x{parameters.height}")

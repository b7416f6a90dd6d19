"""The benchmarks' results as CSV, for docs/performance.md's plots (benchmarks/plots.py draws them).

    results.write("chunks_bytes", [{"frames": "448x256", "codec": "bf16+zstd", "chunk": 8, "bytes_per_pair": 1234}])

writes ``benchmarks/results/chunks_bytes.csv``: the rows, each with the command that measured it,
the CPU capability (``torch.backends.cpu.get_cpu_capability()``), the torch version, the machine's
CPUs and the date, so that a figure never travels without them. A run replaces the file of
the same name: a file holds one run.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
CHECKOUT = RESULTS.parents[1]


def command() -> str:
    """This process's command line, as run from the checkout's root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(CHECKOUT) if script.is_relative_to(CHECKOUT) else script
    return shlex.join([".venv/bin/python", str(shown), *sys.argv[1:]])


def write(name: str, rows: list[dict]) -> Path:
    """``rows`` (dicts with the same keys) and this run's context into ``results/NAME.csv``."""
    context = {
        "command": command(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),  # the machine's; a benchmark may pin itself to fewer
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.csv"
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=[*rows[0], *context])
        writer.writeheader()
        writer.writerows({**row, **context} for row in rows)
    print(f"wrote {path}", flush=True)
    return path


def read(name: str) -> list[dict[str, str]]:
    with open(RESULTS / f"{name}.csv", newline="") as source:
        return list(csv.DictReader(source))


@contextlib.contextmanager
def plotted(prefix: Path, rows: list[dict], size: tuple[float, float] = (7, 4)):
    """``rows`` as PREFIX.csv, and the figure drawn on the yielded axes as PREFIX.png (a
    benchmark's ``--plot PREFIX``)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.with_suffix(".csv"), "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    figure, axes = pyplot.subplots(figsize=size)
    yield axes
    figure.tight_layout()
    figure.savefig(prefix.with_suffix(".png"), dpi=120)
    pyplot.close(figure)
    print(f"wrote {prefix.with_suffix('.csv')} and {prefix.with_suffix('.png')}")

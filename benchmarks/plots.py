"""The plots of docs/performance.md, drawn from the benchmarks' CSV in benchmarks/results/.

    .venv/bin/python benchmarks/plots.py          # writes docs/img/*.png

Each plot says, under its title, the command that measured it, the CPU capability and the date,
all read from the CSV. A plot whose CSV is missing is skipped with a line saying which command
makes it.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import ScalarFormatter

import results

IMAGES = results.CHECKOUT / "docs" / "img"
STAGES = ("encode", "codec", "denoise", "decode")


def caption(rows: list[dict[str, str]]) -> str:
    first = rows[0]
    command = "\n".join(textwrap.wrap(first["command"], 120, break_on_hyphens=False))
    return f"{command}\nCPU capability {first['cpu_capability']}, {first['cpus']} CPUs, torch {first['torch']}, {first['date']}"


def figure(title: str, rows: list[dict[str, str]]):
    fig, ax = plt.subplots(figsize=(8, 5))
    fig.suptitle(title, fontsize=12)
    ax.set_title(caption(rows), fontsize=7, color="0.35")
    ax.grid(True, alpha=0.3)
    return fig, ax


def log_x(ax, lines: dict[tuple, list[tuple[float, float]]], base: int) -> None:
    """A log x axis ticked at the lines' own x values, written as plain numbers."""
    ax.set_xscale("log", base=base)
    ax.set_xticks(sorted({x for points in lines.values() for x, _ in points}))
    ax.get_xaxis().set_major_formatter(ScalarFormatter())
    ax.minorticks_off()


def save(fig, name: str) -> Path:
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def two_hosts(rows: list[dict[str, str]]) -> Path:
    """Pairs/s against the link rate, a line per codec and mode."""
    fig, ax = figure("Two hosts: pairs/s against the link's rate", rows)
    lines = defaultdict(list)
    for row in rows:
        lines[row["codec"], row["mode"]].append((float(row["R Mbit/s"]), float(row["pairs/s"])))
    for (codec, mode), points in sorted(lines.items()):
        points.sort()
        ax.plot(*zip(*points), marker="o", linestyle="-" if mode == "pair" else "--", label=f"{codec}, {mode}")
    log_x(ax, lines, base=10)
    ax.set_xlabel("link rate (Mbit/s, each direction)")
    ax.set_ylabel("pairs/s")
    ax.legend(fontsize=8)
    return save(fig, "two_hosts")


def stages(rows: list[dict[str, str]]) -> Path:
    """Milliseconds per pair, stacked by stage, a bar per frame size and precision."""
    fig, ax = figure("Milliseconds per pair by stage and edge precision", rows)
    labels = [f"{row['size']}\n{row['precision']} -> {row['precision_used']}" for row in rows]
    bottom = [0.0] * len(rows)
    for stage in STAGES:
        values = [float(row[f"{stage}_ms"]) for row in rows]
        ax.bar(labels, values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, (top, row) in enumerate(zip(bottom, rows)):
        ax.annotate(f"{float(row['ms_per_pair']):.0f} ms (median of the totals)", (x, top), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per pair (the stages' medians)")
    ax.legend(fontsize=8)
    return save(fig, "stages")


def chunks_bytes(rows: list[dict[str, str]]) -> Path:
    """Payload bytes per pair against the chunk size, a line per codec and frame size."""
    fig, ax = figure("Bytes per pair on the wire against the chunk size K", rows)
    lines = defaultdict(list)
    for row in rows:
        lines[row["frames"], row["codec"]].append((int(row["chunk"]), float(row["bytes_per_pair"]) / 1e6))
    for (frames, codec), points in sorted(lines.items()):
        points.sort()
        ax.plot(*zip(*points), marker="o", label=f"{frames}, {codec}")
    log_x(ax, lines, base=2)
    ax.set_xlabel("pairs per payload K (1: pair mode)")
    ax.set_ylabel("MB per pair")
    ax.legend(fontsize=8)
    return save(fig, "chunks_bytes")


def clip_modes(rows: list[dict[str, str]]) -> Path:
    """Pairs/s of one clip in each mode, a bar per chunk size."""
    fig, ax = figure(f"Pairs/s by mode: {rows[0]['clip']}, {rows[0]['config']} dimensions", rows)
    modes = list(dict.fromkeys(row["mode"] for row in rows))
    chunks = sorted({int(row["chunk"]) for row in rows})
    width = 0.8 / len(chunks)
    for i, k in enumerate(chunks):
        values = {row["mode"]: float(row["pairs_per_second"]) for row in rows if int(row["chunk"]) == k}
        ax.bar([m + i * width for m in range(len(modes))], [values[mode] for mode in modes], width, label=f"K = {k}")
    ax.set_xticks([m + width * (len(chunks) - 1) / 2 for m in range(len(modes))], modes)
    ax.set_ylabel("pairs/s")
    ax.legend(fontsize=8)
    return save(fig, "clip_modes")


PLOTS = {"two_hosts": two_hosts, "stages": stages, "chunks_bytes": chunks_bytes, "clip_modes": clip_modes}
MADE_BY = {"two_hosts": "two_hosts.py", "stages": "stages.py", "chunks_bytes": "chunks.py", "clip_modes": "clip_modes.py"}


def main() -> None:
    for name, plot in PLOTS.items():
        if not (results.RESULTS / f"{name}.csv").exists():
            print(f"skipped {name}: no benchmarks/results/{name}.csv; run benchmarks/{MADE_BY[name]} first")
            continue
        plot(results.read(name))


if __name__ == "__main__":
    main()

"""Plots of benchmarks/two_hosts.py's CSV: pairs/s and time to the first middle against the link rate,
one line per transport and mode.

    .venv/bin/python benchmarks/plot_two_hosts.py docs/img/two_hosts_9.csv docs/img/two_hosts_9.png [--title T]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from matplotlib.figure import Figure  # not pyplot: a file, no display and no backend to choose

STYLE = {"http": "-", "grpc": "--"}
MARKER = {"pair": "o", "chunk8": "s", "ramp8": "^"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    with open(args.csv, newline="") as file:
        rows = list(csv.DictReader(file))
    figure = Figure(figsize=(11, 4.2))
    rate_axis, first_axis = figure.subplots(1, 2)
    for key in dict.fromkeys((r["transport"], r["mode"]) for r in rows):
        mine = sorted((r for r in rows if (r["transport"], r["mode"]) == key), key=lambda r: float(r["R Mbit/s"]))
        rates = [float(r["R Mbit/s"]) for r in mine]
        style = dict(linestyle=STYLE.get(key[0], ":"), marker=MARKER.get(key[1], "x"), label=" ".join(key))
        rate_axis.plot(rates, [float(r["pairs/s"]) for r in mine], **style)
        first_axis.plot(rates, [float(r["first middle"].split()[0]) for r in mine], **style)
    for axis, label in ((rate_axis, "pairs/s"), (first_axis, "first middle (s)")):
        axis.set_xscale("log")
        axis.set_xlabel("link rate (Mbit/s)")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    first_axis.set_yscale("log")
    rate_axis.legend(fontsize=8)
    figure.suptitle(args.title)
    figure.tight_layout()
    figure.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()

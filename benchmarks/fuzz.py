"""The long fuzzing run (docs/errors-and-limits.md, "Fuzzing"): each target of harness/fuzz.py on its
own, for its share of the inputs, from seeds made at run time.

    .venv/bin/python benchmarks/fuzz.py [--runs wire=300000,keyed=150000,...] [--rss-limit-mb 2048] [--hang-s 20] [--name fuzz]

Prints per target the inputs run, the seconds, the inputs per second, the crashes, hangs and
out-of-memory failures libFuzzer reported (it stops at the first; the run then goes on with the
next target), and the peak resident memory of the fuzzing process, and writes the rows to
benchmarks/results/fuzz.csv. Artifacts of failures are kept under --keep (default: a temporary
directory that is removed).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
import results

REPO = Path(__file__).resolve().parents[1]
RUNS = {"wire": 300_000, "keyed": 150_000, "elided": 200_000, "pages": 200_000, "answers": 130_000, "bitstream": 20_000,
        "decoder": 15_000}
FAILURES = {"crash": r"deadly signal|Uncaught Python exception|fuzz target exited", "hang": r"libFuzzer: timeout",
            "oom": r"libFuzzer: out-of-memory"}


def run(target: str, runs: int, corpus: Path, args) -> dict:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "harness.fuzz", target, f"-runs={runs}", f"-rss_limit_mb={args.rss_limit_mb}",
         f"-timeout={args.hang_s}", "-print_final_stats=1", f"-artifact_prefix={corpus}/{target}-", str(corpus / target)],
        cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    log = done.stderr
    count = re.search(r"stat::number_of_executed_units:\s+(\d+)", log)
    peak = re.search(r"stat::peak_rss_mb:\s+(\d+)", log)
    row = {"target": target, "inputs": int(count.group(1)) if count else 0, "seconds": round(seconds, 1),
           **{kind: int(bool(re.search(pattern, log))) for kind, pattern in FAILURES.items()},
           "peak_rss_mb": int(peak.group(1)) if peak else -1, "exit": done.returncode}
    row["inputs_per_s"] = round(row["inputs"] / seconds, 1)
    if done.returncode:
        print(log[-3000:], file=sys.stderr)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(f"{k}={v}" for k, v in RUNS.items()),
                        help="TARGET=INPUTS,... (default: %(default)s)")
    parser.add_argument("--rss-limit-mb", type=int, default=2048)
    parser.add_argument("--hang-s", type=int, default=20)
    parser.add_argument("--keep", type=Path, help="a directory for the corpus and the failures' artifacts")
    parser.add_argument("--name", default="fuzz", help="the CSV's name under benchmarks/results (default: %(default)s)")
    args = parser.parse_args()
    runs = {target: int(count) for target, count in (item.split("=") for item in args.runs.split(","))}
    with tempfile.TemporaryDirectory(prefix="eden-fuzz-") as scratch:
        corpus = args.keep or Path(scratch)
        subprocess.run([sys.executable, "-m", "harness.fuzz", "seed", str(corpus)], cwd=REPO, check=True, capture_output=True)
        rows = []
        for target, count in runs.items():
            rows.append(run(target, count, corpus, args))
            print(rows[-1], flush=True)
    print(f"{'target':10} {'inputs':>9} {'s':>7} {'inputs/s':>9} {'crash':>5} {'hang':>5} {'oom':>4} {'peak MB':>8}")
    for r in rows:
        print(f"{r['target']:10} {r['inputs']:9} {r['seconds']:7} {r['inputs_per_s']:9} {r['crash']:5} {r['hang']:5} {r['oom']:4} "
              f"{r['peak_rss_mb']:8}")
    print(f"all: {sum(r['inputs'] for r in rows)} inputs, {sum(r['crash'] for r in rows)} crashes, "
          f"{sum(r['hang'] for r in rows)} hangs, {sum(r['oom'] for r in rows)} out of memory")
    results.write(args.name, rows)


if __name__ == "__main__":
    main()

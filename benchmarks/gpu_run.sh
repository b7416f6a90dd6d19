#!/usr/bin/env bash
# What runs on the GPU machine, from the repository root, with .gpu carried (benchmarks/gpu_wheels.sh
# fills it here): the wheels that machine lacks, this package without its dependencies (its torch
# pin is the CPU wheel; the machine's own PyTorch stays), then benchmarks/gpu_check.py within
# $BUDGET seconds (default 330: about six minutes with the installs), its rows and log into $OUT.
# Without a GPU it runs the quick CPU check instead.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
if compgen -G ".gpu/wheels/*.whl" >/dev/null; then
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --find-links .gpu/wheels zstandard av nvidia-ml-py
fi
# No build isolation: it would fetch setuptools, and the machine has no internet. gpu_check.py also
# runs from the checkout where the install fails.
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e . \
  || echo "gpu_run: the editable install failed; running from the checkout" >&2
if "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
  options=(--device cuda --budget "${BUDGET:-330}")
else
  echo "gpu_run: no GPU here; the quick CPU check" >&2
  options=(--device cpu --quick --budget "${BUDGET:-170}")
fi
"$PYTHON" benchmarks/gpu_check.py "${options[@]}" --out "$OUT/gpu_check.jsonl" 2>&1 | tee "$OUT/gpu_check.log"
"$PYTHON" benchmarks/gpu_served.py --budget "${SERVED_BUDGET:-90}" --out "$OUT/gpu_served.jsonl" 2>&1 | tee "$OUT/gpu_served.log"
echo "gpu_run: wrote $(ls "$OUT" | tr '\n' ' ')"

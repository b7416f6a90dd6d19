#!/usr/bin/env bash
# The one-run GPU check, on the GPU machine, from the repository root, with .gpu carried
# (benchmarks/gpu_wheels.sh fills it here; docs/gpu.md, "Running it"): the wheels that machine lacks,
# this package without its dependencies (its torch pin is the CPU wheel; the machine's own PyTorch
# stays), the preflight, then benchmarks/gpu_check.py within $BUDGET seconds (default 270: five
# minutes with the installs), its rows, log and GOAL lines into $OUT. Without a GPU it runs the
# quick CPU check instead.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
started=$(date +%s)
if compgen -G ".gpu/wheels/*.whl" >/dev/null; then
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --find-links .gpu/wheels .gpu/wheels/*.whl
fi
# No build isolation: it would fetch setuptools, and the machine has no internet. The scripts also
# run from the checkout where the install fails.
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e . \
  || echo "gpu_run: the editable install failed; running from the checkout" >&2
if "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
  options=(--device cuda --budget "${BUDGET:-270}")
else
  echo "gpu_run: no GPU here; the quick CPU check" >&2
  options=(--device cpu --quick --budget "${BUDGET:-170}")
fi
echo "gpu_run: installed in $(( $(date +%s) - started )) s"
"$PYTHON" benchmarks/gpu_goals.py --device "${options[1]}" | tee "$OUT/preflight.txt"  # before any timing: exit 2 on a problem
PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/gpu_check.py "${options[@]}" --out "$OUT/gpu_check.jsonl" 2>&1 | tee "$OUT/gpu_check.log"
grep '^GOAL\|^CHECK\|^PREFLIGHT' "$OUT/gpu_check.log" >"$OUT/goals.txt" || true
echo "gpu_run: $(( $(date +%s) - started )) s in all; wrote $(ls "$OUT" | tr '\n' ' ')"

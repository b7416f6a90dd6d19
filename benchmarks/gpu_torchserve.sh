#!/usr/bin/env bash
# TorchServe on the GPU machine, in two device calls right after the GPU check (the machine stays
# warm 30 s and keeps what the earlier calls installed; docs/gpu.md, "Running it"):
#   base      with .gpu carried, only where the GPU check has not run on this machine: its wheels
#             (PyAV, zstandard, pyseccomp) installed
#   install   with .gpu-serve carried: TorchServe's wheels installed
#   run       with .gpu-java carried: the Java runtime unpacked, then benchmarks/gpu_torchserve.py,
#             its TS lines and log into $OUT (without a GPU, its quick CPU run: a rehearsal)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
case "${1:-}" in
  base)
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --find-links .gpu/wheels .gpu/wheels/*.whl
    "$PYTHON" -c "import av, zstandard; print('gpu_torchserve: PyAV', av.__version__, 'installed')"
    ;;
  install)
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps .gpu-serve/wheels/*.whl
    "$PYTHON" -c "import ts, model_archiver, workflow_archiver; print('gpu_torchserve: TorchServe', ts.__version__ if hasattr(ts, '__version__') else '', 'installed')"
    ;;
  run)
    export JAVA_HOME=/tmp/eden-jre
    if [[ ! -x "$JAVA_HOME/bin/java" ]]; then
      mkdir -p "$JAVA_HOME" && tar -C "$JAVA_HOME" --strip-components=1 -xJf .gpu-java/jre.tar.xz
    fi
    "$JAVA_HOME/bin/java" -version
    "$PYTHON" -c "import ts, av, zstandard" || { echo "gpu_torchserve: run the GPU check and the install first, each within 30 s of the last" >&2; exit 2; }
    options=(--device cuda)
    if ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
      echo "gpu_torchserve: no GPU here; the quick CPU run" >&2
      options=(--device cpu --quick)
    fi
    PYTHONUNBUFFERED=1 "$PYTHON" benchmarks/gpu_torchserve.py "${options[@]}" 2>&1 | tee "$OUT/gpu_torchserve.log"
    grep '^TS ' "$OUT/gpu_torchserve.log" >"$OUT/torchserve.txt" || true
    ;;
  *)
    echo "usage: gpu_torchserve.sh base|install|run" >&2
    exit 2
    ;;
esac

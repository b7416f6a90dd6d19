#!/usr/bin/env bash
# The wheels the GPU machine lacks and cannot fetch (no internet there), for its Python 3.12 on
# x86_64: zstandard (imported by the wire codecs) and av (video, for the clip phases). Written to
# .gpu/wheels (git-ignored), which `run` carries (64 MiB in all): benchmarks/gpu_run.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu/wheels
mkdir -p .gpu/wheels
.venv/bin/pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps --dest .gpu/wheels \
  --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  "zstandard>=0.22" "av>=17"
ls -l .gpu/wheels
du -sh .gpu/wheels

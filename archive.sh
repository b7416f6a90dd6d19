#!/usr/bin/env bash
# Build the TorchServe archives of eden-serve: model_store/eden_encoder.mar (the cloud half),
# eden_ditdec.mar (the edge half) and eden.war (the workflow). A thin wrapper around
# `eden-serve archive` (eden_serve/serving/archive.py), whose flags it takes:
#   bash archive.sh [--checkpoint CKPT] [--config official|tiny] [--codec C] [--precision P] [--threads N] [--model-store DIR]
# The store defaults to model_store next to this script, from wherever it is run.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The project's virtual environment first, then PATH.
if [[ -x "$root/.venv/bin/eden-serve" ]]; then
    eden_serve="$root/.venv/bin/eden-serve"
elif command -v eden-serve >/dev/null; then
    eden_serve=$(command -v eden-serve)
else
    echo "$0: eden-serve not found; run setup.sh, or pip install '.[serve]'" >&2
    exit 1
fi
# A --model-store given here comes later, and wins.
exec "$eden_serve" archive --model-store "$root/model_store" "$@"

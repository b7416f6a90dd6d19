#!/usr/bin/env bash
# Build the TorchServe archives of eden-serve:
#   MODEL_STORE/eden_encoder.mar  cloud half (eden_cloud.safetensors + handler + eden_serve package)
#   MODEL_STORE/eden_ditdec.mar   edge half (eden_edge.safetensors, and eden_cloud.safetensors for the
#                                 frames codec, + handler + eden_serve package)
#   MODEL_STORE/eden.war          workflow eden_encoder -> eden_ditdec
# Each .mar carries the eden_serve package, so workers import it from the archive, not from the
# environment TorchServe runs in.
set -euo pipefail

usage() {
    cat <<EOF
usage: $0 [--checkpoint CKPT] [--config official|tiny] [--codec CODEC] [--threads N] [--model-store DIR]
  --checkpoint CKPT  official eden.pt: a path or hf://ORG/NAME/FILE[@REV], e.g. hf://zhZ524/EDEN/eden.pt
                     (default: synthetic weights, with a warning; not a real interpolation)
  --config NAME      model dimensions: official (default) or tiny
  --codec CODEC      wire codec of encoder requests that name none (default: the library's default)
  --threads N        CPU threads per worker, handler.threads of both archives (default 0: a share of the cores)
  --model-store DIR  where to write the archives (default: model_store next to this script)
EOF
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
checkpoint=""
config=official
codec=""
threads=0
store="$root/model_store"
while (($#)); do
    case "$1" in
        --checkpoint) checkpoint=${2:?--checkpoint needs a path}; shift 2 ;;
        --config) config=${2:?--config needs a name}; shift 2 ;;
        --codec) codec=${2:?--codec needs a name}; shift 2 ;;
        --threads) threads=${2:?--threads needs a number}; shift 2 ;;
        --model-store) store=${2:?--model-store needs a directory}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "$0: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [[ ! $threads =~ ^[0-9]+$ ]]; then
    echo "$0: --threads must be an integer >= 0, got $threads" >&2
    exit 2
fi

# The project's virtual environment first, then PATH.
tool() {
    if [[ -x "$root/.venv/bin/$1" ]]; then
        echo "$root/.venv/bin/$1"
    elif command -v "$1" >/dev/null; then
        command -v "$1"
    else
        echo "$0: $1 not found; install the project with its serve extra (pip install -e '.[serve]')" >&2
        exit 1
    fi
}
eden_serve=$(tool eden-serve)
python=$(tool python)
model_archiver=$(tool torch-model-archiver)
workflow_archiver=$(tool torch-workflow-archiver)

# Refuse an unknown codec now rather than when the workers load.
codec=$("$python" -c 'import sys; from eden_serve import wire
name = sys.argv[1] or wire.DEFAULT_CODEC
try:
    wire.parse_codec(name)
except Exception as exc:
    sys.exit(f"--codec: {exc}")
print(name)' "$codec")

mkdir -p "$store"
store=$(cd "$store" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$eden_serve" split-checkpoint ${checkpoint:+"$checkpoint"} --out "$work/weights" --config "$config"

# --extra-files copies a directory's contents into the archive root, so the package goes in one
# level down; sources only, no __pycache__.
mkdir -p "$work/lib"
(cd "$root" && find eden_serve -name '*.py' -exec cp --parents {} "$work/lib" \;)

# torch-model-archiver names the config in the manifest by its file name.
mkdir -p "$work/encoder" "$work/ditdec"
sed -e "s/^  codec: .*/  codec: $codec  # set by archive.sh --codec/" -e "s/^  threads: .*/  threads: $threads  # set by archive.sh --threads/" \
    "$root/handlers/eden_encoder-config.yaml" >"$work/encoder/model-config.yaml"
sed "s/^  threads: .*/  threads: $threads  # set by archive.sh --threads/" "$root/handlers/eden_ditdec-config.yaml" >"$work/ditdec/model-config.yaml"
grep -q "^  codec: $codec " "$work/encoder/model-config.yaml"
grep -q "^  threads: $threads " "$work/encoder/model-config.yaml"
grep -q "^  threads: $threads " "$work/ditdec/model-config.yaml"

# zip-store: float weights barely deflate (the official edge half: 7% smaller for 24 s of CPU),
# and TorchServe reads stored zip entries just the same.
archive() {  # NAME HANDLER WEIGHTS(comma-separated) CONFIG
    "$model_archiver" --model-name "$1" --version 1.0 --handler "$2" \
        --extra-files "$3,$work/lib" --config-file "$4" \
        --archive-format zip-store --export-path "$store" --force
}
archive eden_encoder "$root/handlers/eden_encoder_handler.py" "$work/weights/eden_cloud.safetensors" "$work/encoder/model-config.yaml"
archive eden_ditdec "$root/handlers/eden_ditdec_handler.py" "$work/weights/eden_edge.safetensors,$work/weights/eden_cloud.safetensors" \
    "$work/ditdec/model-config.yaml"
"$workflow_archiver" --workflow-name eden --spec-file "$root/workflows/eden.yaml" \
    --handler "$root/workflows/eden_workflow_handler.py" --export-path "$store" --force

echo "archives of the $config model (encoder codec $codec, threads $threads):"
for name in eden_encoder.mar eden_ditdec.mar eden.war; do
    echo "  $store/$name  $(du -h "$store/$name" | cut -f1)"
done

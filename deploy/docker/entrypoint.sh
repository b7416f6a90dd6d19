#!/usr/bin/env bash
# Entrypoint of the eden-serve image: `eden-serve ARGS` (the image's CMD: serve ...) from the
# environment next to this script (the image's /opt/eden-serve/.venv, or a checkout's .venv), else
# PATH, whatever the working directory. exec: eden-serve receives the
# container's signals itself and stops TorchServe in order on SIGTERM.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ -x "$root/.venv/bin/eden-serve" ]]; then
    exec "$root/.venv/bin/eden-serve" "$@"
fi
exec eden-serve "$@"

#!/usr/bin/env bash
# From a fresh clone: install into .venv, build the archives (official dimensions, synthetic
# weights), start TorchServe with both models and the workflow, interpolate the example frames
# through the workflow into out/middle.png. The server keeps running; the last line says how to stop it.
set -euo pipefail
cd "$(dirname "$0")"

bash setup.sh
bash archive.sh "$@"
bin=.venv/bin

# A server left by an earlier quick start holds the ports.
"$bin/torchserve" --stop >/dev/null 2>&1 || true
rm -f key_file.json
mkdir -p logs
"$bin/torchserve" --start --ncs --ts-config config.properties --models eden_encoder.mar eden_ditdec.mar \
    >logs/torchserve-console.log 2>&1

key() { "$bin/python" -c 'import json, sys; print(json.load(open("key_file.json"))[sys.argv[1]]["key"])' "$1"; }
ready() {
    [[ -f key_file.json ]] && curl -sf -H "Authorization: Bearer $(key management)" \
        http://127.0.0.1:8081/models/eden_ditdec 2>/dev/null | grep -q '"status": "READY"'
}
echo "waiting for TorchServe and its workers (log: logs/)..."
for _ in $(seq 180); do ready && break; sleep 1; done
ready || { echo "TorchServe did not become ready in 3 minutes; see logs/ and stop it with .venv/bin/torchserve --stop" >&2; exit 1; }
curl -sf -X POST -H "Authorization: Bearer $(key management)" "http://127.0.0.1:8081/workflows?url=eden.war"
echo

mkdir -p out
"$bin/eden-serve" client examples/frame0.png examples/frame1.png -o out/middle.png \
    --server http://127.0.0.1:8080 --token-file key_file.json
echo "TorchServe is running on 127.0.0.1:8080 (inference), :8081 (management), :8082 (metrics)"
echo "with models eden_encoder, eden_ditdec and workflow eden; keys in key_file.json."
echo "Stop it with: .venv/bin/torchserve --stop"

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
# Both halves' workers share the cores: waiting OpenMP threads yield them (docs/serving.md: "GPUs and threads").
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
"$bin/torchserve" --start --ncs --ts-config config.properties --models eden_encoder.mar eden_ditdec.mar \
    >logs/torchserve-console.log 2>&1

# Wait for the workers, then register the workflow (the management API needs the management key).
"$bin/python" - <<'PY'
import json, pathlib, sys, time
import requests

deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    try:
        key = json.loads(pathlib.Path("key_file.json").read_text())["management"]["key"]
        headers = {"Authorization": f"Bearer {key}"}
        workers = requests.get("http://127.0.0.1:8081/models/eden_ditdec", headers=headers, timeout=5).json()[0]["workers"]
        if any(w["status"] == "READY" for w in workers):
            break
    except (OSError, ValueError, KeyError, IndexError, requests.RequestException):
        pass
    time.sleep(1)
else:
    sys.exit("TorchServe did not become ready in 3 minutes; see logs/ and stop it with .venv/bin/torchserve --stop")
answer = requests.post("http://127.0.0.1:8081/workflows", params={"url": "eden.war"}, headers=headers, timeout=600)
print(answer.json().get("status", answer.text))
if answer.status_code != 200:
    sys.exit(f"registering the workflow failed ({answer.status_code}); see logs/")
PY

mkdir -p out
"$bin/eden-serve" client examples/frame0.png examples/frame1.png -o out/middle.png \
    --server http://127.0.0.1:8080 --token-file key_file.json
echo "TorchServe is running on 127.0.0.1:8080 (inference), :8081 (management), :8082 (metrics)"
echo "with models eden_encoder, eden_ditdec and workflow eden; keys in key_file.json."
echo "Stop it with: .venv/bin/torchserve --stop"

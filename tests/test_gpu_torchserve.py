"""TorchServe as the GPU machine runs it (benchmarks/gpu_torchserve.py), tried on this CPU with the
tiny model and this machine's Java: both archives and the workflow served, the workflow's middle
as this process computes it (within the documented rounding bound, harness/rounding.py), a clip through --cloud/--edge with the bitstream codec done with the wire key and again in
the sandbox, and the faults that need a GPU said not provoked."""

import re
import sys

import pytest

from harness import rounding
from harness.servers import REPO, run_script

pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def figures():
    done = run_script([sys.executable, str(REPO / "benchmarks" / "gpu_torchserve.py"), "--device", "cpu", "--quick"],
                      timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return {m.group(1): m.group(2) for m in re.finditer(r"(?m)^TS (\w+): (.*)$", done.stdout)}


def test_the_servers_start_and_the_workflow_answers_as_this_process(figures):
    assert {"environment", "archives", "startup", "workers_gpu_memory", "workflow_pair", "served_bitstream", "sandbox_cost"} <= set(figures)
    pair = re.match(r"200 in [\d.]+ s, 96x64; against this process's middle: max (\d+) levels, ([\d.]+)% of values differ", figures["workflow_pair"])
    assert pair and int(pair.group(1)) <= rounding.LEVELS and float(pair.group(2)) / 100 < rounding.SHARE, figures["workflow_pair"]


def test_the_clip_runs_served_keyed_in_process_and_in_the_sandbox(figures):
    served, here = map(float, re.match(r"([\d.]+) pairs/s served \(keyed\), ([\d.]+) in process", figures["served_bitstream"]).groups())
    boxed = float(re.match(r"([\d.]+) pairs/s in the sandbox", figures["sandbox_cost"]).group(1))
    assert served > 0 and here > 0 and boxed > 0, figures
    assert figures["oom_halving"].startswith("not provoked") and figures["sticky_error_exit"].startswith("not provoked")


def test_the_lines_that_tell_how_a_worker_met_a_device_fault_are_picked_from_the_logs():
    """What the sticky-error probe prints on a GPU: the logs' lines naming the fault or the worker's
    end, each once, the last of them; other lines not."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_torchserve

    logs = "\n".join(["MODEL_LOG - loaded", "MODEL_LOG - RuntimeError: CUDA error: device-side assert triggered",
                      "ts - Backend worker process died.", "MODEL_LOG - RuntimeError: CUDA error: device-side assert triggered",
                      "MODEL_LOG - eden_ditdec: the device failed; this worker exits once it has answered, so that TorchServe replaces it", "ok"])
    assert gpu_torchserve.fault_lines(logs) == [
        "MODEL_LOG - RuntimeError: CUDA error: device-side assert triggered", "ts - Backend worker process died.",
        "MODEL_LOG - eden_ditdec: the device failed; this worker exits once it has answered, so that TorchServe replaces it"]
    assert len(gpu_torchserve.fault_lines("\n".join(f"Traceback {i}" for i in range(40)))) == 12

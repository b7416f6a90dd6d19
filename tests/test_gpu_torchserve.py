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

"""A short run of the fuzzing campaign (harness/fuzz.py; the long one is benchmarks/fuzz.py): every
parser of bytes from the other side, and the sandboxed decoder, fed mutations of real payloads by a
coverage-guided fuzzer in a process of its own. It must end with no crash (an exception other than
the package's refusals, or a signal), no input over the hang deadline and no memory over the bound."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from harness.servers import REPO

RUNS = 6000
RSS_LIMIT_MB = 2048  # docs/errors-and-limits.md: "Fuzzing"
HANG_S = 20


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz")
    subprocess.run([sys.executable, "-m", "harness.fuzz", "seed", str(directory)], cwd=REPO, check=True, capture_output=True)
    return directory


def test_the_parsers_survive_a_short_fuzzing_run(corpus):
    # Through a shell that forks for it: a process's peak resident memory, which libFuzzer checks,
    # counts that of the process it was forked from (this test run's, gigabytes late in the suite).
    run = subprocess.run(
        ["bash", "-c", '"$@"; exit $?', "fuzz", sys.executable, "-m", "harness.fuzz", "all", f"-runs={RUNS}", "-max_total_time=240", f"-rss_limit_mb={RSS_LIMIT_MB}",
         f"-timeout={HANG_S}", "-print_final_stats=1", f"-artifact_prefix={corpus}/", str(corpus / "all")],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    log = run.stderr
    assert run.returncode == 0, log[-4000:]
    done = re.search(r"Done (\d+) runs", log)
    assert done and int(done.group(1)) >= 1000, log[-2000:]
    assert int(re.search(r"stat::peak_rss_mb:\s+(\d+)", log).group(1)) < RSS_LIMIT_MB
    assert not list(corpus.glob("crash-*")) and not list(corpus.glob("timeout-*")) and not list(corpus.glob("oom-*"))

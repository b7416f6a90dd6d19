"""The decoder sandbox (eden_serve/media/sandboxed.py): payloads decoded in a child process give the
pixels of an in-process decode, for every codec the seeds cover; a decoder that crashes, hangs,
spins or allocates without bound costs its payload a refusal, and the next payload decodes; the
child can open no file or socket, run nothing and signal no one. A compromised decoder (the
stand-ins of harness/standins.py) finds none of the worker's secrets in its environment, and
nothing it says or prints reaches the client, this process's output, or the log beyond one bounded,
escaped line; it starts at most a few threads."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.errors import CodecError, TooMuchWorkError
from eden_serve.media import packets, sandboxed as sandbox
from eden_serve.sandbox.confine import MAX_TASKS, pids_cgroup, seccomp_filter
from eden_serve.wire.bitstream import to_frames
from harness import fuzz
from harness.standins import FORGED, SECRETS, said

WORKER_SECRETS = {name: f"the worker's own {name}" for name in SECRETS}


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    return fuzz.bitstream_payloads(tmp_path_factory.mktemp("clips"))


@pytest.fixture(scope="module")
def chunks(payloads):
    return [wire.decode(p, PRESETS["tiny"]) for p in payloads]


def job(chunk):
    return chunk.parameters, chunk.packets, chunk.skip, chunk.frames


@pytest.fixture(scope="module")
def standins():
    """One sandbox whose decoder misbehaves as the first packet says (harness/standins.py)."""
    box = sandbox.Sandbox("harness.standins:misbehave")
    yield box
    box.close()


def naming(chunk, standin: str) -> tuple:
    """``chunk``'s job with its first packet naming a stand-in."""
    first = chunk.packets[0]
    return chunk.parameters, [replace(first, data=f"{standin}:".encode() + first.data), *chunk.packets[1:]], chunk.skip, chunk.frames


def test_the_sandbox_decodes_what_this_process_decodes(chunks):
    assert [c.parameters.decoder for c in chunks] == ["h264", "hevc", "vp9"]
    box = sandbox.Sandbox()
    try:
        for chunk in chunks:
            for _ in range(2):  # the zygote's second child too
                assert np.array_equal(box.decode(*job(chunk)), packets.decode(*job(chunk)))
        frames = to_frames(chunks[0], sandbox.decode_chunk(chunks[0], 1 << 20))
        assert np.array_equal(frames.pixels, to_frames(chunks[0], packets.decode_chunk(chunks[0])).pixels)
    finally:
        box.close()


@pytest.mark.parametrize("name, error, words, deadline", [
    ("crash", CodecError, "crashed", 30),
    ("hang", TooMuchWorkError, "deadline of 1 s", 1),
    ("spin", TooMuchWorkError, "deadline of 1 s", 1),
    ("allocate", CodecError, "crashed", 60),  # past its address space's limit
])
def test_a_failing_decoder_costs_its_payload_only(chunks, standins, name, error, words, deadline):
    for _ in range(2):
        with pytest.raises(error, match=words) as refused:
            standins.decode(*naming(chunks[0], name), deadline=deadline)
        assert refused.value.status in (400, 413)
    assert standins._zygote.process.poll() is None  # the zygote lives on: only the child died


def test_the_child_is_confined(chunks, standins):
    if seccomp_filter() is None:
        pytest.skip("libseccomp is not installed here: the sandbox runs with resource limits only")
    got = dict(item.split("=") for item in said(standins.decode(*naming(chunks[0], "attempts"), deadline=5.0)).split())
    assert got == {name: str(errno.EPERM) for name in ("open", "socket", "unix", "exec", "fork", "kill", "write")}, got


@pytest.fixture
def compromised(monkeypatch):
    """A sandbox started by a worker whose environment holds secrets; its decoder a stand-in."""
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    box = sandbox.Sandbox("harness.standins:misbehave")
    yield box
    box.close()


def test_the_zygote_holds_none_of_the_workers_environment(chunks, compromised):
    told = said(compromised.decode(*naming(chunks[0], "environ")))
    assert not any(secret in told for secret in WORKER_SECRETS.values()), told
    # What the zygote was given, and LC_CTYPE, which Python sets itself in a C locale (PEP 538).
    assert set(json.loads(told)["names"]) <= {*sandbox.zygote_environment(), "LC_CTYPE"}


def test_a_childs_refusal_is_told_in_the_workers_words_and_its_output_goes_nowhere(chunks, compromised, capfd, caplog):
    with caplog.at_level(logging.INFO, logger=sandbox.__name__), pytest.raises(CodecError) as refused:
        compromised.decode(*naming(chunks[0], "confide"))
    assert str(refused.value) == sandbox.REFUSALS[CodecError.kind][1]
    printed = "".join(capfd.readouterr())
    assert FORGED not in printed and not any(secret in printed for secret in WORKER_SECRETS.values()), printed
    (line,) = [record.getMessage() for record in caplog.records if record.name == sandbox.__name__]
    assert "\n" not in line and len(line) < 400 and not line.startswith("[METRICS]")
    assert not any(secret in line for secret in WORKER_SECRETS.values())


def test_a_childs_threads_are_capped(chunks, compromised):
    group = pids_cgroup()
    if os.geteuid() == 0 and (group is None or not os.access(group, os.W_OK)):
        pytest.skip("root without a pids cgroup it may write: RLIMIT_NPROC does not hold root, so nothing caps the threads")
    started = int(said(compromised.decode(*naming(chunks[0], "threads"))))
    assert 0 < started < MAX_TASKS


# A sandbox started and let go of; and the process's own, a child kept from its payload (argv[1]),
# left to the interpreter's exit.
DROPPED = """
import gc, os, sys
from pathlib import Path
from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.media import sandboxed

def children():
    return {int(pid) for task in Path("/proc/self/task").iterdir() for pid in (task / "children").read_text().split()}

box = sandboxed.Sandbox()
box.start()
zygote, = children()
del box
gc.collect()
try:
    os.waitpid(zygote, os.WNOHANG)
    print("not reaped")
except ChildProcessError:
    print("reaped")
sandboxed.decode_chunk(wire.decode(Path(sys.argv[1]).read_bytes(), PRESETS["tiny"]))
"""


def test_a_zygote_let_go_of_is_reaped_without_a_resource_warning(payloads, tmp_path):
    """A sandbox let go of unclosed, and the process's own at the interpreter's exit, kill and wait
    for their zygotes and end their kept children: before, Popen warned at exit that the zygote 'is
    still running' and the sockets were left unclosed (ResourceWarning), and a dropped sandbox's
    zygote was left a zombie."""
    (tmp_path / "payload").write_bytes(payloads[0])
    result = subprocess.run([sys.executable, "-X", "dev", "-c", DROPPED, str(tmp_path / "payload")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["reaped"] and "ResourceWarning" not in result.stderr, result.stderr



# A sandbox that keeps a child from its payload (argv[1]), and a fork of its process that exits as
# Python does, running the finalizers it inherited.
FORKED = """
import os, sys
from pathlib import Path
from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.media import sandboxed
chunk = wire.decode(Path(sys.argv[1]).read_bytes(), PRESETS["tiny"])
box = sandboxed.Sandbox()
box.decode(chunk.parameters, chunk.packets, chunk.skip, chunk.frames)
kept, = [k.decoder for k in box.kept.kept.values()]
if os.fork() == 0:
    sys.exit(0)
os.wait()
print("zygote", "alive" if box._zygote.process.poll() is None else "gone")
print("kept", "alive" if Path(f"/proc/{kept.pid}").exists() else "gone")
box.close()
"""


def test_a_fork_that_exits_leaves_the_sandbox_to_its_process(payloads, tmp_path):
    """The finalizers that end a sandbox's kept children and zygote at exit run in the process that
    started them only: a fork of it inherits them, and as it exits would kill the children the
    worker still holds."""
    (tmp_path / "payload").write_bytes(payloads[0])
    result = subprocess.run([sys.executable, "-X", "dev", "-c", FORKED, str(tmp_path / "payload")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.split() == ["zygote", "alive", "kept", "alive"], result.stderr

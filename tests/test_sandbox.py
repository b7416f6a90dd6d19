"""The decoder sandbox (eden_serve/media/sandboxed.py): payloads decoded in a child process give the
pixels of an in-process decode, for every codec the seeds cover; a decoder that crashes, hangs,
spins or allocates without bound costs its payload a refusal, and the next payload decodes; the
child can open no file or socket, run nothing and signal no one."""

from __future__ import annotations

import errno
from dataclasses import replace

import numpy as np
import pytest

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.errors import CodecError, TooMuchWorkError
from eden_serve.media import packets, sandboxed as sandbox
from eden_serve.sandbox.confine import seccomp_filter
from eden_serve.wire.bitstream import to_frames
from harness import fuzz


@pytest.fixture(scope="module")
def chunks(tmp_path_factory):
    payloads = fuzz.bitstream_payloads(tmp_path_factory.mktemp("clips"))
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
    assert standins._zygote.poll() is None  # the zygote lives on: only the child died


def test_the_child_is_confined(chunks, standins):
    if seccomp_filter() is None:
        pytest.skip("libseccomp is not installed here: the sandbox runs with resource limits only")
    with pytest.raises(CodecError) as refused:
        standins.decode(*naming(chunks[0], "attempts"), deadline=5.0)
    got = dict(item.split("=") for item in str(refused.value).split())
    assert got == {name: str(errno.EPERM) for name in ("open", "socket", "unix", "exec", "fork", "kill", "write")}, got

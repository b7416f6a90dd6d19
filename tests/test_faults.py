"""Faults in a real TorchServe's edge worker while clips run (issue 32): a decoder that crashes or
hangs on a hostile bitstream costs that request its answer (the sandbox), not another client's clip
on the same worker; an edge worker killed at each point of a streamed chunk answer (before its
first middle, between middles, after the last middle and before the end record) costs the client
retries, never the run. Kill points are deterministic: harness/faults/sitecustomize.py makes the
worker signal itself at the point armed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import requests
from test_client import FRAMES, assert_same_clip, expected, inputs, output_name  # noqa: F401 - fixtures

from eden_serve import wire
from eden_serve.client import Client
from eden_serve.config import PRESETS
from harness import faults
from harness.fuzz import CLOUD, bitstream_payloads
from harness.hostile import black_4k_packets, seal, starting
from harness.servers import set_handler, torchserve

pytestmark = pytest.mark.serving
DEADLINE_S = 3


@pytest.fixture(scope="module")
def fault_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def cloud(store):
    with torchserve(store, models=["eden_encoder.mar"]) as server:
        yield server


@pytest.fixture(scope="module")
def edge(store, cloud, fault_folder):
    set_handler(store / "eden_ditdec.mar", {"decode_deadline_s": DEADLINE_S})
    with torchserve(store, models=["eden_ditdec.mar"], env=faults.environment(fault_folder)) as server:
        yield server


def split_client(cloud, edge, transport: str = "http") -> Client:
    urls = (cloud.inference_url, edge.inference_url) if transport == "http" else (cloud.grpc_url, edge.grpc_url)
    return Client(cloud=urls[0], edge=urls[1], token=cloud.keys["inference"], edge_token=edge.keys["inference"],
                  transport=transport, tries=10, backoff=0.5, timeout=30)


def hostile(tmp_path, start: bytes) -> bytes:
    """A bitstream payload of real packets whose first packet starts with ``start``: the stand-in
    decoder of harness/faults crashes or hangs on it, as libavcodec might on a hostile one."""
    return seal(starting(wire.decode(bitstream_payloads(tmp_path)[0], PRESETS["tiny"]), start))


def wait_ready(server, model: str = "eden_ditdec") -> None:
    deadline = time.monotonic() + 120
    while not server.ready(model):
        assert time.monotonic() < deadline, "the worker did not come back"
        time.sleep(0.5)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return found


def test_the_edge_worker_starts_a_torch_free_sandbox_as_it_loads(edge):
    """Before any bitstream payload came (the first test of this module's server): the zygote runs,
    has imported PyAV and holds no PyTorch."""
    (pid,) = edge.worker_pids("eden_ditdec")
    zygotes = [child for child in children(pid) if b"eden_serve.sandbox.zygote" in Path(f"/proc/{child}/cmdline").read_bytes()]
    assert len(zygotes) == 1
    maps = Path(f"/proc/{zygotes[0]}/maps")
    deadline = time.monotonic() + 60
    while "libavcodec" not in maps.read_text():
        assert time.monotonic() < deadline, "the zygote never imported PyAV"
        time.sleep(0.2)
    assert "libtorch" not in maps.read_text()


def test_a_decoder_crash_or_hang_costs_only_its_request(tmp_path, cloud, edge, inputs, expected):  # noqa: F811
    payloads = {b"EDEN-CRASH": 400, b"EDEN-HANG": 413}
    bodies = {start: hostile(tmp_path, start) for start in payloads}
    pids = edge.worker_pids("eden_ditdec")
    answers: list[tuple[bytes, int, str]] = []

    def attack():
        for _ in range(2):
            for start, body in bodies.items():
                response = requests.post(f"{edge.inference_url}/predictions/eden_ditdec", data=body, timeout=120,
                                         headers={**edge.inference_headers, "Content-Type": "application/octet-stream"})
                answers.append((start, response.status_code, response.json().get("type")))

    attacker = threading.Thread(target=attack)
    attacker.start()
    with split_client(cloud, edge) as client:
        summary = client.interpolate_clip(inputs["directory"], tmp_path / "out", chunk=2, inflight=2, progress=False)
    attacker.join()
    assert summary.pairs == FRAMES - 1 and summary.retries == 0
    assert_same_clip(tmp_path / "out", expected["directory"], inputs["directory"])
    assert sorted(answers) == sorted([(b"EDEN-CRASH", 400, "bad_payload"), (b"EDEN-HANG", 413, "too_much_work")] * 2)
    assert edge.worker_pids("eden_ditdec") == pids  # the worker lived through them all


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("point", ["before", "between", "after"])
def test_an_edge_worker_killed_mid_answer_costs_a_retry(tmp_path, cloud, edge, fault_folder, inputs, expected, transport, point):  # noqa: F811
    wait_ready(edge)
    killed = edge.worker_pids("eden_ditdec")
    faults.arm(fault_folder, "edge-kill", point)
    out = tmp_path / output_name("directory")
    try:
        with split_client(cloud, edge, transport) as client:
            summary = client.interpolate_clip(inputs["directory"], out, chunk=4, inflight=2, progress=False)
    finally:
        (fault_folder / "edge-kill").unlink(missing_ok=True)
    assert faults.fired(fault_folder, "edge-kill"), "the kill point was never reached"
    (fault_folder / "fired-edge-kill").unlink()
    assert summary.pairs == FRAMES - 1
    assert_same_clip(out, expected["directory"], inputs["directory"])
    wait_ready(edge)
    assert edge.worker_pids("eden_ditdec") != killed


def test_a_small_payload_that_would_decode_many_large_frames_is_refused(edge):
    """600 4K frames from a few kB: refused before a packet is decoded (it used to cost the worker
    seconds of decoding, inline, before its batch)."""
    parameters, packets = black_4k_packets(600)
    chunk = wire.BitstreamChunk(parameters, packets, 598, 2, ["0" * 32] * 2, wire.Decisions([0.0], [0], [], CLOUD))
    payload = wire.encode(chunk, PRESETS["tiny"], wire.BITSTREAM_CODEC)
    assert len(payload) < 100_000
    answer = requests.post(f"{edge.inference_url}/predictions/eden_ditdec", data=payload, timeout=300,
                           headers={**edge.inference_headers, "Content-Type": "application/octet-stream"})
    assert (answer.status_code, answer.json()["type"]) == (413, "too_much_work"), answer.text
    assert "max_decoded_pixels" in answer.json()["message"]

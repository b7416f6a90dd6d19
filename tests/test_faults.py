"""Faults in a real TorchServe's edge worker while clips run (issue 32): a decoder that crashes or
hangs on a hostile bitstream costs that request its answer (the sandbox), not another client's clip
on the same worker; an edge worker killed at each point of a streamed chunk answer (before its
first middle, between middles, after the last middle and before the end record) costs the client
retries, never the run. Kill points are deterministic: harness/faults/sitecustomize.py makes the
worker signal itself at the point armed."""

from __future__ import annotations

import threading
import time
from fractions import Fraction

import pytest
import requests
from test_client import FRAMES, assert_same_clip, expected, inputs, output_name  # noqa: F401 - fixtures

from eden_serve import wire
from eden_serve.client import Client
from eden_serve.config import PRESETS
from eden_serve.wire.bitstream import Packet, StreamParameters
from harness import faults
from harness.fuzz import CLOUD, bitstream_payloads
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
    chunk = wire.decode(bitstream_payloads(tmp_path)[0], PRESETS["tiny"])
    first = chunk.packets[0]
    chunk.packets[0] = Packet(start + first.data, first.pts, first.dts, first.key)
    chunk.decisions.cloud = CLOUD
    return wire.encode(chunk, PRESETS["tiny"], wire.BITSTREAM_CODEC)


def wait_ready(server, model: str = "eden_ditdec") -> None:
    deadline = time.monotonic() + 120
    while not server.ready(model):
        assert time.monotonic() < deadline, "the worker did not come back"
        time.sleep(0.5)


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


@pytest.mark.parametrize("transport, point", [("http", "before"), ("http", "between"), ("http", "after"),
                                              ("grpc", "between"), ("grpc", "after")])
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


def black_4k_packets(count: int) -> tuple:
    """A key frame and ``count - 1`` copies of a skipped P frame of black 3840x2160 H.264: a few
    kB that decode to ``count`` 4K frames."""
    import av

    context = av.CodecContext.create("libx264", "w")
    context.width, context.height, context.pix_fmt = 3840, 2160, "yuv420p"
    context.time_base = Fraction(1, 25)
    context.options = {"preset": "ultrafast", "g": "1000", "bf": "0"}
    frame = av.VideoFrame(3840, 2160, "yuv420p")
    for plane, value in zip(frame.planes, (16, 128, 128)):
        plane.update(bytes([value]) * plane.buffer_size)
    encoded = []
    for pts in range(2):
        frame.pts = pts
        encoded += context.encode(frame)
    encoded += context.encode(None)
    key, skipped = bytes(encoded[0]), bytes(encoded[1])
    return StreamParameters("h264", bytes(context.extradata or b""), 3840, 2160, "yuv420p"), \
        [Packet(key, 0, 0, True)] + [Packet(skipped, i, i, False) for i in range(1, count)]


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

"""The TorchServe deployment end to end, with the tiny model on real TorchServe instances.

Two instances per run: ``server`` (token auth on) serves both models directly and the ``eden``
workflow; ``edge_server`` (token auth off) serves only the edge, next to it, as an edge node would.

Through the workflow, errors arrive as a JSON document with HTTP 200 (README: "Workflow caveat").
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from eden_serve import wire
from eden_serve.config import preset
from eden_serve.edge import middles_of
from eden_serve.media.frames import load_frame, to_png
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import load_archived
from harness.servers import torchserve
from eden_serve.model.synthetic import image_header, scene
from eden_serve.serving.worker import default_threads, usable_cores

pytestmark = pytest.mark.serving

TIMEOUT = 120
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# --- inputs --------------------------------------------------------------------------------------


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def pair(height: int, width: int) -> dict[str, bytes]:
    return {"frame0": png(scene(height, width, 0.0)), "frame1": png(scene(height, width, 1.0))}


def form(fields: dict) -> dict:
    """requests' ``files``: images as file parts, other fields as plain text parts."""
    return {k: (k, v, "image/png") if isinstance(v, bytes) else (None, str(v)) for k, v in fields.items()}


def pixels(data: bytes) -> np.ndarray:
    assert data.startswith(PNG_SIGNATURE), data[:200]
    return np.asarray(Image.open(io.BytesIO(data)))


# --- servers and the in-process oracle -----------------------------------------------------------


@pytest.fixture(scope="module")
def edge_server(store, server):
    with torchserve(store, models=["eden_ditdec.mar"], token_auth=False) as s:
        yield s


@pytest.fixture(scope="module")
def halves(store):
    """The weights the archives carry, loaded here: the in-process reference."""
    return load_archived(store)


def in_process(halves, fields: dict, seed: int = 0, codec: str = wire.DEFAULT_CODEC) -> tuple[bytes, bytes]:
    """(payload, PNG) as cloud.encode -> wire.encode -> wire.decode -> edge.interpolate -> to_png,
    with the workers' thread count, so float reductions run in the same order."""
    cloud, edge = halves
    threads = torch.get_num_threads()
    torch.set_num_threads(default_threads("edge", usable_cores()))
    try:
        f0, f1 = (load_frame(fields[k], k) for k in ("frame0", "frame1"))
        payload = wire.encode(cloud.encode_chunk([f0, f1], seed), cloud.config, codec)
        return payload, to_png(middles_of(edge, [wire.decode(payload, edge.config).pair(0)], uint8=False)[0])
    finally:
        torch.set_num_threads(threads)


def encode(server, fields: dict) -> requests.Response:
    return requests.post(f"{server.inference_url}/predictions/eden_encoder", files=form(fields), headers=server.inference_headers, timeout=TIMEOUT)


def decode(server, body, content_type: str = "application/octet-stream", model: str = "eden_ditdec") -> requests.Response:
    headers = {**server.inference_headers, "Content-Type": content_type}
    return requests.post(f"{server.inference_url}/predictions/{model}", data=body, headers=headers, timeout=TIMEOUT)


def workflow(server, fields: dict) -> requests.Response:
    return requests.post(f"{server.inference_url}/wfpredict/eden", files=form(fields), headers=server.inference_headers, timeout=TIMEOUT)


def assert_error(response: requests.Response, status: int, kind: str, http_status: int | None = None) -> None:
    """An error document {code, type, message} with ``status``, sent with ``http_status``
    (default: the same status)."""
    assert response.status_code == (status if http_status is None else http_status), response.text
    assert response.headers["Content-Type"].startswith("application/json")
    document = response.json()
    assert set(document) == {"code", "type", "message"}, document
    assert (document["code"], document["type"]) == (status, kind), document
    assert "Traceback" not in document["message"] and document["message"]


# --- the good path -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(64, 96), (70, 100)])
def test_workflow_returns_png_of_input_size(server, size):
    response = workflow(server, pair(*size))
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"  # what TorchServe 0.12 workflows send
    assert pixels(response.content).shape == (*size, 3)


@pytest.mark.parametrize("seed, codec", [(0, None), (7, "int8+zstd"), (2**64 - 1, "fp32")])
def test_two_steps_equal_workflow_and_in_process(server, halves, seed, codec):
    fields = {**pair(70, 100), "seed": seed, **({"codec": codec} if codec else {})}
    payload, expected = in_process(halves, fields, seed, codec or wire.DEFAULT_CODEC)

    encoded = encode(server, fields)
    assert encoded.status_code == 200, encoded.text
    assert encoded.headers["Content-Type"] == "application/octet-stream"
    assert encoded.content == payload
    decoded = decode(server, encoded.content)
    assert decoded.status_code == 200, decoded.text
    assert decoded.headers["Content-Type"] == "image/png"
    through_workflow = workflow(server, fields)
    assert through_workflow.status_code == 200

    np.testing.assert_array_equal(pixels(decoded.content), pixels(expected))
    np.testing.assert_array_equal(pixels(through_workflow.content), pixels(expected))


def test_cloud_and_edge_on_two_instances(server, edge_server, halves):
    """The encoder on one TorchServe, the edge on another (token auth off: no header needed)."""
    fields = pair(64, 96)
    encoded = encode(server, fields)
    assert encoded.status_code == 200
    decoded = requests.post(f"{edge_server.inference_url}/predictions/eden_ditdec", data=encoded.content, timeout=TIMEOUT,
                            headers={"Content-Type": "application/octet-stream"})
    assert decoded.status_code == 200, decoded.text
    np.testing.assert_array_equal(pixels(decoded.content), pixels(in_process(halves, fields)[1]))


def test_1080p_pair_through_the_workflow(server):
    response = workflow(server, pair(1080, 1920))
    assert response.status_code == 200
    assert pixels(response.content).shape == (1080, 1920, 3)


def test_dynamic_batching_mixed_sizes_and_a_bad_request(server, halves):
    """Concurrent requests of several sizes reach the workers in batches (batch size 4); each is
    answered on its own, and a bad one among them fails alone."""
    sizes = [(64, 96), (70, 100), (96, 64), (32, 32), (100, 70), (64, 96), (48, 80), (70, 100)]
    cases = [{**pair(*size), "seed": i} for i, size in enumerate(sizes)]
    bad = {"frame0": b"not an image", "frame1": pair(64, 96)["frame1"]}
    with ThreadPoolExecutor(max_workers=len(cases) + 1) as pool:
        direct = [pool.submit(encode, server, case) for case in cases]
        flows = [pool.submit(workflow, server, case) for case in cases]
        refused = pool.submit(encode, server, bad)
        payloads = [f.result() for f in direct]
        decodes = [pool.submit(decode, server, p.content) for p in payloads]
        results = [f.result() for f in decodes]
        through_workflow = [f.result() for f in flows]
    assert_error(refused.result(), 400, "bad_input")
    for case, size, payload, result, flow in zip(cases, sizes, payloads, results, through_workflow):
        expected = pixels(in_process(halves, case, case["seed"])[1])
        assert payload.status_code == 200 and result.status_code == 200 and flow.status_code == 200
        assert expected.shape == (*size, 3)
        # Requests of one size may share a batched forward, which rounds differently in the last float
        # bits: within one 8-bit level of the pair computed alone.
        for got in (pixels(result.content), pixels(flow.content)):
            assert np.abs(got.astype(int) - expected.astype(int)).max() <= 1
            assert (got != expected).mean() < 1e-3
    assert max(max_batch(server, model) for model in server.models()) > 1, "no batch held more than one request"


def max_batch(server, model: str) -> int:
    """The most requests one handler call served, from the HandlerTime metric lines in the log:
    TorchServe tags a per-batch metric with the ids of all requests of the batch."""
    log = (server.log_dir / "ts_log.log").read_text(errors="replace")
    lines = [line for line in log.splitlines() if "[METRICS]HandlerTime." in line and f"#ModelName:{model}," in line]
    return max((len(UUID.findall(line)) for line in lines), default=0)


# --- bad requests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def images():
    good = pair(64, 96)
    return {
        **good,
        "other size": pair(70, 100)["frame1"],
        # 4000 x 2100 = 8.4 M pixels, over the 4K limit; one colour, so the PNG is small.
        "big": png(np.zeros((2100, 4000, 3), np.uint8)),
        # Headers of 60000 x 60000 frames, past Pillow's own decompression-bomb limit.
        **{f"{fmt} bomb": image_header(fmt, 60000, 60000) for fmt in ("PNG", "GIF", "JPEG")},
        # 70000 pixels in all, but wider than a payload can say (wire.MAX_SIDE).
        "wide": png(np.zeros((1, 70000, 3), np.uint8)),
    }


# name: (changes to a good request: field -> value, image name or None to leave the field out; status; type)
ENCODER_CASES = {
    "missing frame1": ({"frame1": None}, 400, "bad_input"),
    "missing both frames": ({"frame0": None, "frame1": None, "seed": 1}, 400, "bad_input"),
    "not an image": ({"frame0": b"GIF89a but not really"}, 400, "bad_input"),
    "frame sent as text": ({"frame0": "hello"}, 400, "bad_input"),
    "different sizes": ({"frame1": "other size"}, 400, "bad_input"),
    "over the pixel limit": ({"frame0": "big", "frame1": "big"}, 413, "frame_too_large"),
    "PNG bomb": ({"frame0": "PNG bomb"}, 413, "frame_too_large"),
    "a side over the wire's limit": ({"frame0": "wide", "frame1": "wide"}, 413, "frame_too_large"),
    "GIF bomb": ({"frame1": "GIF bomb"}, 413, "frame_too_large"),
    "JPEG bomb": ({"frame0": "JPEG bomb", "frame1": "JPEG bomb"}, 413, "frame_too_large"),
    "seed not a number": ({"seed": "abc"}, 400, "bad_input"),
    "negative seed": ({"seed": "-1"}, 400, "bad_input"),
    "seed too large": ({"seed": str(2**64)}, 400, "bad_input"),
    "seed of 4301 digits": ({"seed": "9" * 4301}, 400, "bad_input"),  # beyond Python's int() digit limit
    "unknown codec": ({"codec": "fp8"}, 400, "bad_input"),
}


def encoder_fields(images: dict, changes: dict) -> dict:
    fields = {"frame0": images["frame0"], "frame1": images["frame1"]}
    for name, value in changes.items():
        if value is None:
            fields.pop(name)
        else:
            fields[name] = images.get(value, value) if name.startswith("frame") else value
    return fields


@pytest.mark.parametrize("case", ENCODER_CASES)
def test_bad_encoder_request_direct(server, images, case):
    changes, status, kind = ENCODER_CASES[case]
    pids = server.worker_pids("eden_encoder")
    assert_error(encode(server, encoder_fields(images, changes)), status, kind)
    assert server.worker_pids("eden_encoder") == pids


@pytest.mark.parametrize("case", ENCODER_CASES)
def test_bad_encoder_request_through_workflow(server, images, case):
    changes, status, kind = ENCODER_CASES[case]
    pids = {m: server.worker_pids(m) for m in ("eden__eden_encoder", "eden__eden_ditdec")}
    # The encoder answers with its status, the edge passes the document on with the same status,
    # and the workflow answers 200 with that document (see the module docstring).
    assert_error(workflow(server, encoder_fields(images, changes)), status, kind, http_status=200)
    assert {m: server.worker_pids(m) for m in pids} == pids


@pytest.mark.parametrize("stream", ["http", "grpc"])
def test_a_stream_asked_through_the_workflow_is_refused(server, images, stream):
    """The workflow hands its nodes the client's headers and answers a node's first part: before,
    a 200 holding the first middle's record alone, a fragment no reader takes."""
    fields = encoder_fields(images, {"frame2": images["frame1"]})
    response = requests.post(f"{server.inference_url}/wfpredict/eden", files=form(fields), timeout=TIMEOUT,
                             headers={**server.inference_headers, "X-Eden-Stream": stream})
    assert_error(response, 400, "bad_input", http_status=200)
    assert "/predictions/eden_ditdec" in response.json()["message"]


def _payload(config_name: str, size: tuple[int, int], codec: str = "fp16") -> bytes:
    """A well-formed payload of random conditions for frames of ``size``."""
    config = preset(config_name)
    return wire.encode(synthetic.chunk(config, size), config, codec)


def _corrupt(payload: bytes) -> bytes:
    middle = len(payload) // 2
    return payload[:middle] + bytes([payload[middle] ^ 0xFF]) + payload[middle + 1 :]


def _version(payload: bytes, version: int) -> bytes:
    return payload[:8] + version.to_bytes(2, "little") + payload[10:]


EDGE_CASES = {
    "empty body": (lambda p: b"", 400, "bad_input"),
    "corrupt": (_corrupt, 400, "bad_payload"),
    "truncated": (lambda p: p[: len(p) // 3], 400, "bad_payload"),
    "a PNG": (lambda p: pair(64, 96)["frame0"], 400, "bad_payload"),
    "foreign JSON": (lambda p: b'{"frames": [1, 2]}', 400, "bad_payload"),
    "other model dimensions": (lambda p: _payload("official", (64, 96)), 409, "model_mismatch"),
    "format version 1": (lambda p: _version(p, 1), 400, "unsupported_version"),
    "frame over the pixel limit": (lambda p: _payload("tiny", (2200, 3840)), 413, "payload_too_large"),
    "frame far over the pixel limit": (lambda p: _payload("tiny", (4320, 7680)), 413, "payload_too_large"),
    "upstream error document": (lambda p: b'{"code": 413, "type": "frame_too_large", "message": "frame0 is too large"}', 413, "frame_too_large"),
}


@pytest.fixture(scope="module")
def good_payload(server):
    response = encode(server, pair(64, 96))
    assert response.status_code == 200
    return response.content


@pytest.mark.parametrize("case", EDGE_CASES)
def test_bad_edge_request(server, good_payload, case):
    make, status, kind = EDGE_CASES[case]
    pids = server.worker_pids("eden_ditdec")
    assert_error(decode(server, make(good_payload)), status, kind)
    assert server.worker_pids("eden_ditdec") == pids


def test_edge_reads_an_upstream_error_sent_as_json(server):
    """A node's JSON error may arrive parsed (content type application/json); same answer."""
    document = {"code": 400, "type": "bad_input", "message": "missing form field 'frame1'"}
    assert_error(decode(server, json.dumps(document), content_type="application/json"), 400, "bad_input")


def test_good_requests_after_bad_ones(server, good_payload):
    pids = {m: server.worker_pids(m) for m in server.models()}
    assert decode(server, _corrupt(good_payload)).status_code == 400
    assert encode(server, {"frame0": b"x", "frame1": b"y"}).status_code == 400
    assert decode(server, good_payload).status_code == 200
    assert workflow(server, pair(64, 96)).status_code == 200
    assert {m: server.worker_pids(m) for m in pids} == pids


# --- chunks --------------------------------------------------------------------------------------


def chunk_fields(first: int, count: int, seed: int, size=(64, 96)) -> dict:
    return {**{f"frame{i}": png(scene(*size, first + i)) for i in range(count)}, "seed": seed}


def unzip(body: bytes) -> list[np.ndarray]:
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        names = archive.namelist()
        assert names == [f"{j:03d}.png" for j in range(len(names))]
        return [pixels(archive.read(name)) for name in names]


def test_a_chunk_equals_its_pairs_two_steps_and_through_the_workflow(server):
    """K = 4 pairs in one request, each frame encoded and sent once; the same middles as four pair
    requests with the same seeds, up to the float rounding of batched forwards (1 level)."""
    encoded = encode(server, chunk_fields(0, 5, seed=9))
    assert encoded.status_code == 200, encoded.text
    answer = decode(server, encoded.content)
    assert (answer.status_code, answer.headers["Content-Type"]) == (200, "application/zip"), answer.text
    through_workflow = workflow(server, chunk_fields(0, 5, seed=9))
    assert through_workflow.status_code == 200
    two_steps, workflow_middles = unzip(answer.content), unzip(through_workflow.content)
    assert len(two_steps) == len(workflow_middles) == 4
    for j in range(4):
        single = pixels(workflow(server, chunk_fields(j, 2, seed=9 + j)).content).astype(int)
        for middle in (two_steps[j], workflow_middles[j]):
            assert np.abs(middle.astype(int) - single).max() <= 1
            assert (middle != single).mean() < 1e-3


CHUNK_CASES = {
    "frames of two sizes": (lambda: chunk_fields(0, 3, 0) | {"frame2": png(scene(64, 64, 2))}, 400, "bad_input"),
    "a frame missing": (lambda: {k: v for k, v in chunk_fields(0, 4, 0).items() if k != "frame2"}, 400, "bad_input"),
    "K over the limit": (lambda: chunk_fields(0, 18, 0), 413, "chunk_too_large"),
}


@pytest.mark.parametrize("case", CHUNK_CASES)
def test_bad_chunk_requests(server, case):
    make, status, kind = CHUNK_CASES[case]
    pids = {m: server.worker_pids(m) for m in ("eden_encoder", "eden__eden_encoder", "eden__eden_ditdec")}
    assert_error(encode(server, make()), status, kind)
    assert_error(workflow(server, make()), status, kind, http_status=200)
    assert {m: server.worker_pids(m) for m in pids} == pids


@pytest.mark.parametrize("forge", ["truncated", "forged frame count"])
def test_bad_chunk_payloads(server, forge):
    payload = encode(server, chunk_fields(0, 4, 0)).content
    if forge == "truncated":
        payload = payload[: len(payload) * 2 // 3]
    else:  # one frame more than the body holds, with a digest that fits
        header_len = int.from_bytes(payload[12:16], "little")
        header = json.loads(payload[16 : 16 + header_len])
        header.update(frames=5, means=header["means"] + [0.5], stds=header["stds"] + [0.5],
                      differences=header["differences"] + [0.5], seeds=header["seeds"] + [4])
        head = json.dumps(header).encode()
        body = payload[16 + header_len : -16]
        unsigned = payload[:12] + len(head).to_bytes(4, "little") + head + body
        payload = unsigned + hashlib.blake2b(unsigned, digest_size=16).digest()
    pids = server.worker_pids("eden_ditdec")
    assert_error(decode(server, payload), 400, "bad_payload")
    assert server.worker_pids("eden_ditdec") == pids


# --- operations ----------------------------------------------------------------------------------


def test_token_auth(server, edge_server, good_payload):
    """Without the right key TorchServe 0.12 answers 400 InvalidKeyException (not 401)."""

    def refused(response: requests.Response) -> bool:
        return response.status_code == 400 and response.json()["type"] == "InvalidKeyException"

    octet = {"Content-Type": "application/octet-stream"}
    assert refused(requests.get(f"{server.management_url}/models", timeout=10))
    assert refused(requests.post(f"{server.inference_url}/predictions/eden_ditdec", data=good_payload, headers=octet, timeout=10))
    assert refused(requests.post(f"{server.inference_url}/wfpredict/eden", files=form(pair(64, 96)), timeout=10))
    # Each API has its own key.
    assert refused(requests.get(f"{server.management_url}/models", headers=server.inference_headers, timeout=10))
    assert refused(requests.post(f"{server.inference_url}/wfpredict/eden", files=form(pair(64, 96)), headers=server.management_headers, timeout=10))
    assert requests.get(f"{server.management_url}/models", headers=server.management_headers, timeout=10).status_code == 200
    assert decode(server, good_payload).status_code == 200
    # Token authorization off: no header needed.
    assert requests.get(f"{edge_server.management_url}/models", timeout=10).status_code == 200
    assert requests.post(f"{edge_server.inference_url}/predictions/eden_ditdec", data=good_payload, headers=octet, timeout=TIMEOUT).status_code == 200


def test_model_registration_api_is_off(server):
    response = requests.post(f"{server.management_url}/models", params={"url": "eden_encoder.mar"}, headers=server.management_headers, timeout=30)
    assert response.status_code == 405, response.text


def test_custom_metrics_on_the_metrics_endpoint(server, good_payload):
    assert decode(server, good_payload).status_code == 200
    assert encode(server, pair(64, 96)).status_code == 200
    text = requests.get(f"{server.metrics_url}/metrics", timeout=10).text
    for metric, model in [("EdenEncodeMs", "eden_encoder"), ("EdenPayloadBytes", "eden_encoder"), ("EdenPayloadBytes", "eden_ditdec"),
                          ("EdenDenoiseMs", "eden_ditdec"), ("EdenDecodeMs", "eden_ditdec")]:
        assert f'{metric}{{ModelName="{model}",Level="Model"' in text, (metric, model)


def test_scale_edge_workers(server, good_payload):
    response = requests.put(f"{server.management_url}/models/eden_ditdec", params={"min_worker": 2, "synchronous": "true"},
                            headers=server.management_headers, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    workers = server.describe("eden_ditdec")["workers"]
    assert len(workers) == 2 and len({w["pid"] for w in workers}) == 2
    server.wait_ready()
    assert all(decode(server, good_payload).status_code == 200 for _ in range(4))


# --- the frames codec ----------------------------------------------------------------------------

CUT_CLIP = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))  # real video, a cut after frame 3


def test_frames_codec_middles_equal_the_fp32_codecs(server):
    """The edge archive carries the cloud half: from a frames payload it re-derives the conditions
    the fp32 codec would have carried, so the middles are the same bit for bit, two steps and
    through the workflow."""
    fields = {f"frame{i}": path.read_bytes() for i, path in enumerate(CUT_CLIP[:6])} | {"seed": 5}
    answers = {}
    for codec in ("fp32", "frames"):
        encoded = encode(server, fields | {"codec": codec})
        assert encoded.status_code == 200, encoded.text
        answers[codec] = decode(server, encoded.content)
        assert answers[codec].status_code == 200, answers[codec].text
    assert encoded.content[8:10] == (3).to_bytes(2, "little")  # wire format 3
    through_workflow = workflow(server, fields | {"codec": "frames"})
    expected = unzip(answers["fp32"].content)
    for middles in (unzip(answers["frames"].content), unzip(through_workflow.content)):
        assert len(middles) == 5 and all(np.array_equal(a, b) for a, b in zip(middles, expected))


@pytest.mark.parametrize("height, width", [(17, 33), (64, 95), (1, 1)])
def test_planes_asked_of_frames_of_an_odd_side_come_as_their_rgb(server, height, width):
    """4:2:0 planes need even sides: a chunk with an odd one asked for them (X-Eden-Answer: yuv,
    which anyone may send) failed its whole TorchServe batch with 503 "Prediction failed", a status
    clients retry. It gets its raw RGB middles, as a chunk deeper than 8 bits does."""
    from eden_serve.wire.raw import RAW, decode_raw

    pids = server.worker_pids("eden_ditdec")
    payload = encode(server, pair(height, width)).content
    png = decode(server, payload)
    for answer in ("yuv", "yuv:bt709:full"):
        headers = {**server.inference_headers, "Content-Type": "application/octet-stream", "X-Eden-Answer": answer}
        raw = requests.post(f"{server.inference_url}/predictions/eden_ditdec", data=payload, headers=headers, timeout=TIMEOUT)
        assert (raw.status_code, raw.headers["Content-Type"]) == (200, RAW), raw.text
        assert np.array_equal(decode_raw(raw.content, (width, height), ""), pixels(png.content))
    assert server.worker_pids("eden_ditdec") == pids


def test_bad_frames_payloads_are_4xx_and_the_worker_lives(server):
    payload = encode(server, chunk_fields(0, 3, 0) | {"codec": "frames"}).content
    header_len = int.from_bytes(payload[12:16], "little")
    header = json.loads(payload[16 : 16 + header_len])
    body = payload[16 + header_len : -16]
    other = io.BytesIO()
    Image.fromarray(np.zeros((64, 95, 3), np.uint8)).save(other, format="WEBP", lossless=True)
    first = header["lengths"][0]

    def forged(header: dict, body: bytes) -> bytes:
        head = json.dumps(header).encode()
        unsigned = payload[:12] + len(head).to_bytes(4, "little") + head + body
        return unsigned + hashlib.blake2b(unsigned, digest_size=16).digest()

    pids = server.worker_pids("eden_ditdec")
    mixed = forged(header | {"lengths": [len(other.getvalue()), *header["lengths"][1:]]}, other.getvalue() + body[first:])
    assert_error(decode(server, mixed), 400, "bad_payload")
    assert_error(decode(server, forged(header | {"size": [6000, 6000]}, body)), 413, "payload_too_large")
    assert server.worker_pids("eden_ditdec") == pids

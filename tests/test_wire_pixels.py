"""The frames codec (wire format 3): round trips of real video frames, the documented header, and
the refusals of hostile payloads (limits, bombs, mixed sizes, foreign images) before any pixel is
decoded. Payloads are forged with a valid digest, so each check is reached on its own."""

from __future__ import annotations

import functools
import hashlib
import io
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.errors import ChunkTooLargeError, CodecError, ModelMismatchError, PayloadTooLargeError
from eden_serve.model import synthetic
from eden_serve.wire import Decisions, FramesChunk, decode, encode
from conftest import changed
from eden_serve.serving.answer_formats import PNG_ANSWER
from eden_serve.wire.png import RGB16, png_header, rgb16_png
from harness import envelopes
from harness.envelopes import PREFIX
from harness.videos import gradient

TINY = PRESETS["tiny"]
CLIP = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))  # 160x68 real video, a cut after frame 3
DIGEST = hashlib.sha256(b"cloud weights").hexdigest()

split = functools.partial(envelopes.split, version=3)
reframe = functools.partial(envelopes.reframe, version=3)


def real_pixels(count: int = 5) -> np.ndarray:
    return np.stack([np.asarray(Image.open(path).convert("RGB")) for path in CLIP[:count]])


def frames_chunk(pixels: np.ndarray | None = None) -> FramesChunk:
    pixels = real_pixels() if pixels is None else pixels
    pairs = len(pixels) - 1
    return FramesChunk(pixels, Decisions([0.1 * j - 1.3 for j in range(pairs)], [2**64 - 1 - j for j in range(pairs)], [pairs - 1], DIGEST))


def images(header: dict, body: bytes) -> list[bytes]:
    starts = np.cumsum([0, *header["lengths"]])
    return [body[a:b] for a, b in zip(starts[:-1], starts[1:])]


def with_images(header: dict, parts: list[bytes]) -> bytes:
    return reframe({**header, "lengths": [len(p) for p in parts]}, b"".join(parts))


def webp(array: np.ndarray, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="WEBP", **({"lossless": True} | options))
    return buffer.getvalue()


# --- round trips -------------------------------------------------------------------------------


def test_real_frames_round_trip_exactly():
    chunk = frames_chunk()
    out = decode(encode(chunk, TINY, "frames"), TINY)
    assert isinstance(out, FramesChunk)
    assert out.pixels.dtype == np.uint8 and np.array_equal(out.pixels, chunk.pixels)
    assert out.differences == [float(np.float32(d)) for d in chunk.differences]
    assert (out.seeds, out.cuts, out.cloud, out.size) == (chunk.seeds, chunk.cuts, DIGEST, (68, 160))


@given(st.integers(1, 40), st.integers(1, 40), st.integers(2, 4), st.integers(0, 2**32))
@settings(max_examples=30, deadline=None)
def test_any_pixels_round_trip_exactly(height, width, frames, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    assert np.array_equal(decode(encode(frames_chunk(pixels), TINY, "frames"), TINY).pixels, pixels)


def test_the_header_is_as_documented():
    header, body = split(encode(frames_chunk(), TINY, "frames"))
    assert set(header) == {"fingerprint", "hidden_dim", "codec", "cloud", "size", "frames", "differences", "seeds", "cuts", "lengths"}
    assert (header["codec"], header["size"], header["frames"], header["cuts"]) == ("frames", [68, 160], 5, [3])
    assert sum(header["lengths"]) == len(body)
    for part in images(header, body):  # each a lossless WebP in the simple format
        assert part[:4] == b"RIFF" and part[8:16] == b"WEBPVP8L"
        assert Image.open(io.BytesIO(part)).size == (160, 68)


def test_real_video_frames_are_far_smaller_than_tokens():
    pixels = real_pixels(5)
    payload = encode(frames_chunk(pixels), TINY, "frames")
    assert len(payload) < 0.6 * pixels.nbytes  # lossless, yet well under the raw pixels


def test_format_2_payloads_still_decode():
    payload = encode(synthetic.chunk(TINY, (68, 160), 3), TINY, wire.DEFAULT_CODEC)
    assert PREFIX.unpack_from(payload)[1] == 2
    assert isinstance(decode(payload, TINY), wire.Chunk)


def test_encode_refuses_what_the_codec_cannot_carry():
    with pytest.raises(CodecError, match="uint8"):
        encode(frames_chunk(real_pixels().astype(np.uint16)), TINY, "frames")
    with pytest.raises(CodecError, match="number 4"):
        encode(changed(frames_chunk(), seeds=[0]), TINY, "frames")
    with pytest.raises(CodecError, match="digest"):
        encode(changed(frames_chunk(), cloud="abc"), TINY, "frames")
    with pytest.raises(CodecError, match="does not carry a FramesChunk"):
        encode(frames_chunk(), TINY, "bf16+zstd")


# --- hostile payloads ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good() -> tuple[dict, bytes]:
    return split(encode(frames_chunk(), TINY, "frames"))


LIMITS = [
    ({"max_pixels": 160 * 68 - 1}, PayloadTooLargeError, "pixels per frame"),
    ({"max_tokens": 23}, PayloadTooLargeError, "tokens each"),
    ({"max_frames": 4}, ChunkTooLargeError, "frames per chunk"),
    ({"max_chunk_tokens": 4 * 24}, ChunkTooLargeError, "per chunk"),
]


@pytest.mark.parametrize("limits, error, message", LIMITS)
def test_the_receivers_limits_are_413(good, limits, error, message):
    with pytest.raises(error, match=message) as caught:
        decode(reframe(*good), TINY, **limits)
    assert caught.value.status == 413


def test_a_bomb_is_refused_from_the_headers(good):
    """A payload that states a huge size is over the limits (413); a frame whose own header states
    more than the chunk's size is refused (400) before it is decoded."""
    header, body = good
    huge = {**header, "size": [16000, 16000]}
    with pytest.raises(PayloadTooLargeError):
        decode(reframe(huge, body), TINY, max_pixels=3840 * 2160)
    big = webp(np.zeros((4000, 4000, 3), np.uint8))  # 4000x4000, a few kB
    parts = images(header, body)
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match="frame 2 is 4000x4000, but the chunk's frames are 160x68") as caught:
            decode(with_images(header, parts[:2] + [big] + parts[3:]), TINY)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.status == 400 and peak < 8 << 20  # nothing of the 48 MB decoded


def test_mixed_sizes_are_refused(good):
    header, body = good
    parts = images(header, body)
    other = webp(np.zeros((68, 159, 3), np.uint8))
    with pytest.raises(CodecError, match="frame 4 is 159x68.*share one size") as caught:
        decode(with_images(header, parts[:4] + [other]), TINY)
    assert caught.value.status == 400


@pytest.mark.parametrize("kind", ["png", "lossy webp", "rgba webp", "garbage after the header"])
def test_frames_that_are_not_lossless_rgb_webp_are_refused(good, kind):
    header, body = good
    parts = images(header, body)
    frame = real_pixels(1)[0]
    if kind == "png":
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="PNG")
        bad = buffer.getvalue()
    elif kind == "lossy webp":
        bad = webp(frame, lossless=False)
    elif kind == "rgba webp":
        bad = webp(np.dstack([frame, np.full(frame.shape[:2], 7, np.uint8)]))
    else:
        bad = parts[0][:40] + bytes(len(parts[0]) - 40)
    with pytest.raises(CodecError, match="frame 0") as caught:
        decode(with_images(header, [bad] + parts[1:]), TINY)
    assert caught.value.status == 400


@pytest.mark.parametrize("change, message", [
    ({"lengths": [1, 2, 3]}, "lengths must be a list of 5"),
    ({"lengths": [100] * 5}, "the frames take 500 bytes"),
    ({"lengths": [10**12] * 5}, "lengths must be an integer"),
    ({"cuts": [3, 1]}, "cuts must be an integer in \\[4"),
    ({"cuts": [4]}, "cuts must be an integer"),
    ({"seeds": [0, 1, 2]}, "seeds must be a list of 4"),
    ({"differences": [float("1e39")] * 4}, "differences must be a finite float32"),
    ({"cloud": "0" * 63}, "cloud must be the cloud weights' digest"),
    ({"codec": "bf16+zstd"}, "format 3 carries only 'frames'"),
    ({"size": [68, 20000]}, "size must be an integer"),
    ({"frames": 1}, "frames must be an integer in \\[2"),
    ({"extra": 1}, "not the keys"),
])
def test_malformed_headers_are_400(good, change, message):
    header, body = good
    with pytest.raises(CodecError, match=message) as caught:
        decode(reframe({**header, **change}, body), TINY)
    assert caught.value.status == 400


def test_another_model_is_409(good):
    with pytest.raises(ModelMismatchError):
        decode(reframe(*good), PRESETS["official"])


@given(st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_forged_bodies_raise_only_codec_errors(good, data):
    """Any bytes in the body, under a valid digest: a CodecError, never another exception."""
    header, body = good
    body = bytearray(body)
    for _ in range(data.draw(st.integers(1, 8))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    try:
        out = decode(reframe(header, bytes(body)), TINY)
    except CodecError:
        return
    assert out.pixels.shape == (5, 68, 160, 3)  # damage the WebP decoder does not notice is still the right shape


# --- 16-bit frames ---------------------------------------------------------------------------------


def deep_chunk(count: int = 3) -> FramesChunk:
    pixels = np.stack([gradient(k, (68, 160)) for k in range(count)])
    return FramesChunk(pixels, Decisions([0.5] * (count - 1), list(range(count - 1)), [], DIGEST, depth=16))


def test_16_bit_frames_round_trip_as_16_bit_pngs():
    chunk = deep_chunk()
    header, body = split(encode(chunk, TINY, "frames"))
    assert header["depth"] == 16 and all(png_header(image)[2:] == RGB16 for image in images(header, body))
    got = decode(reframe(header, body), TINY)
    assert got.depth == 16 and np.array_equal(got.pixels, chunk.pixels)
    eight = split(encode(frames_chunk(), TINY, "frames"))[0]
    assert "depth" not in eight  # an 8-bit payload is what it was before depth


def sub_png(pixels: np.ndarray, filter_type: int = 1, extra: bytes = b"") -> bytes:
    """A 16-bit RGB PNG like rgb16_png's, with every row's filter byte ``filter_type`` and ``extra`` inflated after the rows."""
    height, width, _ = pixels.shape
    rows = np.zeros((height, 6 * width + 1), np.uint8)
    rows[:, 0] = filter_type
    rows[:, 1:] = np.ascontiguousarray(pixels, ">u2").view(np.uint8).reshape(height, -1)
    stream = zlib.compress(rows.tobytes() + extra)

    def chunk(kind, data):
        return struct.pack(">I4s", len(data), kind) + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", stream) + chunk(b"IEND", b"")


@pytest.mark.parametrize("kind, words", [
    ("webp", "frame 1 is not a 16-bit RGB PNG"),
    ("8-bit png", "frame 1 is not a 16-bit RGB PNG"),
    ("paeth", "a filter other than None, Sub or Up"),
    ("inflates past its size", "not the 65348 of its size"),
    ("crc", "fails its CRC"),
    ("other size", "frame 1 is 160x67"),
])
def test_16_bit_frames_that_are_not_this_writers_pngs_are_refused(kind, words):
    header, body = split(encode(deep_chunk(), TINY, "frames"))
    parts, pixels = images(header, body), gradient(1, (68, 160))
    bad = {"webp": lambda: webp(np.zeros((68, 160, 3), np.uint8)),
           "8-bit png": lambda: PNG_ANSWER.encode(np.zeros((68, 160, 3), np.uint8)),
           "paeth": lambda: sub_png(pixels, 4),
           "inflates past its size": lambda: sub_png(pixels, 1, bytes(1 << 20)),
           "crc": lambda: parts[1][:-20] + bytes(4) + parts[1][-16:],
           "other size": lambda: rgb16_png(pixels[:67])}[kind]()
    with pytest.raises(CodecError, match=words) as caught:
        decode(with_images(header, [parts[0], bad, parts[2]]), TINY)
    assert caught.value.status == 400


def test_a_depth_other_than_16_is_refused():
    header, body = split(encode(deep_chunk(), TINY, "frames"))
    for depth in (8, 10, "16"):
        with pytest.raises(CodecError, match="depth must be 16 where it is given"):
            decode(reframe({**header, "depth": depth}, body), TINY)

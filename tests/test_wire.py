"""The wire codec: round trips of pairs and chunks, error bounds, the inter-frame coding's exactness,
model and limit checks, and decoding hostile bytes.

The helpers below re-implement the envelope documented in eden_serve.wire.envelope independently,
so the tests also pin the documented format and can forge payloads whose digest is valid.
"""

from __future__ import annotations

import functools
import hashlib
import json
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.errors import (
    BadInputError,
    CodecError,
    ModelMismatchError,
    PayloadTooLargeError,
    UnsupportedVersionError,
)
from eden_serve.model import synthetic
from eden_serve.wire import (
    CODECS,
    DEFAULT_CODEC,
    TOKEN_CODECS,
    Chunk,
    Tokens,
    decode,
    encode,
    kind,
)
from conftest import changed
from harness import envelopes
from harness.envelopes import PREFIX

TINY = PRESETS["tiny"]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# (height, width) -> grid with patch 16 padded to multiples of 32
SIZES = {(32, 32): (2, 2), (100, 130): (8, 10), (33, 70): (4, 6)}

split = functools.partial(envelopes.split, version=2)
reframe = functools.partial(envelopes.reframe, version=2)


def make_chunk(size=(100, 130), frames=2, config=TINY, seed=0) -> Chunk:
    """A chunk shaped like the cloud encoder's, with scalars that float32 does not hold exactly."""
    chunk = synthetic.chunk(config, size, frames, seed=seed)
    pairs = frames - 1
    return changed(chunk, means=[0.1 + 0.01 * i for i in range(frames)], stds=[0.27] * frames,
                   differences=[-1.5] * pairs)


def video_chunk(frames=5, size=(100, 130), seed=0) -> Chunk:
    """Frames that change a little from one to the next, as a video's tokens do."""
    chunk = make_chunk(size, frames, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    drift = lambda x: (x[:1] + 0.05 * torch.randn(x.shape, generator=gen).cumsum(0)).contiguous()  # noqa: E731
    return replace(chunk, cond_dit=Tokens(drift(chunk.cond_dit.values)), cond_dec=Tokens(drift(chunk.cond_dec.values)))


def values(tokens: Tokens) -> torch.Tensor:
    return tokens.frames(0, len(tokens.values))


def f32(value: float) -> float:
    return float(np.float32(value))


# --- round trips -------------------------------------------------------------------------------


def test_codec_names():
    assert set(TOKEN_CODECS) == {c + z for c in ("fp32", "fp16", "bf16", "int8", "int8-token") for z in ("", "+zstd")}
    assert CODECS == (*TOKEN_CODECS, "frames")
    assert DEFAULT_CODEC in TOKEN_CODECS
    assert kind("bf16+zstd").spec == wire.Codec("bf16", True)
    assert kind("int8").spec.name == "int8"
    assert [kind(name).name for name in CODECS] == list(CODECS)


@pytest.mark.parametrize("codec", ["fp32", "fp32+zstd"])
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("frames", [2, 5])
def test_fp32_round_trip_is_exact(codec, size, frames):
    chunk = changed(make_chunk(size, frames), seeds=[2**64 - 1] * (frames - 1))
    out = decode(bytearray(encode(chunk, TINY, codec)), TINY)
    assert (out.grid, out.size, out.frames, out.pairs) == (SIZES[size], size, frames, frames - 1)
    assert out.seeds == [2**64 - 1] * (frames - 1)
    for name in ("cond_dit", "cond_dec"):
        got = values(getattr(out, name))
        assert got.dtype == torch.float32 and torch.equal(got, values(getattr(chunk, name)))
    # the scalars travel as float32 values, exactly
    assert out.means == [f32(m) for m in chunk.means] and out.stds == [f32(0.27)] * frames
    assert out.differences == [f32(-1.5)] * (frames - 1)
    assert all(type(v) is float for v in (*out.means, *out.stds, *out.differences))


def lossy_bound(codec: str, x: torch.Tensor) -> torch.Tensor:
    """The stated worst-case per-element error of each lossy codec, x being [F, N, D]."""
    if codec.startswith("fp16"):  # 11 significant bits; absolute 2**-25 in the subnormal range
        return 2.0**-11 * x.abs() + 2.0**-25
    if codec.startswith("bf16"):  # 8 significant bits
        return 2.0**-8 * x.abs()
    # int8: half a step, i.e. absmax / 254 of the group sharing a scale (a frame's channel, resp. token)
    axis = -1 if codec.startswith("int8-token") else 1
    return x.abs().amax(dim=axis, keepdim=True) / 254 * (1 + 1e-5)


# RMS error relative to the tokens' RMS, with margin over what bench_wire measures at D=768.
RELATIVE_RMS = {"fp16": 5e-4, "bf16": 4e-3, "int8": 1.2e-2, "int8-token": 1.2e-2}


@pytest.mark.parametrize("codec", [c for c in TOKEN_CODECS if not c.startswith("fp32")])
@pytest.mark.parametrize("size", list(SIZES))
def test_lossy_round_trip_within_bounds(codec, size):
    chunk = make_chunk(size, frames=3, seed=3)
    out = decode(encode(chunk, TINY, codec), TINY)
    assert (out.grid, out.size, out.seeds) == (chunk.grid, chunk.size, chunk.seeds)
    for name in ("cond_dit", "cond_dec"):
        x, got = values(getattr(chunk, name)), values(getattr(out, name))
        assert got.dtype == torch.float32 and got.shape == x.shape
        err = (got - x).abs()
        assert (err <= lossy_bound(codec, x)).all()
        assert err.square().mean().sqrt() <= RELATIVE_RMS[kind(codec).spec.encoding] * x.square().mean().sqrt()


@pytest.mark.parametrize("encoding", ["fp32", "fp16", "bf16", "int8", "int8-token"])
def test_inter_frame_coding_is_exact(encoding):
    """+zstd codes frames as changes from the frame before: the values are those of the plain codec, bit for bit."""
    chunk = video_chunk()
    plain, coded = (decode(encode(chunk, TINY, encoding + z), TINY) for z in ("", "+zstd"))
    for name in ("cond_dit", "cond_dec"):
        a, b = getattr(plain, name), getattr(coded, name)
        assert a.values.dtype == b.values.dtype and torch.equal(a.values, b.values)
        assert (a.scale is None and b.scale is None) or torch.equal(a.scale, b.scale)


@pytest.mark.parametrize("codec", TOKEN_CODECS)
def test_a_frame_decodes_the_same_in_any_chunk(codec):
    """Scales are per frame, so pair j of a chunk equals the pair chunk of the same two frames."""
    chunk = video_chunk(frames=5)
    whole = decode(encode(chunk, TINY, codec), TINY)
    for j in range(chunk.pairs):
        sub = changed(chunk, cond_dit=Tokens(chunk.cond_dit.values[j : j + 2]), cond_dec=Tokens(chunk.cond_dec.values[j : j + 2]),
                      means=chunk.means[j : j + 2], stds=chunk.stds[j : j + 2], differences=chunk.differences[j : j + 1],
                      seeds=chunk.seeds[j : j + 1])
        a, b = whole.pair(j), decode(encode(sub, TINY, codec), TINY).pair(0)
        assert torch.equal(a.cond_dit, b.cond_dit) and torch.equal(a.cond_dec, b.cond_dec)
        assert (a.mean, a.std, a.difference, a.seed) == (b.mean, b.std, b.difference, b.seed)


def test_chunks_of_video_are_smaller_than_their_pairs():
    chunk = video_chunk(frames=9)
    whole = len(encode(chunk, TINY, DEFAULT_CODEC))
    pairs = sum(len(encode(make_pair_of(chunk, j), TINY, DEFAULT_CODEC)) for j in range(chunk.pairs))
    assert whole < 0.5 * pairs


def make_pair_of(chunk: Chunk, j: int) -> Chunk:
    return changed(chunk, cond_dit=Tokens(chunk.cond_dit.values[j : j + 2]), cond_dec=Tokens(chunk.cond_dec.values[j : j + 2]),
                   means=chunk.means[j : j + 2], stds=chunk.stds[j : j + 2], differences=chunk.differences[j : j + 1],
                   seeds=chunk.seeds[j : j + 1])


def test_pair_statistics_are_the_float32_mean_of_the_frames():
    out = decode(encode(make_chunk(frames=3), TINY, "fp32"), TINY)
    pair = out.pair(1)
    assert pair.mean == float(np.float32(np.float32(out.means[1]) + np.float32(out.means[2])) / np.float32(2))
    assert pair.cond_dit.shape == (2, 80, TINY.hidden_dim)


@pytest.mark.parametrize("codec", ["int8", "int8-token+zstd"])
def test_int8_all_zero_groups_decode_to_zero(codec):
    chunk = make_chunk()
    chunk.cond_dit.values[0].zero_()  # every token and every channel of frame 0 is zero
    chunk.cond_dec.values[1, 3].zero_()
    chunk.cond_dec.values[:, :, 5].zero_()
    out = decode(encode(chunk, TINY, codec), TINY)
    dit, dec = values(out.cond_dit), values(out.cond_dec)
    assert torch.isfinite(dit).all() and torch.isfinite(dec).all()
    assert not dit[0].any() and not dec[1, 3].any() and not dec[:, :, 5].any()


def test_scalars_are_rounded_to_float32_once():
    out = decode(encode(replace(make_chunk(), means=[0.1 + 1e-12, 0.2]), TINY), TINY)
    assert out.means[0] == f32(0.1)


# --- what encode refuses -----------------------------------------------------------------------


def test_fp16_overflow_is_refused_with_advice():
    chunk = make_chunk()
    chunk.cond_dec.values[0, 0, 0] = 65536.0  # above fp16 max 65504, exact in bf16
    with pytest.raises(CodecError, match="bf16"):
        encode(chunk, TINY, "fp16")
    assert values(decode(encode(chunk, TINY, "bf16"), TINY).cond_dec)[0, 0, 0] == 65536.0


@pytest.mark.parametrize(
    "change",
    [
        {"grid": (8, 11)},
        {"size": (0, 130)},
        {"seeds": [-1]},
        {"seeds": [0, 1]},
        {"stds": [float("nan"), 0.2]},
        {"means": [1e39, 0.1]},
        {"differences": []},
        {"cond_dit": Tokens(torch.zeros(2, 80, 65))},
        {"cond_dec": Tokens(torch.zeros(2, 81, 64))},
        {"cond_dec": Tokens(torch.full((2, 80, 64), float("inf")))},
    ],
)
def test_encode_refuses_inconsistent_chunks(change):
    with pytest.raises(CodecError):
        encode(changed(make_chunk(), **change), TINY)


@pytest.mark.parametrize("name", ["fp8", "int4", "zstd", "fp16+gzip", "", None])
def test_unknown_codec_is_bad_input(name):
    with pytest.raises(BadInputError, match="fp16\\+zstd"):
        kind(name)
    with pytest.raises(BadInputError):
        encode(make_chunk(), TINY, name)


# --- model, version and limit checks -----------------------------------------------------------


def test_other_model_is_a_mismatch():
    payload = encode(make_chunk(), TINY)
    deeper = replace(TINY, dit_depth=3)  # same hidden dim, other fingerprint
    with pytest.raises(ModelMismatchError, match=f"{TINY.fingerprint()}.*{deeper.fingerprint()}.*matching weights"):
        decode(payload, deeper)
    with pytest.raises(ModelMismatchError, match="hidden_dim 768"):
        decode(payload, PRESETS["official"])


def test_other_versions_are_unsupported():
    header, body = split(encode(make_chunk(), TINY))
    with pytest.raises(UnsupportedVersionError, match="version 1.*only versions 2, 3 and 4"):
        decode(reframe(header, body, version=1), TINY)  # the pair-only format of eden-serve 0.1
    with pytest.raises(UnsupportedVersionError, match="version 5"):
        decode(reframe(header, body, version=5), TINY)
    with pytest.raises(CodecError, match="keys .* of the bitstream codec"):
        decode(reframe(header, body, version=4), TINY)  # a format 2 header under format 4
    with pytest.raises(CodecError, match="keys .* of the frames codec"):
        decode(reframe(header, body, version=3), TINY)  # a format 2 header under format 3
    with pytest.raises(UnsupportedVersionError, match="flags"):
        decode(reframe(header, body, flags=1), TINY)


@pytest.mark.parametrize("limit, value, message", [
    ("max_tokens", 79, "80 tokens each, but this edge accepts at most 79"),
    ("max_frames", 2, "over this edge's 2 frames per chunk"),
    ("max_chunk_tokens", 239, "240 tokens in all, over this edge's 239"),
    ("max_pixels", 100 * 130 - 1, "over this edge's limit of 12999 pixels"),
])
def test_receiver_limits(limit, value, message):
    payload = encode(make_chunk((100, 130), frames=3), TINY)  # 3 frames of 80 tokens
    assert decode(payload, TINY, **{limit: value + 1}).grid == (8, 10)
    with pytest.raises(PayloadTooLargeError, match=message) as info:
        decode(payload, TINY, **{limit: value})
    assert info.value.status == 413


def test_unknown_codec_in_payload_is_a_codec_error():
    header, body = split(encode(make_chunk(), TINY))
    with pytest.raises(CodecError, match="fp8"):
        decode(reframe({**header, "codec": "fp8"}, body), TINY)


def forged_headers() -> list:
    header, _ = split(encode(make_chunk(frames=3), TINY, "fp32"))
    cases = [{k: v for k, v in header.items() if k != "seeds"}, {**header, "extra": 1}, [header]]
    for key, value in [
        ("grid", [100000, 100000]),
        ("size", [1600000, 1600000]),
        ("size", [64, 130]),
        ("size", [100]),
        ("size", [100, 130.0]),
        ("size", "100x130"),
        ("grid", [True, 10]),
        ("hidden_dim", 64.0),
        ("fingerprint", 12),
        ("frames", 1),
        ("frames", 2),
        ("frames", 4),
        ("frames", 3.0),
        ("frames", 2**40),
        ("seeds", [0]),
        ("seeds", [0, True]),
        ("seeds", [0, -1]),
        ("seeds", [0, 2**64]),
        ("seeds", {"0": 0}),
        ("means", [float("nan"), 0.1, 0.1]),
        ("stds", [float("inf"), 0.2, 0.2]),
        ("means", [0.1, 0.1, 0.1]),  # not float32 values
        ("means", [1e300, 0.5, 0.5]),
        ("differences", ["0.5", 0.5]),
        ("differences", [1, 0.5]),
        ("differences", [0.5]),
        ("codec", ["fp32"]),
    ]:
        cases.append({**header, key: value})
    raw = json.dumps(header).encode()
    cases += [
        raw[:-1] + b', "frames": 3}',  # duplicate key
        raw.replace(b'"seeds": [0', b'"seeds": [' + b"9" * 5000),  # beyond Python's int parsing limit
        raw.replace(b'"seeds"', b'"seeds\xff"'),  # not UTF-8
        b"[" * 40000 + b"]" * 40000,  # deeper than the JSON parser recurses
    ]
    return cases


@pytest.mark.parametrize("header", forged_headers())
def test_forged_headers_with_valid_digest_are_rejected(header):
    _, body = split(encode(make_chunk(frames=3), TINY, "fp32"))
    with pytest.raises(CodecError):
        decode(reframe(header, body), TINY)


# --- hostile bytes and memory ------------------------------------------------------------------


def huge_declarations() -> dict[str, tuple[bytes, dict]]:
    """Payloads whose declared sizes would need gigabytes, built outside the measured region."""
    header, body = split(encode(make_chunk(), TINY, "fp32+zstd"))
    big = dict(header, size=[4320, 7680], grid=[270, 480])  # 8K: within MAX_TOKENS, 265 MB of fp32
    many = dict(header, frames=1000, means=[0.5] * 1000, stds=[0.5] * 1000, differences=[0.5] * 999, seeds=[0] * 999)
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))  # a few kB that inflate to 64 MB
    return {
        "header length 2**31": (PREFIX.pack(b"EDENWIRE", 2, 0, 2**31) + bytes(100), {}),
        "grid 100000x100000": (reframe({**header, "grid": [100000, 100000], "size": [1600000, 1600000]}, body), {}),
        "8K over max_tokens": (reframe(big, bomb), {"max_tokens": 8160}),
        "8K over max_pixels": (reframe(big, bomb), {"max_pixels": 3840 * 2160}),
        "1000 frames over max_frames": (reframe(many, bomb), {"max_frames": 17}),
        "1000 frames over max_chunk_tokens": (reframe(many, bomb), {"max_chunk_tokens": 1 << 14}),
        "8K body too short": (reframe({**big, "codec": "fp32"}, body), {}),
        "zstd frame larger than the tensors": (reframe(header, bomb), {}),
        "8K zstd frame size mismatch": (reframe(big, bomb), {}),
    }


@pytest.mark.parametrize("case", list(huge_declarations()))
def test_huge_declared_sizes_are_rejected_without_allocating(case):
    payload, kwargs = huge_declarations()[case]
    tracemalloc.start()
    try:
        with pytest.raises(CodecError):
            decode(payload, TINY, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20, f"{case}: peak {peak} bytes"


@pytest.mark.parametrize("codec", ["fp32", "bf16+zstd", "int8+zstd", "fp16"])
def test_decode_allocates_its_result_and_one_frame(codec):
    """No copy of the payload and no float32 copy of the tokens: the result stays in the codec's
    dtype, and the zstd body is read as a stream."""
    chunk = video_chunk(frames=9, size=(480, 640))
    payload = encode(chunk, TINY, codec)
    tracemalloc.start()
    try:
        out = decode(payload, TINY)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    result = sum(t.values.nbytes + (t.scale.nbytes if t.scale is not None else 0) for t in (out.cond_dit, out.cond_dec))
    frame = out.cond_dit.values[0].nbytes
    assert peak <= result + 2 * frame + (1 << 20), f"peak {peak}, result {result}, payload {len(payload)}"
    if not kind(codec).spec.zstd:
        assert peak <= 1.05 * len(payload)


@st.composite
def payloads(draw) -> bytes:
    size = (draw(st.integers(1, 80)), draw(st.integers(1, 80)))
    chunk = make_chunk(size, frames=draw(st.integers(2, 5)), seed=draw(st.integers(0, 2**32)))
    return encode(chunk, TINY, draw(st.sampled_from(TOKEN_CODECS)))


@st.composite
def corrupted(draw) -> bytes:
    data = bytearray(draw(payloads()))
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete"]))
    if kind == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if kind == "flip":
        for at in draw(st.sets(st.integers(0, len(data) - 1), min_size=1, max_size=8)):
            data[at] ^= draw(st.integers(1, 255))  # distinct positions, non-zero masks: always a change
        return bytes(data)
    if kind == "insert":
        at = draw(st.integers(0, len(data)))
        return bytes(data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at:])
    at = draw(st.integers(0, len(data) - 1))
    return bytes(data[:at] + data[at + draw(st.integers(1, 64)) :])


@FUZZ
@given(corrupted())
def test_corrupted_payloads_are_always_rejected(data):
    with pytest.raises(CodecError):
        decode(data, TINY)


def signed(data: bytes) -> bytes:
    return data + hashlib.blake2b(data, digest_size=16).digest()


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=2048),
        st.binary(max_size=2048).map(lambda b: PREFIX.pack(b"EDENWIRE", 2, 0, len(b) // 2) + b),
        st.binary(max_size=2048).map(lambda b: signed(b"EDENWIRE\x02\x00\x00\x00" + b)),  # valid digest
        st.text(max_size=20),
        st.none(),
    )
)
def test_garbage_is_rejected(data):
    with pytest.raises(CodecError):
        decode(data, TINY)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def decode_or_codec_error(data: bytes) -> None:
    try:
        chunk = decode(data, TINY)
    except CodecError:
        return
    assert isinstance(chunk, Chunk)
    for j in range(chunk.pairs):
        assert torch.isfinite(chunk.pair(j).cond_dit).all()


@FUZZ
@given(payloads(), st.data())
def test_forged_header_fields_only_raise_codec_errors(payload, data):
    """Valid digests over arbitrary header values: decode either succeeds or raises CodecError."""
    header, body = split(payload)
    key = data.draw(st.sampled_from(sorted(header)))
    if data.draw(st.booleans()):
        header[key] = data.draw(json_values)
    elif isinstance(header[key], list) and header[key]:
        header[key][data.draw(st.integers(0, len(header[key]) - 1))] = data.draw(json_values)
    else:
        del header[key]
    decode_or_codec_error(reframe(header, body))


@FUZZ
@given(payloads(), st.data())
def test_forged_bodies_only_raise_codec_errors(payload, data):
    """Valid digests over corrupted bodies (the zstd frame, the planes, the int8 scales)."""
    header, body = split(payload)
    body = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    decode_or_codec_error(reframe(header, bytes(body)))

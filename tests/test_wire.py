"""The wire codec: round trips, error bounds, model checks, and decoding hostile bytes.

The helpers below re-implement the byte layout documented in eden_serve.wire independently, so the
tests also pin the documented format and can forge payloads whose digest is valid.
"""

from __future__ import annotations

import hashlib
import json
import struct
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eden_serve import synthetic, wire
from eden_serve.config import PRESETS
from eden_serve.errors import BadInputError, CodecError, ModelMismatchError, UnsupportedVersionError
from eden_serve.wire import CODECS, DEFAULT_CODEC, Conditions, decode, encode, parse_codec

TINY = PRESETS["tiny"]
PREFIX = struct.Struct("<8sHHI")
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# (height, width) -> grid with patch 16 padded to multiples of 32
SIZES = {(32, 32): (2, 2), (100, 130): (8, 10), (33, 70): (4, 6)}


def make_cond(size=(100, 130), config=TINY, seed=0) -> Conditions:
    """Conditions shaped like the cloud encoder's, with scalars that float32 does not hold exactly."""
    return replace(synthetic.conditions(config, size, seed=seed), mean=0.1, std=0.27, difference=-1.5)


def split(payload: bytes) -> tuple[dict, bytes]:
    magic, version, flags, header_len = PREFIX.unpack_from(payload)
    assert (magic, version, flags) == (b"EDENWIRE", 1, 0)
    assert hashlib.blake2b(payload[:-16], digest_size=16).digest() == payload[-16:]
    return json.loads(payload[16 : 16 + header_len]), payload[16 + header_len : -16]


def reframe(header: dict | bytes, body: bytes, *, version=1, flags=0) -> bytes:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    out = PREFIX.pack(b"EDENWIRE", version, flags, len(head)) + head + body
    return out + hashlib.blake2b(out, digest_size=16).digest()


def f32(value: float) -> float:
    return float(np.float32(value))


# --- round trips -------------------------------------------------------------------------------


def test_codec_names():
    assert set(CODECS) == {c + z for c in ("fp32", "fp16", "bf16", "int8", "int8-token") for z in ("", "+zstd")}
    assert DEFAULT_CODEC in CODECS
    assert parse_codec("bf16+zstd") == wire.Codec("bf16", True)
    assert parse_codec("int8").name == "int8"


@pytest.mark.parametrize("codec", ["fp32", "fp32+zstd"])
@pytest.mark.parametrize("size", list(SIZES))
def test_fp32_round_trip_is_exact(codec, size):
    cond = replace(make_cond(size), seed=2**64 - 1)
    out = decode(bytearray(encode(cond, TINY, codec)), TINY)
    assert out.grid == SIZES[size] and out.size == size and out.seed == 2**64 - 1
    for name in ("cond_dit", "cond_dec"):
        got = getattr(out, name)
        assert got.dtype == torch.float32 and got.device.type == "cpu"
        assert torch.equal(got, getattr(cond, name))
    # the scalars travel as float32 values, exactly
    assert (out.mean, out.std, out.difference) == (f32(0.1), f32(0.27), f32(-1.5))
    assert all(type(v) is float for v in (out.mean, out.std, out.difference))


def lossy_bound(codec: str, x: torch.Tensor) -> torch.Tensor:
    """The stated worst-case per-element error of each lossy codec."""
    if codec.startswith("fp16"):  # 11 significant bits; absolute 2**-25 in the subnormal range
        return 2.0**-11 * x.abs() + 2.0**-25
    if codec.startswith("bf16"):  # 8 significant bits
        return 2.0**-8 * x.abs()
    # int8: half a step, i.e. absmax / 254 of the group sharing a scale (a channel, resp. a token)
    axis = -1 if codec.startswith("int8-token") else 1
    return x.abs().amax(dim=axis, keepdim=True) / 254 * (1 + 1e-5)


# RMS error relative to the tokens' RMS, with margin over what bench_wire measures at D=768.
RELATIVE_RMS = {"fp16": 5e-4, "bf16": 4e-3, "int8": 1.2e-2, "int8-token": 1.2e-2}


@pytest.mark.parametrize("codec", [c for c in CODECS if not c.startswith("fp32")])
@pytest.mark.parametrize("size", list(SIZES))
def test_lossy_round_trip_within_bounds(codec, size):
    cond = make_cond(size, seed=3)
    out = decode(encode(cond, TINY, codec), TINY)
    assert (out.grid, out.size, out.seed) == (cond.grid, cond.size, cond.seed)
    assert (out.mean, out.std, out.difference) == (f32(0.1), f32(0.27), f32(-1.5))
    for name in ("cond_dit", "cond_dec"):
        x, got = getattr(cond, name), getattr(out, name)
        assert got.dtype == torch.float32 and got.shape == x.shape
        err = (got - x).abs()
        assert (err <= lossy_bound(codec, x)).all()
        assert err.square().mean().sqrt() <= RELATIVE_RMS[parse_codec(codec).encoding] * x.square().mean().sqrt()


@pytest.mark.parametrize("codec", ["int8", "int8-token+zstd"])
def test_int8_all_zero_groups_decode_to_zero(codec):
    cond = make_cond()
    cond.cond_dit[0].zero_()  # every token and every channel of frame 0 is zero
    cond.cond_dec[1, 3].zero_()
    cond.cond_dec[:, :, 5].zero_()
    out = decode(encode(cond, TINY, codec), TINY)
    assert torch.isfinite(out.cond_dit).all() and torch.isfinite(out.cond_dec).all()
    assert not out.cond_dit[0].any() and not out.cond_dec[1, 3].any() and not out.cond_dec[:, :, 5].any()


def test_scalars_are_rounded_to_float32_once():
    out = decode(encode(replace(make_cond(), mean=0.1 + 1e-12), TINY), TINY)
    assert out.mean == f32(0.1)


# --- what encode refuses -----------------------------------------------------------------------


def test_fp16_overflow_is_refused_with_advice():
    cond = make_cond()
    cond.cond_dec[0, 0, 0] = 65536.0  # above fp16 max 65504, exact in bf16
    with pytest.raises(CodecError, match="bf16"):
        encode(cond, TINY, "fp16")
    assert decode(encode(cond, TINY, "bf16"), TINY).cond_dec[0, 0, 0] == 65536.0


@pytest.mark.parametrize(
    "change",
    [
        {"grid": (8, 11)},
        {"size": (0, 130)},
        {"seed": -1},
        {"std": float("nan")},
        {"mean": 1e39},
        {"cond_dit": torch.zeros(2, 80, 65)},
        {"cond_dec": torch.zeros(2, 81, 64)},
        {"cond_dec": torch.full((2, 80, 64), float("inf"))},
    ],
)
def test_encode_refuses_inconsistent_conditions(change):
    with pytest.raises(CodecError):
        encode(replace(make_cond(), **change), TINY)


@pytest.mark.parametrize("name", ["fp8", "int4", "zstd", "fp16+gzip", "", None])
def test_unknown_codec_is_bad_input(name):
    with pytest.raises(BadInputError, match="fp16\\+zstd"):
        parse_codec(name)
    with pytest.raises(BadInputError):
        encode(make_cond(), TINY, name)


# --- model, version and limit checks -----------------------------------------------------------


def test_other_model_is_a_mismatch():
    payload = encode(make_cond(), TINY)
    deeper = replace(TINY, dit_depth=3)  # same hidden dim, other fingerprint
    with pytest.raises(ModelMismatchError, match=f"{TINY.fingerprint()}.*{deeper.fingerprint()}.*matching weights"):
        decode(payload, deeper)
    with pytest.raises(ModelMismatchError, match="hidden_dim 768"):
        decode(payload, PRESETS["official"])


def test_other_version_is_unsupported():
    header, body = split(encode(make_cond(), TINY))
    with pytest.raises(UnsupportedVersionError, match="version 2.*only version 1"):
        decode(reframe(header, body, version=2), TINY)
    with pytest.raises(UnsupportedVersionError, match="flags"):
        decode(reframe(header, body, flags=1), TINY)


def test_max_tokens():
    payload = encode(make_cond((100, 130)), TINY)  # 80 tokens
    assert decode(payload, TINY, max_tokens=80).grid == (8, 10)
    with pytest.raises(CodecError, match="80 tokens.*at most 79") as info:
        decode(payload, TINY, max_tokens=79)
    assert info.value.status == 413


def test_unknown_codec_in_payload_is_a_codec_error():
    header, body = split(encode(make_cond(), TINY))
    with pytest.raises(CodecError, match="fp8"):
        decode(reframe({**header, "codec": "fp8"}, body), TINY)


def forged_headers() -> list:
    header, _ = split(encode(make_cond(), TINY, "fp32"))
    tensors = header["tensors"]
    cases = [{k: v for k, v in header.items() if k != "seed"}, {**header, "extra": 1}, [header]]
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
        ("seed", True),
        ("seed", -1),
        ("seed", 2**64),
        ("mean", float("nan")),
        ("std", float("inf")),
        ("mean", 0.1),  # not a float32 value
        ("mean", 1e300),
        ("difference", "0.5"),
        ("difference", 1),
        ("raw_size", 2**62),
        ("raw_size", header["raw_size"] + 1),
        ("raw_size", False),
        ("codec", ["fp32"]),
        ("tensors", {}),
        ("tensors", {**tensors, "extra": tensors["cond_dit"]}),
        ("tensors", {**tensors, "cond_dit": {"dtype": "F16", "shape": [2, 80, 64]}}),
        ("tensors", {**tensors, "cond_dit": {"dtype": "F32", "shape": [2, 81, 64]}}),
        ("tensors", {**tensors, "cond_dit": {"dtype": "F32", "shape": [2.0, 80, 64]}}),
        ("tensors", {**tensors, "cond_dit": [2, 80, 64]}),
    ]:
        cases.append({**header, key: value})
    raw = json.dumps(header).encode()
    cases += [
        raw[:-1] + b', "seed": 0}',  # duplicate key
        raw.replace(b'"seed": 0', b'"seed": ' + b"9" * 5000),  # beyond Python's int parsing limit
        raw.replace(b'"seed"', b'"seed\xff"'),  # not UTF-8
        b"[" * 40000 + b"]" * 40000,  # deeper than the JSON parser recurses
    ]
    return cases


@pytest.mark.parametrize("header", forged_headers())
def test_forged_headers_with_valid_digest_are_rejected(header):
    _, body = split(encode(make_cond(), TINY, "fp32"))
    with pytest.raises(CodecError):
        decode(reframe(header, body), TINY)


# --- hostile bytes -----------------------------------------------------------------------------


def huge_declarations() -> dict[str, tuple[bytes, dict]]:
    """Payloads whose declared sizes would need gigabytes, built outside the measured region."""
    header, body = split(encode(make_cond(), TINY, "fp32+zstd"))
    big = dict(header, size=[4320, 7680], grid=[270, 480])  # 8K: within MAX_TOKENS, 265 MB of fp32
    n = 270 * 480
    big["tensors"] = {k: {"dtype": "F32", "shape": [2, n, 64]} for k in ("cond_dit", "cond_dec")}
    big["raw_size"] = 2 * 2 * n * 64 * 4 + 200
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))  # a few kB that inflate to 64 MB
    return {
        "header length 2**31": (PREFIX.pack(b"EDENWIRE", 1, 0, 2**31) + bytes(100), {}),
        "grid 100000x100000": (reframe({**header, "grid": [100000, 100000], "size": [1600000, 1600000]}, body), {}),
        "8K over max_tokens": (reframe(big, bomb), {"max_tokens": 8160}),
        "8K body too short": (reframe({**big, "codec": "fp32"}, body), {}),
        "zstd frame larger than header says": (reframe(header, bomb), {}),
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


@st.composite
def payloads(draw) -> bytes:
    size = (draw(st.integers(1, 80)), draw(st.integers(1, 80)))
    cond = make_cond(size, seed=draw(st.integers(0, 2**32)))
    return encode(cond, TINY, draw(st.sampled_from(CODECS)))


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
        st.binary(max_size=2048).map(lambda b: PREFIX.pack(b"EDENWIRE", 1, 0, len(b) // 2) + b),
        st.binary(max_size=2048).map(lambda b: signed(b"EDENWIRE\x01\x00\x00\x00" + b)),  # valid digest
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
        assert isinstance(decode(data, TINY), Conditions)
    except CodecError:
        pass


@FUZZ
@given(payloads(), st.data())
def test_forged_header_fields_only_raise_codec_errors(payload, data):
    """Valid digests over arbitrary header values: decode either succeeds or raises CodecError."""
    header, body = split(payload)
    key = data.draw(st.sampled_from(sorted(header)))
    if data.draw(st.booleans()):
        header[key] = data.draw(json_values)
    elif key == "tensors":
        name = data.draw(st.sampled_from(sorted(header["tensors"])))
        header["tensors"][name][data.draw(st.sampled_from(["dtype", "shape"]))] = data.draw(json_values)
    else:
        del header[key]
    decode_or_codec_error(reframe(header, body))


@FUZZ
@given(payloads(), st.data())
def test_forged_bodies_only_raise_codec_errors(payload, data):
    """Valid digests over corrupted bodies (mostly the safetensors header and zstd frame)."""
    header, body = split(payload)
    body = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, min(len(body), 300) - 1))] = data.draw(st.integers(0, 255))
    decode_or_codec_error(reframe(header, bytes(body)))

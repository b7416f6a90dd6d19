"""Cloud -> wire -> edge in one process: the output error each codec costs, against tests/golden.

Bounds are about 4x the errors measured on tests/golden (max abs, on a [0, 1] scale): fp32 5e-7,
fp16 6.5e-5, bf16 6.3e-4, int8 per-channel 1.5e-3, int8 per-token 2.7e-3.
"""

import pytest

from eden_serve import wire
from eden_serve.pipeline import interpolate_pair

BOUNDS = {"fp32": 1e-4, "fp16": 3e-4, "bf16": 3e-3, "int8": 1e-2, "int8-token": 1e-2, "int8-channel": 1e-2}


def bound(codec: str) -> float:
    return BOUNDS[codec.removesuffix("+zstd")]


CASES = [(codec, "fast") for codec in wire.CODECS] + [("fp32", "reference"), ("fp32+zstd", "reference")]


@pytest.mark.parametrize("codec, path", CASES)
def test_output_error_per_codec(golden, codec, path):
    out, payload_bytes = interpolate_pair(golden.cloud(), golden.edge(), golden.frame0, golden.frame1, golden.seed, codec, path)
    assert (out - golden.arrays["output"]).abs().max().item() <= bound(codec)
    assert payload_bytes > 0


def test_lossy_codecs_are_smaller(golden):
    cond = golden.cloud().encode(golden.frame0, golden.frame1, seed=golden.seed)
    sizes = {codec: len(wire.encode(cond, golden.config, codec)) for codec in wire.CODECS}
    assert sizes["fp16"] < 0.6 * sizes["fp32"]
    assert sizes[wire.DEFAULT_CODEC] < 0.6 * sizes["fp32"]

"""Raw answers as the output's 4:2:0 planes (wire/raw.py's PLANES flags, serving/answer_formats.py's
``yuv`` answer): the format round trip and its checks; the answer field; a middle's planes made from
its RGB (here) equal those made on the device."""

import numpy as np
import pytest
import torch

from eden_serve.edge.yuv import to_planes
from eden_serve.errors import BadInputError, ServerError
from eden_serve.media.planes import PlaneFormat, swscale_planes
from eden_serve.serving.answer_formats import PNG_ANSWER, RAW_ANSWER, answer_format
from eden_serve.wire.answers import middle_image
from eden_serve.wire.raw import FULL_RANGE, PLANES, RawPlanes, decode_raw, encode_planes, raw_bytes, whole_raw

PIXELS = np.random.default_rng(5).integers(0, 256, (64, 96, 3), dtype=np.uint8)


@pytest.mark.parametrize("matrix, full, left", [("bt601", False, False), ("bt709", False, True), ("bt2020", True, False)])
def test_planes_round_trip(matrix, full, left):
    data = np.arange(96 * 64 * 3 // 2, dtype=np.uint32).astype(np.uint8)
    raw = encode_planes(data, 96, 64, matrix, full, left)
    assert len(raw) == raw_bytes(96, 64, planes=True) == raw_bytes(96, 64) - 96 * 64 * 3 // 2
    got = decode_raw(raw, (96, 64), "")
    assert isinstance(got, RawPlanes) and (got.width, got.height, got.matrix, got.full, got.left) == (96, 64, matrix, full, left)
    assert np.array_equal(got.data, data)
    read = middle_image(raw, (96, 64), "", raw=True)
    assert isinstance(read, RawPlanes) and np.array_equal(read.data, data) and read.matrix == matrix
    assert [np.array_equal(m.data, data) for m in whole_raw(raw * 3, 3, (96, 64), "")] == [True] * 3


def test_planes_are_judged_before_a_sample_is_read():
    raw = encode_planes(np.zeros(96 * 64 * 3 // 2, np.uint8), 96, 64, "bt601", False)
    with pytest.raises(ServerError, match="in planes"):
        decode_raw(raw[:-1], (96, 64), "")
    with pytest.raises(ServerError, match="is 96x64, for frames of 96x66"):
        decode_raw(raw, (96, 66), "")
    bad = bytearray(raw)
    bad[10] = PLANES | FULL_RANGE | 24  # both matrices at once
    with pytest.raises(ServerError, match="flags"):
        decode_raw(bytes(bad), (96, 64), "")
    with pytest.raises(ValueError):
        encode_planes(np.zeros(10, np.uint8), 96, 64, "bt601", False)


def test_the_answer_field():
    local = ("127.0.0.1:8080", "loopback")
    assert answer_format("yuv", *local).planes == PlaneFormat("yuv420p")
    assert answer_format("yuv:bt709:limited", *local).planes == PlaneFormat("yuv420p", "bt709")
    assert answer_format("yuv:bt601:full", *local).planes == PlaneFormat("yuvj420p", "bt601", True)
    assert answer_format("yuv:bt709:limited:left", *local).planes == PlaneFormat("yuv420p", "bt709", left=True)
    assert answer_format("yuv:bt709:limited:centre", *local).planes == PlaneFormat("yuv420p", "bt709")
    assert answer_format("yuv:bt709", "edge.example", "loopback") is PNG_ANSWER
    assert answer_format("raw", *local) is RAW_ANSWER and RAW_ANSWER.planes is None
    for bad in ("yuv:bt999", "yuv:bt709:wide", "raw:bt709", "yuv:bt709:full:x", "yuv:bt709:full:left:x"):
        with pytest.raises(BadInputError):
            answer_format(bad, *local)


@pytest.mark.parametrize("siting", ["", ":left"])
def test_planes_made_here_are_swscales_within_a_level_of_the_devices(siting):
    """From RGB on the host: swscale's planes, what the client's writer would make of the RGB (its
    chroma sited as asked: the answer says so); from a GPU edge's device: within a level of them."""
    answer = answer_format(f"yuv:bt709:limited{siting}", "127.0.0.1", "loopback")
    here = decode_raw(answer.encode(PIXELS), (96, 64), "").data
    assert np.array_equal(here, swscale_planes(PIXELS, answer.planes))
    assert decode_raw(answer.encode(PIXELS), (96, 64), "").left == bool(siting)
    on_device = to_planes(torch.from_numpy(PIXELS)[None], answer.planes).reshape(1, -1, 96)[0].numpy()
    assert np.abs(decode_raw(answer.encode(on_device), (96, 64), "").data.astype(int) - here.astype(int)).max() <= 1
    assert decode_raw(answer.encode(PIXELS), (96, 64), "").matrix == "bt709"
    deep = (PIXELS.astype(np.uint16) * 257)
    assert not isinstance(decode_raw(answer.encode(deep), (96, 64), ""), RawPlanes)  # 16-bit middles stay RGB

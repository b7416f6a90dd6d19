"""The payload kinds' registry (eden_serve/wire/__init__.py, wire/kinds.py): which names are kinds
where, and that each kind does its whole job, the cloud's half to the edge's, in one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.edge.conditions import EdgeSide
from eden_serve.errors import BadInputError, CodecError, ModelMismatchError
from eden_serve.media.frames import load_frame, to_uint8

TINY = PRESETS["tiny"]
CLIP = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))


@pytest.fixture(scope="module")
def frames():
    return [load_frame(path) for path in CLIP[2:7]]  # 04 to 08: a scene cut after 05, pair 1


def test_every_codec_name_is_a_kind_where_it_may_be_asked_for():
    assert wire.CODECS == tuple(name for name, kind in wire.KINDS.items() if kind.listed)
    assert all(wire.kind(name).name == name for name in wire.CODECS)
    assert wire.kind(wire.NO_WIRE, in_process=True).crosses is False
    assert wire.kind(wire.BITSTREAM_CODEC, source=True).from_source
    for name, where in [(wire.NO_WIRE, {}), (wire.BITSTREAM_CODEC, {}), (wire.BITSTREAM_CODEC, {"in_process": True}),
                        ("fp8", {"in_process": True, "source": True}), (None, {})]:
        with pytest.raises(BadInputError, match=f"unknown codec {name!r}; choose one of fp32, "):
            wire.kind(name, **where)
    with pytest.raises(BadInputError, match=f"or {wire.NO_WIRE} in one process"):
        wire.kind("gzip", in_process=True)


def test_a_chunk_names_its_kind():
    assert wire.kind_of(wire.Chunk.__new__(wire.Chunk)).carries is wire.Chunk
    assert wire.kind_of(wire.FramesChunk.__new__(wire.FramesChunk)) is wire.kind(wire.FRAMES_CODEC)
    assert wire.kind_of(wire.BitstreamChunk.__new__(wire.BitstreamChunk)) is wire.kind(wire.BITSTREAM_CODEC, source=True)


@pytest.mark.parametrize("name", [*wire.CODECS, wire.NO_WIRE])
def test_each_kind_carries_a_chunk_from_the_cloud_to_the_edge(tiny_models, frames, name):
    """What the cloud makes crosses (or is handed over), and the edge's conditions are the chunk the
    cloud's own E_cond gives, up to the codec's rounding, with the same decisions and cut copies."""
    cloud, edge = tiny_models
    kind = wire.kind(name, in_process=True)
    made = kind.make(cloud, frames, seed=3, scene_threshold=0.9)
    assert isinstance(made, kind.carries)
    received, payload_bytes = kind.cross(made, cloud.config, edge.config)
    assert (payload_bytes > 0) == kind.crosses
    chunk = kind.conditions(received, EdgeSide.beside(edge, cloud.weights))
    expected = cloud.encode_chunk(frames, seed=3, scene_threshold=0.9)
    assert (chunk.seeds, chunk.cuts, sorted(chunk.copies)) == ([3, 4, 5, 6], [1], [1])
    # Handed over, a cut's copy is its 8-bit pixels on the device; crossed, the PNG of the same pixels.
    assert {j: pixels(copy) for j, copy in chunk.copies.items()} == {j: pixels(copy) for j, copy in expected.copies.items()}
    assert isinstance(chunk.copies[1], torch.Tensor) != kind.crosses
    assert chunk.grid == expected.grid and chunk.size == expected.size
    exact = name in (wire.FRAMES_CODEC, wire.NO_WIRE, "fp32", "fp32+zstd")
    for got, want in ((chunk.cond_dit, expected.cond_dit), (chunk.cond_dec, expected.cond_dec)):
        if exact:
            assert torch.equal(got.frames(0, 5), want.frames(0, 5))
        else:
            assert (got.frames(0, 5) - want.frames(0, 5)).abs().max() < 0.1


def pixels(copy: bytes | torch.Tensor) -> bytes:
    return (copy if isinstance(copy, torch.Tensor) else torch.from_numpy(to_uint8(load_frame(copy)))).numpy().tobytes()


def test_a_kind_refuses_what_it_does_not_carry(tiny_models, frames):
    cloud, _ = tiny_models
    tokens = cloud.encode_chunk(frames[:2])
    with pytest.raises(CodecError, match="codec frames does not carry a Chunk"):
        wire.kind(wire.FRAMES_CODEC).seal(tokens, TINY)
    with pytest.raises(CodecError, match="only a chunk of a source the cloud holds"):
        wire.kind(wire.BITSTREAM_CODEC, source=True).make(cloud, frames[:2])


def test_an_edge_without_cloud_weights_refuses_frames(tiny_models, frames):
    cloud, edge = tiny_models
    kind = wire.kind(wire.FRAMES_CODEC)
    received, _ = kind.cross(kind.make(cloud, frames[:2]), TINY, TINY)
    with pytest.raises(ModelMismatchError, match="carries no cloud weights"):
        kind.conditions(received, EdgeSide(edge))

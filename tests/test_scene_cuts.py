"""The cloud's scene-cut test on a real clip (two real videos joined at the same size), and the
decision travelling in the payload: the cut pair's middle is a copy of its earlier frame."""

import hashlib
import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from eden_serve import wire
from eden_serve.clips.pipeline import interpolate_chunk, interpolate_clip_in_process
from eden_serve.cloud.scene_cuts import SCENE_THRESHOLD, scene_change, scene_cuts, scene_features
from eden_serve.config import PRESETS
from eden_serve.errors import CodecError
from eden_serve.media.frames import load_frame

TINY = PRESETS["tiny"]

CLIP = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))


@pytest.fixture(scope="module")
def frames():
    return [load_frame(path) for path in CLIP]


def test_the_cut_pair_is_flagged_and_no_other(frames):
    flagged = [(a.name, b.name) for a, b, f0, f1 in zip(CLIP, CLIP[1:], frames, frames[1:]) if scene_cuts([f0, f1], SCENE_THRESHOLD)]
    assert flagged == [("05.png", "06.png")]


def test_the_default_threshold_has_a_margin_on_both_sides(frames):
    changes = [scene_change(a, b) for a, b in zip(frames, frames[1:])]
    cut = changes.pop(3)
    assert max(changes) < SCENE_THRESHOLD / 2 and cut > SCENE_THRESHOLD * 1.5


def test_no_threshold_turns_detection_off(frames):
    assert not any(scene_cuts([a, b], None) for a, b in zip(frames, frames[1:]))


def test_the_change_is_zero_for_equal_frames_and_symmetric(frames):
    a, b = frames[3], frames[4]
    assert scene_change(a, a) == pytest.approx(0, abs=1e-6)
    assert scene_change(a, b) == pytest.approx(scene_change(b, a), abs=1e-6)


def test_frames_smaller_than_the_thumbnail_are_measured(frames):
    small = [torch.nn.functional.interpolate(f[None], size=(5, 12), mode="area")[0] for f in frames[3:5]]
    assert scene_cuts(small, SCENE_THRESHOLD)


# --- the decision travels in the payload ---------------------------------------------------------


def test_the_cloud_sends_the_earlier_frame_of_a_cut_and_the_edge_gives_it_back(frames, tiny_models, tmp_path):
    """In process, every pair of the clip: the cut pair's middle is frame 05 exactly, no other is a copy."""
    cloud, edge = tiny_models
    chunk = cloud.encode_chunk(frames, seed=0, scene_threshold=SCENE_THRESHOLD)
    assert sorted(chunk.cuts) == [3]
    payload = wire.encode(chunk, TINY)
    assert sorted(wire.decode(payload, TINY).cuts) == [3]
    middles, _ = interpolate_chunk(cloud, edge, frames, scene_threshold=SCENE_THRESHOLD)
    copies = [j for j in range(len(frames) - 1) if torch.equal(to_uint8_tensor(middles[j]), to_uint8_tensor(frames[j]))]
    assert copies == [3]
    off, _ = interpolate_chunk(cloud, edge, frames, scene_threshold=None)
    assert not torch.equal(to_uint8_tensor(off[3]), to_uint8_tensor(frames[3]))
    # The other pairs run in a batch one pair smaller: the same frames up to float rounding.
    assert (off[:3] - middles[:3]).abs().max() < 1e-5 and (off[4:] - middles[4:]).abs().max() < 1e-5


def to_uint8_tensor(frame: torch.Tensor) -> torch.Tensor:
    return (frame * 255).round()


def test_a_clip_with_a_cut_in_process(tiny_models, tmp_path):
    """The whole command line path: the cut pair comes out as a copy of its earlier frame."""
    src = tmp_path / "clip"
    src.mkdir()
    for path in CLIP:
        (src / path.name).write_bytes(path.read_bytes())
    summary = interpolate_clip_in_process(src, tmp_path / "out", *tiny_models, chunk=3, progress=False)
    assert summary.pairs == len(CLIP) - 1
    out = sorted((tmp_path / "out").iterdir())
    middles = [np.asarray(Image.open(p)) for p in out[1::2]]
    originals = [np.asarray(Image.open(p)) for p in CLIP]
    assert [j for j, m in enumerate(middles) if np.array_equal(m, originals[j])] == [3]


def test_forged_cuts_are_refused(tiny_models, frames):
    cloud, _ = tiny_models
    chunk = cloud.encode_chunk(frames[3:6], seed=0, scene_threshold=SCENE_THRESHOLD)  # 05 -> 06 -> 07
    assert sorted(chunk.cuts) == [0]
    payload = wire.encode(chunk, TINY, "fp32")
    header_len = int.from_bytes(payload[12:16], "little")
    header, body = json.loads(payload[16 : 16 + header_len]), payload[16 + header_len : -16]
    png = chunk.copies[0]
    for cuts, tail in [
        ([[1, len(png)]], png),  # well-formed, at pair 1: accepted
        ([[2, len(png)]], png),  # no pair 2
        ([[0, len(png) + 1]], png),  # longer than the body holds
        ([[0, len(png)], [0, len(png)]], png + png),  # a pair twice
        ([[0, 20]], b"\x89PNG\r\n\x1a\n" + bytes(12)),  # not an RGB PNG
        ([[0, len(png)]], pil_png(np.zeros((10, 10, 3), np.uint8))),  # a PNG of another size
    ]:
        forged = reframe({**header, "cuts": cuts}, body[: len(body) - len(png)] + tail)
        if cuts == [[1, len(png)]]:
            assert sorted(wire.decode(forged, TINY).cuts) == [1]
        else:
            with pytest.raises(CodecError):
                wire.decode(forged, TINY)


def pil_png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def reframe(header: dict, body: bytes) -> bytes:
    head = json.dumps(header).encode()
    out = struct.pack("<8sHHI", b"EDENWIRE", 2, 0, len(head)) + head + body
    return out + hashlib.blake2b(out, digest_size=16).digest()


def test_a_tall_narrow_frame_is_measured_on_a_bounded_thumbnail():
    """A thumbnail's rows followed the frame's aspect: a frame 1 pixel wide and 65536 tall, within
    every limit of a request, was measured on a 64 x 4194304 thumbnail (201 s and 17 GiB for one
    pair). Now at most 1024 rows, squeezed as a wide frame's 7 are stretched; a 1080p frame's as before."""
    luma, histogram = scene_features(torch.rand(3, 4096, 2))
    assert luma.shape == (1024, 64)
    assert histogram.sum().item() == pytest.approx(1.0)
    assert scene_features(torch.rand(3, 1080, 1920))[0].shape == (36, 64)
    assert scene_features(torch.rand(3, 8, 4096))[0].shape == (7, 64)

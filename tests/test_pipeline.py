"""Cloud -> wire -> edge in one process: the output error each codec costs against tests/golden,
and clips in process.

Bounds are about 4x the errors measured on tests/golden (max abs, on a [0, 1] scale): fp32 5e-7,
fp16 6.5e-5, bf16 6.3e-4, int8 per-channel 1.5e-3, int8 per-token 2.7e-3.
"""

import logging
import threading
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from eden_serve import wire
from eden_serve.clips import pipeline as pipeline_module
from eden_serve.clips.pipeline import interpolate_chunk, interpolate_clip_in_process, interpolate_pair
from eden_serve.cloud.scene_cuts import SCENE_THRESHOLD
from eden_serve.config import preset
from eden_serve.errors import BadInputError, PairError
from eden_serve.media import Encoding
from eden_serve.media.frames import load_frame, to_uint8
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import load_pair
from harness.cuda_streams import FakeStreams
from harness.rounding import assert_same_frames, assert_within_rounding

# The frames codec re-derives the float32 conditions at the edge: fp32's bound.
BOUNDS = {"fp32": 1e-4, "fp16": 3e-4, "bf16": 3e-3, "int8": 1e-2, "int8-token": 1e-2, "frames": 1e-4}


def bound(codec: str) -> float:
    return BOUNDS[codec.removesuffix("+zstd")]


CASES = [(codec, "fast") for codec in wire.CODECS] + [("fp32", "reference"), ("fp32+zstd", "reference")]


@pytest.mark.parametrize("codec, path", CASES)
def test_output_error_per_codec(golden, codec, path):
    out, payload_bytes = interpolate_pair(golden.cloud(), golden.edge(), golden.frame0, golden.frame1, golden.seed, codec, path)
    assert (out - golden.arrays["output"]).abs().max().item() <= bound(codec)
    assert payload_bytes > 0


def test_lossy_codecs_are_smaller(golden):
    chunk = golden.cloud().encode_chunk([golden.frame0, golden.frame1], seed=golden.seed)
    sizes = {codec: len(wire.encode(chunk, golden.config, codec)) for codec in wire.TOKEN_CODECS}
    assert sizes["fp16"] < 0.6 * sizes["fp32"]
    assert sizes[wire.DEFAULT_CODEC] < 0.6 * sizes["fp32"]


def test_frames_codec_middles_equal_the_fp32_codecs_bit_for_bit(tiny_models):
    """Real video frames with a scene cut, in one chunk: the edge's re-derived conditions are the
    cloud's float32 ones, so every middle is the fp32 codec's."""
    cloud, edge = tiny_models
    frames = [load_frame(path) for path in sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))[:6]]
    fp32, fp32_bytes = interpolate_chunk(cloud, edge, frames, seed=3, codec="fp32", scene_threshold=SCENE_THRESHOLD)
    got, frames_bytes = interpolate_chunk(cloud, edge, frames, seed=3, codec="frames", scene_threshold=SCENE_THRESHOLD)
    assert torch.equal(got, fp32)
    assert torch.equal(got[3], frames[3])  # the cut's middle is its earlier frame
    assert frames_bytes < 0.5 * fp32_bytes  # with the tiny model's 64 channels; official 768-channel tokens are 12x more


@pytest.mark.parametrize("chunk", [1, 3])
def test_in_process_equals_the_pair_pipeline(tmp_path, tiny_models, chunk):
    """Chunks of one pair compute what the pair pipeline computes: equal. A chunk of three pairs is one
    forward of three, whose sums may run in another order than one pair's: the documented bound."""
    cloud, edge = tiny_models
    src = synthetic.write_clip(tmp_path / "in", 4, 64, 96)
    summary = interpolate_clip_in_process(src, tmp_path / "out", cloud, edge, seed=7, chunk=chunk, inflight=2,
                                          progress=False)
    assert summary.pairs == 3 and summary.payload_bytes > 0
    out = sorted((tmp_path / "out").iterdir())
    for i in range(3):
        f0, f1 = (load_frame(src / f"frame{j}.png") for j in (i, i + 1))
        expected = to_uint8(interpolate_pair(cloud, edge, f0, f1, 7 + i)[0])
        got = np.asarray(Image.open(out[2 * i + 1]))
        if chunk == 1:
            assert np.array_equal(got, expected), f"middle {i}"
        else:
            assert_within_rounding(got, expected, f"middle {i}")


def test_in_process_refuses_an_unknown_codec_before_starting(tmp_path, tiny_models):
    src = synthetic.write_clip(tmp_path / "in", 3, 64, 96)
    with pytest.raises(BadInputError, match="unknown codec"):
        interpolate_clip_in_process(src, tmp_path / "out", *tiny_models, codec="gzip", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ramp, chunks", [(True, [1, 1, 2, 4, 4]), (False, [4, 4, 4])])
def test_a_clip_in_process_ramps_its_first_chunks_where_asked(tmp_path, tiny_models, caplog, ramp, chunks):
    """As a client's, a clip's first chunks in process are 1, 1, 2, 4, ... pairs up to the chunk
    where ramped (a GPU's default: tests/test_cli.py), so that its first middle waits for one pair's
    work; unramped, K pairs each."""
    src = synthetic.write_clip(tmp_path / "in", 13, 32, 48)
    with caplog.at_level(logging.DEBUG, logger="eden_serve.timeline"):
        interpolate_clip_in_process(src, tmp_path / "out", *tiny_models, chunk=4, inflight=1, progress=False, ramp=ramp)
    assert [r.args[1] for r in caplog.records if r.name == "eden_serve.timeline" and r.args[-1] == "done"] == chunks


def test_in_process_checks_the_pixel_limit(tmp_path, tiny_models):
    src = synthetic.write_clip(tmp_path / "in", 3, 64, 96)
    with pytest.raises(PairError, match=r"^pairs 0-1 \(frame0\.png → frame2\.png\): frame0\.png is 96x64 = 6144 pixels, over") as info:
        interpolate_clip_in_process(src, tmp_path / "out", *tiny_models, max_pixels=1000, progress=False)
    assert info.value.status == 413
    assert not (tmp_path / "out").exists()



def test_without_the_wire_the_edge_gets_what_fp32_delivers(golden):
    """Codec none: the chunk's tensors handed over in the process, equal to the lossless codec's."""
    cloud, edge = golden.cloud(), golden.edge()
    handed, none_bytes = interpolate_pair(cloud, edge, golden.frame0, golden.frame1, golden.seed, wire.NO_WIRE)
    wired, _ = interpolate_pair(cloud, edge, golden.frame0, golden.frame1, golden.seed, "fp32")
    assert torch.equal(handed, wired) and none_bytes == 0
    assert (handed - golden.arrays["output"]).abs().max().item() <= bound("fp32")


def test_the_halves_on_two_devices_in_one_process(tmp_path):
    """cloud on one device, edge on another (two CPU devices here; cuda:0,cuda:1 on a GPU host):
    the same frames as on one, the middles up to the documented rounding (the edge's products may
    run on other threads, and MKL's AVX512 kernels round by the thread: test_resume)."""
    config = preset("tiny")
    with pytest.warns(UserWarning, match="synthetic"):
        two = load_pair(None, config, "cpu", edge_device="cpu:0")
        one = load_pair(None, config, "cpu")
    assert (two[0].device, two[1].device) == (torch.device("cpu"), torch.device("cpu:0"))
    src = synthetic.write_clip(tmp_path / "in", 3, 64, 96)
    for name, (cloud, edge) in (("two", two), ("one", one)):
        summary = interpolate_clip_in_process(src, tmp_path / name, cloud, edge, codec=wire.NO_WIRE, progress=False)
        assert summary.pairs == 2 and summary.payload_bytes is None
    assert_same_frames(*([np.asarray(Image.open(f)) for f in sorted((tmp_path / name).iterdir())] for name in ("two", "one")))


SCENE_CUT = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))


def video_of(path: Path, images: list[np.ndarray]) -> Path:
    """The frames as FFV1 video at 25 frames a second (lossless but for the RGB to YUV conversion)."""
    av = pytest.importorskip("av")
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=25)
        stream.height, stream.width = images[0].shape[:2]
        stream.pix_fmt = "yuv444p"
        for k, image in enumerate(images):
            picture = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv444p")
            picture.pts = k
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return path


def decoded(path: Path) -> list[tuple[int, np.ndarray]]:
    import av

    with av.open(str(path)) as container:
        return [(frame.pts, frame.to_ndarray()) for frame in container.decode(video=0)]


@pytest.mark.parametrize("options", [{"chunk": 3}, {"chunk": 2, "factor": 4}, {"chunk": 3, "fps": Fraction(60)}],
                         ids=["2x", "4x", "fps 60"])
def test_a_video_goes_from_the_decoder_to_the_encoder_without_an_image(tmp_path, tiny_models, monkeypatch, options):
    """In one process a video's frames stay tensors, pixels decoded to the encoder's: with Pillow's
    constructors of images made to fail, a clip with a scene cut (its copy included), 2x, 4x and
    retimed, writes the same video as it does with them."""
    from PIL import Image as pil

    cloud, edge = tiny_models
    src = video_of(tmp_path / "cut.mkv", [np.asarray(pil.open(path)) for path in SCENE_CUT])
    options = {**options, "codec": wire.NO_WIRE, "progress": False, "encoding": Encoding(vcodec="ffv1")}  # as eden-serve interpolate
    interpolate_clip_in_process(src, tmp_path / "free.mkv", cloud, edge, **options)
    cuts = []
    encode_chunk = cloud.encode_chunk

    def recorded(*args, **kwargs):
        chunk = encode_chunk(*args, **kwargs)
        cuts.extend(chunk.cuts)
        return chunk

    with monkeypatch.context() as patch:
        patch.setattr(cloud, "encode_chunk", recorded)
        for name in ("fromarray", "frombytes", "frombuffer", "new"):  # (Image.open still tells a video from an image)
            patch.setattr(pil, name, lambda *args, _name=name, **kwargs: pytest.fail(f"Image.{_name} on the tensor path"))
        interpolate_clip_in_process(src, tmp_path / "guarded.mkv", cloud, edge, **options)
    assert cuts  # the scene cut's copy took the tensor path too
    free, guarded = decoded(tmp_path / "free.mkv"), decoded(tmp_path / "guarded.mkv")
    assert len(free) == len(guarded) > len(SCENE_CUT)
    assert all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(free, guarded))


def test_a_chunk_worker_has_a_stream_of_its_own_on_both_gpus(monkeypatch):
    """With the cloud on one GPU and the edge on another (``--device cuda:0,cuda:1``), a worker's
    edge work runs on a stream of its own on the edge's GPU too, as the cloud's does on its GPU:
    before, only the cloud's device had one, and every worker's forward and copy back shared the edge
    GPU's default stream, each copy back waiting for the other workers' forwards."""
    fake = FakeStreams(monkeypatch)
    monkeypatch.setattr(pipeline_module, "_streams", threading.local())
    cloud, edge = torch.device("cuda:0"), torch.device("cuda:1")
    with pipeline_module.worker_stream(cloud, edge):
        pass
    assert {stream.device for _, stream in fake.used} == {cloud, edge}
    with pipeline_module.worker_stream(torch.device("cpu"), torch.device("cpu")):
        pass
    assert len(fake.made) == 2  # none for a CPU; a thread's own streams kept for its next chunk


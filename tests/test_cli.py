"""The eden-serve command: outputs, and one stderr line with exit code 2 for every bad input."""

import io
import json
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from eden_serve.clips.pipeline import interpolate_clip_in_process, interpolate_pair
from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.commands import cli, shared as commands
from eden_serve.commands.bench import pair_flops
from eden_serve.commands.cli import main
from eden_serve.config import preset
from eden_serve.edge import Compile
from eden_serve.errors import BadInputError
from eden_serve.media.frames import load_frame, to_png, to_uint8
from eden_serve.model.checkpoint import load_cloud, load_edge
from eden_serve.model.synthetic import frame_pair, write_clip
from harness.rounding import assert_within_rounding
from harness.videos import make_clip


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    folder = tmp_path_factory.mktemp("frames")
    paths = []
    for i, frame in enumerate(frame_pair(40, 60)):
        paths.append(folder / f"f{i}.png")
        paths[-1].write_bytes(to_png(frame))
    return paths


def run(*args):
    """The installed command in a fresh process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", *map(str, args)], capture_output=True, text=True, timeout=300)


def test_interpolate_equals_split_weights_pipeline(frames, tmp_path):
    out = tmp_path / "mid.png"
    assert main(["interpolate", *map(str, frames), "-o", str(out), "--config", "tiny", "--seed", "4", "--codec", "fp32"]) == 0
    image = np.asarray(Image.open(out))
    assert image.shape == (40, 60, 3) and image.dtype == np.uint8

    assert main(["split-checkpoint", "--config", "tiny", "--out", str(tmp_path / "w")]) == 0
    cloud, edge = load_cloud(tmp_path / "w/eden_cloud.safetensors"), load_edge(tmp_path / "w/eden_edge.safetensors")
    expected, _ = interpolate_pair(cloud, edge, load_frame(frames[0]), load_frame(frames[1]), seed=4, codec="fp32")
    assert np.array_equal(image, to_uint8(expected))


def test_a_png_with_a_late_exif_chunk_is_read_as_stored(frames, tmp_path):
    """An orientation in an eXIf chunk after the pixel data is ignored, as the cloud and browsers
    ignore it. Before: the command turned the frame, and refused it beside an unturned one."""
    png = frames[0].read_bytes()
    exif = Image.Exif()
    exif[0x0112] = 6
    body = b"eXIf" + exif.tobytes()
    late = tmp_path / "late.png"
    late.write_bytes(png[:-12] + len(body[4:]).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big") + png[-12:])
    out = tmp_path / "mid.png"
    assert main(["interpolate", str(late), str(frames[1]), "-o", str(out), "--config", "tiny"]) == 0
    assert Image.open(out).size == (60, 40)


def test_synthetic_weights_warn_in_one_line(frames, tmp_path):
    result = run("interpolate", *frames, "-o", tmp_path / "mid.png", "--config", "tiny")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "eden-serve: warning: no checkpoint given: using synthetic weights (seed 0); the output is NOT a real interpolation"


def bad_inputs(frames, tmp_path):
    other = tmp_path / "other.png"
    other.write_bytes(to_png(frame_pair(30, 60)[0]))
    text = tmp_path / "text.png"
    text.write_text("not an image")
    checkpoint = tmp_path / "eden.pt"
    checkpoint.write_bytes(b"junk")
    return {
        "missing file": ([frames[0], tmp_path / "nope.png"], f"cannot read {str(tmp_path / 'nope.png')!r}: No such file"),
        "not an image": ([frames[0], text], f"{text} is not a readable image"),
        "different sizes": ([frames[0], other], f"frames differ in size: {frames[0]} is 60x40, {other} is 60x30"),
        "too large": ([*frames, "--max-pixels", "100"], f"{frames[0]} is 60x40 = 2400 pixels, over the limit of 100"),
        "bad checkpoint": ([*frames, "--checkpoint", checkpoint], "not a PyTorch checkpoint"),
        "unknown codec": ([*frames, "--codec", "png"], "unknown codec 'png'"),
        "no cuda": ([*frames, "--device", "cuda:0"], "CUDA is not available"),
        "bad option": ([*frames, "--seed", "x"], "invalid int value"),
    }


def test_bad_inputs_give_one_line_and_exit_2(frames, tmp_path):
    out = tmp_path / "mid.png"
    for name, (args, message) in bad_inputs(frames, tmp_path).items():
        result = run("interpolate", *args, "-o", out, "--config", "tiny")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, name
        assert len(lines) == 1 and lines[0].startswith("eden-serve") and ": error: " in lines[0] and message in lines[0], (name, lines)
        assert not out.exists(), name
        assert not list(tmp_path.glob(".mid*")), name


def test_a_pairs_refusal_names_the_file_given(frames, tmp_path):
    """As a clip's refusals name its frames' files: before, `frame0 is 3841x2160 ... over the limit`
    and `frame1 is not a readable image` named the form fields, whichever file was meant."""
    video = make_clip(tmp_path / "clip.mp4", "libx264", {}, (48, 64), 2, synthetic=True)
    big = tmp_path / "big.png"
    Image.new("RGB", (3841, 2160)).save(big)
    for args, message in (([frames[0], video], f"{video} is not a readable image"),
                          ([video, frames[1]], f"{video} is not a readable image"),
                          ([frames[0], big], f"{big} is 3841x2160 = 8296560 pixels, over the limit of 8294400")):
        result = run("interpolate", *args, "-o", tmp_path / "mid.png", "--config", "tiny")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"eden-serve: error: {message}"), result.stderr
        assert not (tmp_path / "mid.png").exists()


@pytest.mark.parametrize("mode, value, suffix", [("I;16", 3000, ".png"), ("F", 0.5, ".tif"), ("I", 70000, ".tif")])
def test_a_pair_whose_middle_the_output_format_cannot_hold_is_refused_before_the_work(tmp_path, monkeypatch, capsys, mode, value, suffix):
    """16-bit grey, float or 32-bit grey frames with `-o mid.jpg`: refused before the models are
    loaded and the middle computed, where it was refused after (`cannot save a I;16 image as JPEG`).
    The same pair into a PNG or TIFF goes on."""
    frames = []
    for i in range(2):
        frames.append(tmp_path / f"f{i}{suffix}")
        Image.new(mode, (48, 32), value).save(frames[-1])
    monkeypatch.setattr(cli, "load_models", lambda args: pytest.fail("the models were loaded"))
    assert main(["interpolate", *map(str, frames), "-o", str(tmp_path / "mid.jpg"), "--config", "tiny"]) == 2
    assert f"cannot save a {mode} image as JPEG" in capsys.readouterr().err
    assert not (tmp_path / "mid.jpg").exists() and not list(tmp_path.glob(".mid*"))
    monkeypatch.undo()
    assert main(["interpolate", *map(str, frames), "-o", str(tmp_path / f"mid{suffix}"), "--config", "tiny"]) == 0
    with Image.open(tmp_path / f"mid{suffix}") as middle:
        assert middle.mode == mode and middle.size == (48, 32)


@pytest.mark.parametrize("exc", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.50 GiB (GPU 0; 14.58 GiB total capacity)"),
    RuntimeError("CUDA error: out of memory"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    MemoryError(),
])
def test_a_device_out_of_memory_is_said_as_such_not_as_an_internal_error(exc):
    """A GPU's allocation failure (a 16 GB card at 1080p) is the user's to answer with a smaller
    chunk or fewer in flight, as the host's is; torch.OutOfMemoryError is a RuntimeError."""
    assert commands.failure(exc) == "error: out of memory; try smaller frames, a smaller --chunk or fewer --inflight"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", ["interpolate", "client"])
def test_a_pair_never_overwrites_an_input(frames, tmp_path, command):
    """Clip mode refuses an output that is its input; pair mode too, however the path is spelt, and
    before any work (the client sends nothing: its server here does not even listen)."""
    frames = [Path(shutil.copy(path, tmp_path)) for path in frames]  # the module's frames stay intact if this fails
    link = tmp_path / "link.png"
    link.symlink_to(frames[1])
    options = ["--config", "tiny"] if command == "interpolate" else ["--server", f"http://127.0.0.1:{closed_port()}", "--tries", "1"]
    before = [path.read_bytes() for path in frames]
    for output in (frames[0], frames[1].parent / ".." / frames[1].parent.name / frames[1].name, link):
        result = run(command, *frames, "-o", output, *options)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "is an input" in lines[0], (output, result.stderr)
    assert [path.read_bytes() for path in frames] == before


@pytest.mark.parametrize("argv", [["split-checkpoint", "--config", "tiny"], ["interpolate", "missing.png", "-o", "x.png"]],
                         ids=["done", "refused"])
def test_the_callers_sigterm_handling_is_given_back(tmp_path, argv):
    """Called from within another program, the command's SIGTERM handler (sys.exit) is the
    program's no longer once it returns: left behind, a later kill raised SystemExit inside whatever
    ran then (a test run's interpreter, waiting at its exit, swallowed it and never ended)."""
    import signal

    mine = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        main([*argv, *(["--out", str(tmp_path / "w")] if argv[0] == "split-checkpoint" else [])])
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, mine)


def test_a_native_crash_of_the_command_names_where_its_threads_stood(tmp_path):
    """A crash in native code (a decoder's, an encoder's, a kernel's) ends the command by the
    signal, as before, but with each thread's stack on stderr, not without a word (a Ctrl-C test
    once ended by SIGSEGV in 1 of 2,863 tests, and nothing said where)."""
    code = ("import ctypes, sys; from eden_serve.commands import cli; "
            "cli._split_checkpoint = lambda args: ctypes.string_at(0); "
            f"sys.argv = ['eden-serve', 'split-checkpoint', '--config', 'tiny', '--out', {str(tmp_path)!r}]; cli.main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -11 and "Segmentation fault" in done.stderr and "<lambda>" in done.stderr, done.stderr[-2000:]


def test_split_checkpoint_prints_sizes(tmp_path, capsys):
    assert main(["split-checkpoint", "--config", "tiny", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "cloud: " in printed and "edge: " in printed and "MB)" in printed


def test_split_checkpoint_refuses_wrong_checkpoint(tmp_path):
    checkpoint = tmp_path / "eden.pt"
    checkpoint.write_bytes(b"junk")
    result = run("split-checkpoint", checkpoint, "--out", tmp_path / "w")
    assert result.returncode == 2 and "not a PyTorch checkpoint" in result.stderr
    assert not (tmp_path / "w").exists()


def test_bench_ends_with_json(capsys):
    assert main(["bench", "--config", "tiny", "--size", "40x60", "--repeat", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert result["ms_per_pair"] > 0 and result["payload_bytes"] > 0 and result["speedup"] > 0
    assert result["max_abs_diff"] < 1e-2
    # The roofline: operations counted on the meta device, rates measured in this run.
    assert result["gflop_per_pair"] == round(pair_flops(preset("tiny"), (40, 60)) / 1e9, 2) > 0
    assert result["achieved_gflops"] >= 0 and result["peak_gflops"] > 0
    assert 0 < result["roofline_fraction"] and 0 < result["roofline_fraction_cpu_time"]


def _counted_by_hand(config, size: tuple[int, int]) -> int:
    """The edge's arithmetic for one pair, written out from EDEN_ARCHITECTURE.md and the fast path's
    algebra (2 flops per multiply-add; attention's two products; elementwise work not counted)."""
    ph, pw = config.patch_grid(*size)
    n, t = ph * pw, (ph // 2) * (pw // 2)  # condition and query tokens
    d, heads, mlp, latent, cond_tokens = config.hidden_dim, config.num_heads, config.mlp_dim, config.latent_dim, 8
    hd = d // heads

    def linear(rows, inputs, outputs):
        return 2 * rows * inputs * outputs

    conditioning = linear(1, 256, d) + linear(1, d, d) + linear(1, 1, d) + linear(1, d, 6 * d)
    dit_block = (linear(t, d, 3 * d) + 4 * heads * t * t * hd + linear(t, d, d)  # self-attention
                 # temporal attention, the condition tokens' keys and values absorbed into the query's side
                 + linear(t, d, 3 * d) + 2 * 2 * t * heads * hd * d + 2 * 2 * t * heads * d * cond_tokens + linear(t, d, d)
                 + linear(t, d, mlp) + linear(t, mlp, d))
    step = conditioning + linear(t, latent, d) + config.dit_depth * dit_block + linear(t, d, 2 * latent)
    decoder_block = (linear(n, d, d) + linear(n + t, d, 2 * d) + 4 * heads * n * (n + t) * hd + linear(n, d, d)
                     + linear(2 * n, d, 2 * d) + linear(n, d, 3 * d) + linear(n, d, d)
                     + linear(n, d, mlp) + linear(n, mlp, d))
    patch = 3 * config.patch_size ** 2
    decode = linear(t, latent, d) + config.decoder_depth * decoder_block + linear(n, d, patch) + linear(n, patch, patch)
    return (len(config.timesteps) - 1) * step + decode


@pytest.mark.parametrize("config, size", [("official", (256, 448)), ("official", (480, 854)), ("tiny", (40, 60))])
def test_the_roofline_counts_the_models_arithmetic_not_the_kernels(config, size):
    """The operations the roofline divides by are the model's (106.3 GFLOP per pair at 256x448 with
    the official dimensions), whatever kernels run them: a kernel that fuses or skips work does not
    change the count, so it shows as time saved, never as extra throughput (docs/gpu.md)."""
    assert pair_flops(preset(config), size) == _counted_by_hand(preset(config), size)


def test_bench_runs_the_frames_codec(capsys):
    """The edge re-derives fp32 conditions: its output is the fp32 reference's up to the fast path's rounding."""
    assert main(["bench", "--config", "tiny", "--size", "40x60", "--repeat", "1", "--codec", "frames"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["codec"] == "frames" and result["payload_bytes"] > 0 and result["max_abs_diff"] < 1e-4


def test_bench_prints_the_precision_it_ran(capsys):
    assert main(["bench", "--config", "tiny", "--size", "40x60", "--repeat", "1", "--precision", "auto", "--no-reference"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["precision"] == "auto" and result["precision_used"] in ("fp32", "bf16")
    assert result["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_a_y4m_pipe_round_trip(tmp_path):
    """PyAV writes Y4M into the command's standard input; the command writes Y4M to its standard
    output; PyAV reads it back: the originals come out exactly (raw video, no RGB round trip)."""
    av = pytest.importorskip("av")
    from test_video import real_video

    source = real_video(tmp_path / "in.y4m", 6, Fraction(25), video="rawvideo", audio=None).read_bytes()

    def piped(*options, data=source):
        result = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "interpolate", "-", "-o", "-", "--config", "tiny",
                                 *options], input=data, capture_output=True, timeout=300)
        assert result.returncode == 0, result.stderr.decode()
        with av.open(io.BytesIO(result.stdout)) as container:
            stream = container.streams.video[0]
            planes = [frame.to_ndarray() for frame in container.decode(stream)]
            return container.format.name, stream.average_rate, planes, result.stderr.decode()

    with av.open(io.BytesIO(source)) as container:
        decoded = list(container.decode(video=0))
        originals = [frame.to_ndarray() for frame in decoded]
    fmt, rate, planes, err = piped()
    assert (fmt, rate, len(planes)) == ("yuv4mpegpipe", 50, 11)
    assert all(np.array_equal(planes[2 * i], originals[i]) for i in range(6))
    assert "5 pairs, 11 frames written" in err
    fmt, rate, planes, err = piped("--fps", "60")
    assert (fmt, rate, len(planes)) == ("yuv4mpegpipe", 60, 15)  # 6 frames of 1/25 s: 0.24 s, ceil(14.4)
    assert "--fps 60: each frame within" in err
    # The same frames without a header, as ffmpeg -f rawvideo sends them.
    raw = b"".join(bytes(plane) for frame in decoded for plane in frame.planes)
    fmt, rate, planes, err = piped("--input-size", "90x160", "--input-fps", "25", data=raw)
    assert (fmt, rate, len(planes)) == ("yuv4mpegpipe", 50, 11)
    assert all(np.array_equal(planes[2 * i], originals[i]) for i in range(6))



@pytest.mark.parametrize("output", ["-", "out.mkv"])
def test_raw_video_on_a_pipe_cut_inside_a_frame_is_refused(tmp_path, output):
    """Three frames and 100 bytes of a fourth: the size or format given is not the stream's (the
    docs' "a pipe's last frame, if cut short, ends the run with an error"). Before, its decoder's
    refusal was read on as damage: one frame said to be lost, exit 0."""
    frame = 48 * 64 * 3 // 2
    data = b"".join(bytes([40 * k + 10]) * frame for k in range(3)) + bytes(100)
    result = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "interpolate", "-", "-o", output, "--input-size", "48x64",
                             "--config", "tiny"], input=data, capture_output=True, timeout=300, cwd=tmp_path)
    lines = [line for line in result.stderr.decode().splitlines() if "no checkpoint given" not in line]
    assert result.returncode == 2 and lines == [f"eden-serve: error: -: its last frame is cut short (100 of {frame} bytes): the stream "
                                                "is not whole frames of the --input-size and --input-pix-fmt given"], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == []

def test_a_directory_output_prints_the_ffmpeg_command_that_assembles_it(tmp_path, capsys):
    src = tmp_path / "in"
    src.mkdir()
    for i, frame in enumerate(frame_pair(40, 60)):
        (src / f"{i}.png").write_bytes(to_png(frame))
    assert main(["interpolate", str(src), "-o", str(tmp_path / "out"), "--config", "tiny", "--wire-codec", "fp32"]) == 0
    out = capsys.readouterr().out
    assert f"ffmpeg -framerate RATE -i {tmp_path / 'out' / '%06d.png'} -c:v libx264" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["000000.png", "000001.png", "000002.png"]


@pytest.mark.parametrize("name", ["out.png", "out.JPG", "out.tif"])
def test_a_directory_of_frames_into_an_image_name_is_refused_in_one_line(tmp_path, name):
    """A directory of frames gives a directory, or one video (a video's name: tests/test_sequence_video.py):
    one named out.png would be taken for an image, so the name is refused before any pair and
    nothing is left; an empty directory so named, made by the user, is theirs to fill."""
    src = write_clip(tmp_path / "in", 3, 32, 48)
    result = run("interpolate", src, "-o", tmp_path / name, "--config", "tiny")
    assert "names an image, and a directory of frames gives a directory of frames, or one video" in one_error(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    (tmp_path / name).mkdir()
    assert run("interpolate", src, "-o", tmp_path / name, "--config", "tiny").returncode == 0
    assert len(list((tmp_path / name).iterdir())) == 5


def one_error(result) -> str:
    """The one line of a failed run (the synthetic weights' warning aside); no abort, no traceback."""
    lines = [line for line in result.stderr.splitlines() if "warning: no checkpoint given" not in line]
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("eden-serve: error: "), result.stderr
    return lines[0]


def test_an_error_while_workers_are_inside_a_forward_exits_2(tmp_path):
    """Frame 12 of another size stops the run while other chunks are computing: one line and exit 2,
    not an abort as the interpreter finalises under them."""
    src = write_clip(tmp_path / "in", 16, 160, 256)
    Image.new("RGB", (256, 162)).save(src / "frame12.png")
    result = run("interpolate", src, "-o", tmp_path / "out", "--config", "tiny", "--chunk", "2", "--inflight", "4")
    assert one_error(result).endswith(": frame12.png is 256x162, unlike frame0.png before it (256x160)")  # the file to mend
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("link", ["dangling", "loop", "empty directory"])
def test_an_output_that_is_a_symlink_is_refused_before_any_pair(tmp_path, link):
    src = write_clip(tmp_path / "in", 5, 32, 48)
    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()
    out.symlink_to({"dangling": tmp_path / "nothing", "loop": out, "empty directory": tmp_path / "empty"}[link])
    result = run("interpolate", src, "-o", out, "--config", "tiny")
    assert "is a symbolic link" in one_error(result)
    assert out.is_symlink() and not list((tmp_path / "empty").iterdir()) and not list(tmp_path.glob(".out*"))


def in_small_filesystem(tmp_path, command: list, size: str = "48k", options: str = ""):
    """``command`` run with ``tmp_path / "small"`` a tmpfs of ``size`` of its own (a mount namespace);
    prints what the tmpfs holds afterwards."""
    small = tmp_path / "small"
    small.mkdir(exist_ok=True)
    script = (f"mount -t tmpfs -o size={size}{options} none {small} || exit 99; "
              f"{' '.join(map(shlex.quote, map(str, command)))}; code=$?; ls -A {small}; exit $code")
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    if result.returncode == 99 or "unshare failed" in result.stderr:
        pytest.skip("needs root and mount namespaces for a small file system")
    return result


@pytest.mark.parametrize("kind", ["directory", "gif", "apng"])
def test_a_full_disk_ends_in_one_line_and_leaves_nothing(tmp_path, kind):
    src = write_clip(tmp_path / "in", 9, 64, 96)
    if kind != "directory":
        frames = [Image.open(path).convert("RGB") for path in sorted(src.iterdir())]
        src = tmp_path / ("in.gif" if kind == "gif" else "in.png")
        frames[0].save(src, save_all=True, append_images=frames[1:], duration=40)
    out = tmp_path / "small" / ("out" + src.suffix)
    result = in_small_filesystem(tmp_path, [sys.executable, "-m", "eden_serve.commands.cli", "interpolate", src, "-o", out,
                                            "--config", "tiny", "--chunk", "2"])
    assert "No space left on device" in one_error(result) and result.stdout == ""  # nothing left in the tmpfs


def test_resume_into_a_read_only_directory_is_refused_in_one_line(tmp_path):
    src = write_clip(tmp_path / "in", 5, 32, 48)
    result = in_small_filesystem(tmp_path, [sys.executable, "-m", "eden_serve.commands.cli", "interpolate", src, "-o",
                                            tmp_path / "small" / "out", "--config", "tiny", "--resume"], options=",ro")
    assert "its directory is not writable" in one_error(result)


def test_an_output_directory_made_by_another_run_meanwhile_is_kept(tmp_path):
    src, out = write_clip(tmp_path / "in", 7, 32, 48), tmp_path / "out"

    def meanwhile(index, before, after, seed):
        if index == 3:  # another run finishes first
            out.mkdir()
            (out / "000000.png").write_bytes(b"theirs")
        return before.image

    with pytest.raises(BadInputError, match=r"output '.*out' was created by something else while this run wrote it"):
        interpolate_clip(src, out, pairwise(meanwhile), chunk=2, progress=False)
    assert [p.name for p in out.iterdir()] == ["000000.png"] and not list(tmp_path.glob(".out*"))


# --- devices --------------------------------------------------------------------------------------


def gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_device_auto_is_the_gpu_where_there_is_one(monkeypatch):
    gpus(monkeypatch, 0)
    assert commands.devices("auto") == ("cpu", "cpu")
    gpus(monkeypatch, 1)
    assert commands.devices("auto") == ("cuda", "cuda")
    assert cli._build_parser().parse_args(["bench"]).device == "auto"


def test_two_devices_cloud_then_edge(monkeypatch):
    gpus(monkeypatch, 2)
    assert commands.devices("cuda:0,cuda:1") == ("cuda:0", "cuda:1")
    assert commands.devices("cpu,cuda:1") == ("cpu", "cuda:1")
    gpus(monkeypatch, 0)
    assert commands.devices("cpu,cpu") == ("cpu", "cpu")


def test_two_gpus_asked_for_and_one_visible_share_it(monkeypatch):
    gpus(monkeypatch, 1)
    with pytest.warns(commands.DeviceFallbackWarning, match="only 1 GPU"):
        assert commands.devices("cuda:0,cuda:1") == ("cuda:0", "cuda:0")


@pytest.mark.parametrize("text, message", [("cuda:0,cuda:1", "CUDA is not available"), ("cpu,cpu,cpu", "one device or two"),
                                           ("tpu", "unknown device 'tpu'"), ("cpu,", "unknown device ''")])
def test_bad_devices(monkeypatch, text, message):
    gpus(monkeypatch, 0)
    with pytest.raises(BadInputError, match=message):
        commands.devices(text)


def test_interpolate_on_two_devices_without_the_wire(frames, tmp_path):
    """The halves on two devices without the wire give the middle of one device through the lossless
    codec, up to the documented rounding: two processes, whose products may round by the thread."""
    out = tmp_path / "mid.png"
    result = run("interpolate", *frames, "-o", out, "--config", "tiny", "--device", "cpu,cpu", "--codec", "none", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert "payload 0 bytes, codec none" in result.stdout
    wired = tmp_path / "wired.png"
    assert run("interpolate", *frames, "-o", wired, "--config", "tiny", "--codec", "fp32", "--seed", "3").returncode == 0
    assert_within_rounding(np.asarray(Image.open(out)), np.asarray(Image.open(wired)))


# --- defaults that fit the device ---------------------------------------------------------------


class LoadedEdge:
    def accelerate(self, acceleration):
        self.acceleration = acceleration


def loaded(monkeypatch) -> list:
    """The halves as far as a command sets them up (commands.load_models): what it asked of load_pair."""
    calls = []

    def load_pair(checkpoint, config, device, precision, edge_device):
        calls.append({"device": device, "edge_device": edge_device, "precision": precision, "edge": LoadedEdge()})
        return None, calls[-1]["edge"]

    monkeypatch.setattr(commands, "load_pair", load_pair)
    return calls


@pytest.mark.parametrize("count, precision, graphs", [(1, "auto", True), (0, "fp32", False)])
def test_interpolate_picks_precision_and_graphs_by_device(monkeypatch, count, precision, graphs):
    """On a GPU: auto (bf16 from compute capability 8.0: tests/test_sizing.py), CUDA graphs,
    uncompiled; with prepared artefacts (--compiled), inductor in the background from them; on a
    CPU: fp32, eager, uncompiled either way. An explicit --precision, --cuda-graphs or --compile wins."""
    gpus(monkeypatch, count)
    calls = loaded(monkeypatch)
    args = cli._build_parser().parse_args(["interpolate", "a.png", "b.png", "-o", "m.png"])
    commands.load_models(args)
    edge = calls[-1]["edge"]
    device = torch.device(calls[-1]["edge_device"])
    assert calls[-1]["precision"] == precision and edge.acceleration.graphs_on(device) == graphs
    assert edge.acceleration.compiler(device) is None
    loaded_from = []
    monkeypatch.setattr(commands.artefacts, "read_header", lambda path: None)
    monkeypatch.setattr(commands.artefacts, "load_into", lambda edge, path: loaded_from.append(path))
    args = cli._build_parser().parse_args(["interpolate", "a.png", "b.png", "-o", "m.png", "--compiled", "prepared.bin"])
    commands.load_models(args)
    assert calls[-1]["edge"].acceleration.compiler(device) == (Compile() if graphs else None) and loaded_from == ["prepared.bin"]
    args = cli._build_parser().parse_args(["interpolate", "a.png", "b.png", "-o", "m.png", "--compiled", "prepared.bin",
                                           "--compile", "off"])
    commands.load_models(args)
    assert calls[-1]["edge"].acceleration.compiler(device) is None
    args = cli._build_parser().parse_args(["interpolate", "a.png", "b.png", "-o", "m.png", "--precision", "bf16",
                                           "--cuda-graphs", "off", "--compile", "max-autotune-no-cudagraphs"])
    commands.load_models(args)
    assert calls[-1]["precision"] == "bf16" and calls[-1]["edge"].acceleration.cuda_graphs == "off"
    assert calls[-1]["edge"].acceleration.compile.mode == "max-autotune-no-cudagraphs"
    args = cli._build_parser().parse_args(["interpolate", "a.png", "b.png", "-o", "m.png", "--compile", "off"])
    commands.load_models(args)
    assert calls[-1]["edge"].acceleration.compiler(device) is None


@pytest.mark.parametrize("device, chunk, inflight", [("cuda:0", 16, 3), ("cuda:1", 16, 3), ("cpu", 8, 2)])
def test_a_clip_in_process_gets_the_chunks_and_encoder_speed_of_its_device(monkeypatch, tmp_path, device, chunk, inflight):
    """A new user's eden-serve interpolate clip.mp4 -o out.mp4: on a GPU, chunks of 16 pairs (the
    batch its memory allows at 480x854), 3 in flight and an encoder that keeps the pace (x264
    veryfast or NVENC: tests/test_encoding.py), its first chunks ramped (a sooner first middle); on a
    CPU, as before. What the command line says wins. NVENC is told the edge's GPU (before: GPU 0 with
    the edge on cuda:1)."""
    runs = []
    monkeypatch.setattr(commands.pipeline, "interpolate_clip_in_process", lambda *args, **kwargs: runs.append(kwargs))
    edge = LoadedEdge()
    edge.device = torch.device(device)
    src = write_clip(tmp_path / "clip", 2, 32, 48)  # the source is checked before the models load
    for argv, expected in (([], (chunk, inflight, edge.device.type == "cuda")), (["--chunk", "4", "--inflight", "1", "--no-ramp"], (4, 1, False)),
                           (["--ramp"], (chunk, inflight, True))):
        args = cli._build_parser().parse_args(["interpolate", str(src), "-o", "out.mp4", *argv])
        commands.clip_in_process(args, src, "out.mp4", lambda: (None, edge))
        assert (runs[-1]["chunk"], runs[-1]["inflight"], runs[-1]["ramp"]) == expected
        assert runs[-1]["encoding"].gpu == (edge.device.type == "cuda") and not runs[-1]["encoding"].given
        assert runs[-1]["encoding"].gpu_index == (edge.device.index or 0)


def test_interpolate_crosses_no_wire_unless_asked():
    """In one process the tensors go from the cloud to the edge as they are; --wire-codec reproduces
    what the servers compute. bench still measures the wire by default."""
    parse = cli._build_parser().parse_args
    assert parse(["interpolate", "a.png", "b.png", "-o", "m.png"]).codec == "none"
    assert parse(["interpolate", "a.png", "b.png", "-o", "m.png", "--wire-codec", "bf16+zstd"]).codec == "bf16+zstd"
    assert parse(["bench"]).codec == "bf16+zstd"


def test_cuda_graphs_asked_for_on_a_cpu_are_refused_before_the_weights_load(monkeypatch, frames, tmp_path, capsys):
    gpus(monkeypatch, 0)
    calls = loaded(monkeypatch)
    assert main(["interpolate", *map(str, frames), "-o", str(tmp_path / "m.png"), "--config", "tiny", "--cuda-graphs", "on"]) == 2
    assert "CUDA graphs need a CUDA device" in capsys.readouterr().err and calls == []


def test_a_token_that_starts_with_a_dash_is_read_as_the_token(frames, tmp_path):
    """TorchServe draws its keys from an alphabet with "-": ``--token -Ab3`` is that token, not an
    option argparse finds without its value (a test's page failed to start on such a key)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused at once
        result = run("client", *frames, "-o", tmp_path / "mid.png", "--cloud", url, "--edge", url,
                     "--token", "-Ab3", "--edge-token", "-_x9", "--tries", "1")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "expected one argument" not in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "mid.png").exists()


@pytest.mark.parametrize("bad", ["missing", "not a clip", "too large"])
def test_a_bad_clip_is_refused_before_the_models_load(tmp_path, bad):
    """In process, the clip is opened and checked before ``models()`` is called: the command's 632 MB
    of weights are not read for an input it refuses (before, they were read first)."""
    src = {"missing": tmp_path / "none.mp4", "not a clip": tmp_path / "junk.mp4", "too large": tmp_path / "big.mp4"}[bad]
    if bad == "not a clip":
        src.write_bytes(b"not a video" * 100)
    if bad == "too large":
        make_clip(src, "libx264", {}, (64, 96), 2, synthetic=True)
    called = []
    args = cli._build_parser().parse_args(["interpolate", str(src), "-o", str(tmp_path / "out.mp4"), "--max-pixels", "1000"])
    with pytest.raises(BadInputError):
        commands.clip_in_process(args, src, tmp_path / "out.mp4", lambda: called.append(True))
    assert not called and not (tmp_path / "out.mp4").exists()


def test_a_bad_clip_is_told_before_a_bad_checkpoint(tmp_path):
    """The command's own process: one line naming the input, exit 2, no output; the checkpoint named
    (missing too) is not read, whereas before, its error came first."""
    (tmp_path / "junk.mp4").write_bytes(b"not a video" * 100)
    line = one_error(run("interpolate", tmp_path / "junk.mp4", "-o", tmp_path / "out.mp4", "--checkpoint", tmp_path / "none.pt"))
    assert "junk.mp4" in line and "none.pt" not in line and not (tmp_path / "out.mp4").exists()


def test_the_decoder_is_chosen_while_the_models_load_and_an_error_then_leaves_no_thread(monkeypatch, tmp_path):
    """The decoder is chosen on a thread of its own while ``models()`` loads (the load waits here until
    the choice has begun: before, the models were loaded first, and it waited in vain); an error of
    the choice is raised once the load has ended, and no thread of the choice is left."""
    src = write_clip(tmp_path / "clip", 3, 32, 48)
    choosing, loaded = threading.Event(), []

    def decoded_by(*args):
        choosing.set()
        raise BadInputError("no decoder")

    def models():
        loaded.append(choosing.wait(10))
        return None, None

    monkeypatch.setattr(commands.pipeline, "decoded_by", decoded_by)
    args = cli._build_parser().parse_args(["interpolate", str(src), "-o", str(tmp_path / "out.mp4")])
    with pytest.raises(BadInputError, match="no decoder"):
        commands.clip_in_process(args, src, tmp_path / "out.mp4", models)
    assert loaded == [True]
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("eden-decoder")]


def test_a_clip_loaded_beside_its_decoder_equals_the_sequential_pipeline(tmp_path):
    """The models loaded beside the decoder's choice compute what the halves loaded first compute:
    the same frames, bit for bit."""
    src = write_clip(tmp_path / "clip", 5, 48, 64)
    args = cli._build_parser().parse_args(["interpolate", str(src), "-o", str(tmp_path / "beside"), "--config", "tiny",
                                           "--chunk", "2", "--seed", "3"])
    commands.clip_in_process(args, src, tmp_path / "beside", lambda: commands.load_models(args))
    cloud, edge = commands.load_models(args)
    interpolate_clip_in_process(src, tmp_path / "sequential", cloud, edge, codec=args.codec, seed=3, chunk=2, progress=False)
    names = sorted(p.name for p in (tmp_path / "sequential").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "beside").iterdir()) and len(names) == 9
    for name in names:
        assert np.array_equal(np.asarray(Image.open(tmp_path / "beside" / name)), np.asarray(Image.open(tmp_path / "sequential" / name)))

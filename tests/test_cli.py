"""The eden-serve command: outputs, and one stderr line with exit code 2 for every bad input."""

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from eden_serve.checkpoint import load_cloud, load_edge
from eden_serve.cli import main
from eden_serve.frames import load_frame, to_png, to_uint8
from eden_serve.pipeline import interpolate_pair
from eden_serve.synthetic import frame_pair


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
    return subprocess.run([sys.executable, "-m", "eden_serve.cli", *map(str, args)], capture_output=True, text=True, timeout=300)


def test_interpolate_equals_split_weights_pipeline(frames, tmp_path):
    out = tmp_path / "mid.png"
    assert main(["interpolate", *map(str, frames), "-o", str(out), "--config", "tiny", "--seed", "4", "--codec", "fp32"]) == 0
    image = np.asarray(Image.open(out))
    assert image.shape == (40, 60, 3) and image.dtype == np.uint8

    assert main(["split-checkpoint", "--config", "tiny", "--out", str(tmp_path / "w")]) == 0
    cloud, edge = load_cloud(tmp_path / "w/eden_cloud.safetensors"), load_edge(tmp_path / "w/eden_edge.safetensors")
    expected, _ = interpolate_pair(cloud, edge, load_frame(frames[0]), load_frame(frames[1]), seed=4, codec="fp32")
    assert np.array_equal(image, to_uint8(expected))


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
        "missing file": ([frames[0], tmp_path / "nope.png"], "cannot read frame1"),
        "not an image": ([frames[0], text], "frame1 is not a readable image"),
        "different sizes": ([frames[0], other], "frames differ in size"),
        "too large": ([*frames, "--max-pixels", "100"], "over the limit of 100"),
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

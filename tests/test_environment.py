"""The command on machines and environments it was not tuned for: odd names (long, non-ASCII, a
leading dash), strict or closed standard streams, and the user's umask. Every refusal is one line
and exit code 2; every output appears whole, under the name given, with the mode a plain write
gives; nothing hidden is left behind."""

import os
import shlex
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.commands.cli import main
from eden_serve.media import atomic
from eden_serve.serving import launcher
from eden_serve.media.frames import to_png
from eden_serve.model.synthetic import frame_pair, write_clip
from harness.servers import build_archives, torchserve
from harness.videos import make_clip

TINY = ("--config", "tiny")


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    folder = tmp_path_factory.mktemp("frames")
    paths = [folder / f"f{i}.png" for i in range(2)]
    for path, frame in zip(paths, frame_pair(24, 32)):
        path.write_bytes(to_png(frame))
    return paths


def run(*args, env=None, shell_redirect="", cwd=None):
    """The command in a fresh process; ``shell_redirect`` (``>&-``) starts it with a stream closed."""
    command = [sys.executable, "-m", "eden_serve.commands.cli", *map(str, args)]
    if shell_redirect:
        command = ["sh", "-c", f'exec "$@" {shell_redirect}', "sh", *command]
    return subprocess.run(command, capture_output=True, timeout=300, env={**os.environ, **(env or {})}, cwd=cwd)


def one_line(result) -> str:
    lines = result.stderr.decode(errors="replace").strip().splitlines()
    lines = [line for line in lines if "NOT a real interpolation" not in line]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in lines[0], result.stderr
    return lines[0]


@pytest.mark.parametrize("encoding,name", [("ascii", "é 日本.png"), ("utf-8", os.fsdecode(b"bad\xff.png"))],
                         ids=["accent-ascii", "not-utf8-strict"])
def test_a_name_the_standard_output_cannot_encode_is_said_escaped(frames, tmp_path, encoding, name):
    """With a strict encoding on standard output (PYTHONIOENCODING), the line that names the output
    once written no longer fails the run (was: exit 2, "internal error (UnicodeEncodeError", with
    the output written)."""
    result = run("interpolate", *frames, "-o", tmp_path / name, *TINY, env={"PYTHONIOENCODING": encoding})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / name).is_file() and result.stdout.startswith(b"wrote ")


@pytest.mark.parametrize("name", ["o\nut.png", "tab\there.png", "esc\x1b[2J.png"], ids=["newline", "tab", "escape"])
def test_a_name_that_would_break_the_line_is_said_quoted(frames, tmp_path, name):
    """The line that names the output once written stays one line, and moves no terminal's cursor,
    whatever the name holds (was: ``wrote o`` and ``ut.png (24x32, ...)`` on two lines); the
    output itself has the name given."""
    result = run("interpolate", *frames, "-o", tmp_path / name, *TINY)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert (tmp_path / name).is_file() and len(lines) == 1 and lines[0].startswith("wrote '")
    assert repr(str(tmp_path / name)) in lines[0] and "\x1b" not in lines[0] and "\t" not in lines[0]


def test_an_output_name_at_the_systems_limit_is_written(frames, tmp_path):
    """An output whose own name fits (255 bytes) is built under a hidden name that fits too (was:
    "cannot write output …: File name too long"; with --resume, its journal's name overflowed)."""
    pair = tmp_path / ("a" * 251 + ".png")
    assert main(["interpolate", *map(str, frames), "-o", str(pair), *TINY]) == 0 and pair.is_file()
    clip = make_clip(tmp_path / "in.mp4", "libx264", {}, (24, 32), 3)
    for dst, resume in ((tmp_path / ("e" * 251 + ".mp4"), ["--resume"]), (tmp_path / ("日" * 85), [])):
        source = clip if dst.suffix else write_clip(tmp_path / "frames", 3, 24, 32)
        assert main(["interpolate", str(source), "-o", str(dst), *TINY, *resume]) == 0 and dst.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_shortened_hidden_name_is_stable_and_its_own(tmp_path):
    """The same output gets the same hidden name on every run (resume finds its journal again);
    two outputs whose names differ only past the cut get two."""
    first, second = tmp_path / ("x" * 250 + "1.mkv"), tmp_path / ("x" * 250 + "2.mkv")
    names = [atomic.hidden(dst, "resume", ".mkv") for dst in (first, first, second)]
    assert names[0] == names[1] != names[2]
    assert all(len(os.fsencode(name.name)) + atomic.LONGEST_ADDED <= 255 for name in names)
    assert atomic.hidden(tmp_path / "out.mkv", "resume", ".mkv").name == ".out.partial-resume.mkv"  # short names as ever
    assert atomic.hidden(tmp_path / "out", "resume", "").name == ".out.partial-resume"


def average(index, frame0, frame1, seed):
    if index == 2 and seed - index == 99:  # the first run (pair i has seed + i), stopped here
        raise KeyboardInterrupt
    mean = (np.asarray(frame0.image.convert("RGB"), np.float32) + np.asarray(frame1.image.convert("RGB"), np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))


def test_two_directory_outputs_named_with_a_dot_have_their_own_partial_output(tmp_path):
    """``-o clip.x2`` stopped and kept, then ``-o clip.x4`` with other options beside it: each has a
    partial output of its own, so neither resume meets the other's journal (was: both
    ``.clip.partial-resume``: clip.x4 refused as made with other options, the way out offered being
    to delete clip.x2's work)."""
    src = write_clip(tmp_path / "in", 6, 24, 32)
    options = dict(chunk=1, inflight=1, progress=False, resume=True, fingerprint={"processor": "average"})
    with pytest.warns(UserWarning, match="stopped"), pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, tmp_path / "clip.x2", pairwise(average), seed=99, **options)
    interpolate_clip(src, tmp_path / "clip.x4", pairwise(average), factor=4, **options)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [
        ".clip.x2.partial-resume", ".clip.x2.partial-resume.journal"]
    assert len(list((tmp_path / "clip.x4").iterdir())) == 21


@pytest.mark.parametrize("umask,mode", [(0o077, 0o600), (0o022, 0o644)])
def test_split_weights_take_the_users_umask(tmp_path, umask, mode):
    """The halves have the mode a plain write gives (was: 0644 whatever the umask, so 077's private
    weights were readable by all)."""
    before = os.umask(umask)
    try:
        assert main(["split-checkpoint", *TINY, "--out", str(tmp_path / "halves")]) == 0
    finally:
        os.umask(before)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "halves").iterdir()}
    assert modes == {mode}


def test_a_closed_standard_stream_ends_a_failed_run_in_one_line(frames, tmp_path):
    """Started with standard output or error closed (``>&-``, ``2>&-``), a refused run still exits 2
    (was: a traceback from flushing it, exit 1; with stderr closed, faulthandler's refusal)."""
    missing = tmp_path / "missing.png"
    assert f"cannot read {str(missing)!r}" in one_line(run("interpolate", missing, frames[1], "-o", tmp_path / "x.png", *TINY,
                                                shell_redirect=">&-"))
    assert run("interpolate", missing, frames[1], "-o", tmp_path / "x.png", *TINY, shell_redirect="2>&-").returncode == 2


def test_a_closed_standard_stream_named_as_the_clip_is_refused(tmp_path):
    """``-`` as the input with standard input closed, or as the output with standard output closed,
    is refused in one line (was: "internal error (AttributeError")."""
    clip = make_clip(tmp_path / "in.mp4", "libx264", {}, (24, 32), 3)
    assert "standard output, which is closed" in one_line(run("interpolate", clip, "-o", "-", *TINY, shell_redirect=">&-"))
    assert "standard input, which is closed" in one_line(run("interpolate", "-", "-o", tmp_path / "o.mp4", *TINY,
                                                             shell_redirect="<&-"))
    assert not (tmp_path / "o.mp4").exists()


def test_the_ffmpeg_command_printed_for_frames_can_be_pasted(tmp_path):
    """The command that makes a video of a directory of frames names them as a shell reads them
    back, spaces, quotes and a leading dash included (was: unquoted, split by the shell)."""
    source = write_clip(tmp_path / "in", 3, 24, 32)
    out = tmp_path / "-out 'é' x"
    result = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "interpolate", str(source), "-o",
                             f"./{out.name}", *TINY], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("make a video of it:"))
    words = shlex.split(line.split(":", 1)[1].split("  (RATE")[0])
    frames_in, video = words[words.index("-i") + 1], words[-1]
    assert Path(tmp_path, frames_in).parent == out and not frames_in.startswith("-")
    assert Path(video).name == f"{out.name}.mp4" and not video.startswith("-")


def test_an_output_under_a_file_names_the_file(frames, tmp_path):
    """An output whose parent is a regular file is refused naming that file (was: "File exists")."""
    line = one_line(run("interpolate", *frames, "-o", frames[0] / "sub" / "o.png", *TINY))
    assert f"{str(frames[0])!r} is not a directory" in line


NO_ENTRY = """
import os, pwd, stat
def no_entry(uid):
    raise KeyError(f"getpwuid(): uid not found: {uid}")
pwd.getpwuid = no_entry  # the user a container runs as, unknown to its password database
"""
NO_HOME = NO_ENTRY + """
from eden_serve.edge.compiling import persistent_cache
first, second = persistent_cache(), persistent_cache()
print(first == second, oct(stat.S_IMODE(os.stat(first).st_mode)), first)
"""


def test_compiling_without_a_home_is_said_once_and_kept_private(tmp_path):
    """With HOME unset and a user the password database does not know (``docker run --user 4242``),
    ``--compile`` compiles into a private directory of the run's, said in one warning, removed at
    its exit (was: "internal error (RuntimeError: Could not determine home directory.)")."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR")}
    result = subprocess.run([sys.executable, "-c", NO_HOME], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    same, mode, folder = result.stdout.split()
    assert same == "True" and mode == "0o700" and not Path(folder).exists()
    assert result.stderr.count("no home directory to keep compiled artefacts in") == 1


@pytest.mark.serving
def test_a_model_store_that_is_not_ascii_serves_under_the_c_locale(tmp_path):
    """Under LC_ALL=C (a container's, a service's locale), TorchServe loads archives from a store
    whose path is not ASCII (was: "TorchServe did not load eden_encoder": Java decoded the path as
    ASCII); and a user's UTF-8 locale is left as it is."""
    store = build_archives(tmp_path / "modèles 日本", config="tiny")
    with torchserve(store, models=["eden_encoder.mar"], env={"LANG": "C", "LC_ALL": "C"}) as server:
        assert server.models() == ["eden_encoder"] and server.ready("eden_encoder")
    for given, java in (({"LC_ALL": "C"}, "C.UTF-8"), ({"LC_ALL": "", "LANG": "POSIX"}, "C.UTF-8"),
                        ({"LC_ALL": "en_GB.utf8"}, "en_GB.utf8"), ({"LC_ALL": "", "LC_CTYPE": "fr_FR.UTF-8"}, "")):
        assert launcher._environment(tmp_path / "work", given)["LC_ALL"] == java, given


def test_workers_import_the_archives_package_whatever_pythonpath_holds(tmp_path):
    """TorchServe puts a model's directory after the PYTHONPATH it was started with: an eden_serve
    found there first (another checkout, another version) was the one the workers ran, where the
    archive's own is meant (docs/serving.md). Here the other one refuses to be imported at all."""
    other = tmp_path / "other" / "eden_serve"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text('raise ImportError("not the archive\'s eden_serve")\n')
    store = build_archives(tmp_path / "store", config="tiny")
    with torchserve(store, models=["eden_encoder.mar", "eden_ditdec.mar"], env={"PYTHONPATH": str(other.parent)},
                    startup_timeout=120) as server:
        assert server.ready("eden_encoder") and server.ready("eden_ditdec")


def test_the_hub_without_a_home_is_one_line(tmp_path):
    """Where the hub cache has no home to be in (HOME, HF_HOME unset; no password entry), a hub
    reference is refused in one line that says what to set (was: internal error, RuntimeError)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME")}
    script = NO_ENTRY + (
        "from eden_serve.model.hub import download\nfrom eden_serve.errors import CheckpointError\n"
        "try:\n    download()\nexcept CheckpointError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**env, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0 and "no home directory for the hub cache" in result.stdout, result.stderr[-2000:]
    assert "set HF_HOME" in result.stdout


@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_an_output_written_over_keeps_its_permissions(frames, tmp_path, mode):
    """An output that replaces a file keeps that file's permissions, as writing over it would: a
    private output stays private (was: the umask's 0644, as a new file), with --resume too."""
    before = os.umask(0o022)
    try:
        pair, clip = tmp_path / "middle.png", tmp_path / "out.mp4"
        for path in (pair, clip):
            path.write_bytes(b"earlier")
            path.chmod(mode)
        assert main(["interpolate", *map(str, frames), "-o", str(pair), *TINY]) == 0
        source = make_clip(tmp_path / "in.mp4", "libx264", {}, (24, 32), 3)
        assert main(["interpolate", str(source), "-o", str(clip), "--resume", *TINY]) == 0
    finally:
        os.umask(before)
    assert [stat.S_IMODE(path.stat().st_mode) for path in (pair, clip)] == [mode, mode]
    assert pair.read_bytes() != b"earlier" != clip.read_bytes()


def test_a_file_named_with_a_leading_dash_is_said_how_to_give(frames, tmp_path):
    """A frame named ``-a.png``, taken by argparse for an option, is refused with how to give it
    (was: "unrecognized arguments: -a.png" alone); an unknown option is refused as ever."""
    (tmp_path / "-a.png").write_bytes(frames[0].read_bytes())
    line = one_line(run("interpolate", "-a.png", frames[1], "-o", "out.png", *TINY, cwd=tmp_path))
    assert line.endswith("unrecognized arguments: -a.png (a file whose name starts with a dash is given as ./-NAME, or after --)")
    assert one_line(run("interpolate", "./-a.png", frames[1], "-o", "out.png", "--bogus", *TINY, cwd=tmp_path)).endswith(
        "unrecognized arguments: --bogus")
    assert run("interpolate", "./-a.png", frames[1], "-o", "./-out.png", *TINY, cwd=tmp_path).returncode == 0
    assert (tmp_path / "-out.png").is_file()


@pytest.mark.parametrize("option", ["--model-store", "--out"])
def test_a_file_in_place_of_the_output_folder_is_refused_before_any_work(frames, tmp_path, capsys, option):
    """``archive --model-store`` and ``split-checkpoint --out`` naming a file (or a folder under one)
    are refused in one line naming the file, before the weights are made or read (was: "File
    exists: 'x'", after the checkpoint was read)."""
    command = ["archive", *TINY, "--model-store"] if option == "--model-store" else ["split-checkpoint", *TINY, "--out"]
    for folder in (frames[0], frames[0] / "sub"):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert main([*command, str(folder)]) == 2
        assert said == []  # not even the synthetic weights' warning: nothing was made
        assert capsys.readouterr().err.strip() == f"eden-serve: error: {option} {str(folder)!r}: {str(frames[0])!r} is not a directory"


def test_a_clip_is_written_with_standard_error_closed(tmp_path):
    """Started with standard error closed (``2>&-``: a service's, a cron job's), a clip is written
    and the run exits 0 (was: "internal error (AttributeError: 'NoneType' object has no attribute
    'isatty')", exit 2 and no output, from the progress bar's test of the terminal)."""
    clip = make_clip(tmp_path / "in.mp4", "libx264", {}, (24, 32), 3)
    result = run("interpolate", clip, "-o", tmp_path / "out.mp4", *TINY, shell_redirect="2>&-")
    assert result.returncode == 0 and (tmp_path / "out.mp4").is_file(), result.stdout
    assert result.stdout.startswith(b"2 pairs, 5 frames written")

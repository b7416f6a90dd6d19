"""--resume: a run killed (SIGKILL), terminated (SIGTERM) or interrupted (Ctrl-C) keeps its partial
output and journal, and a run with the same input and options finishes it, equal byte for byte to
a run that was never interrupted (with the tiny model on a CPU: its originals byte for byte, its
middles up to the documented rounding, see :func:`assert_same_run`); a resume with anything changed
is refused in one line."""

import fcntl
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image
from test_video import CFR_12, make_video

from eden_serve.clips import pipeline
from eden_serve.clips.pipeline import interpolate_clip_in_process
from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.errors import BadInputError, PairError, ServerError, UnavailableError
from eden_serve.model import synthetic
from harness import faults
from harness.rounding import assert_same_frames

SIZE = (96, 64)  # width, height
STAND_IN = {"processor": "average"}  # the stand-in model's fingerprint

# A run in a fresh process, with resume on, whose processor sends the process SIGNAL when it is
# called for the AT-th time: a kill mid-run at a point that does not depend on timing.
KILLED_RUN = """
import os, signal, sys, threading
import numpy as np
from PIL import Image
from eden_serve.clips import pipeline
from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip

src, dst, model, factor, chunk, at, sig = sys.argv[1:]
calls, lock = [0], threading.Lock()

def killing(processor):
    def process(index, frames, seed):
        with lock:
            calls[0] += 1
            if calls[0] == int(at):
                os.kill(os.getpid(), getattr(signal, sig))
        return processor(index, frames, seed)
    return process

def average(index, frame0, frame1, seed):
    mean = (np.asarray(frame0.image.convert("RGB"), np.float32) + np.asarray(frame1.image.convert("RGB"), np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))

options = dict(seed=3, chunk=int(chunk), factor=int(factor), inflight=1, progress=False, resume=True)
if model == "tiny":
    from eden_serve.model.checkpoint import load_pair
    from eden_serve.config import preset
    in_process = pipeline.in_process
    pipeline.in_process = lambda *args, **kwargs: killing(in_process(*args, **kwargs))
    pipeline.interpolate_clip_in_process(src, dst, *load_pair(None, preset("tiny"), "cpu", "fp32"), **options)
else:
    interpolate_clip(src, dst, killing(pairwise(average)), fingerprint={"processor": "average"}, **options)
"""


def average(index, frame0, frame1, seed):
    mean = (np.asarray(frame0.image.convert("RGB"), np.float32) + np.asarray(frame1.image.convert("RGB"), np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))


def killed_run(src, dst, model, factor, chunk, at, sig="SIGKILL"):
    result = subprocess.run([sys.executable, "-c", KILLED_RUN, str(src), str(dst), model, str(factor), str(chunk), str(at), sig],
                            capture_output=True, text=True, timeout=300)
    return result


def contents(path: Path):
    """A directory's names and bytes, a video's packets (Matroska files differ by a random segment
    id), or a file's bytes."""
    if path.is_dir():
        return {p.name: p.read_bytes() for p in sorted(path.iterdir())}
    if path.suffix == ".mkv":
        with av.open(str(path)) as container:
            return [(p.stream_index, p.pts, p.dts, p.duration, bytes(p)) for p in container.demux()]
    return path.read_bytes()


def assert_same_run(got: Path, want: Path, factor: int) -> None:
    """Two runs of the tiny model into directories: the same names, the originals byte for byte, each
    middle byte for byte or within the documented rounding (harness/rounding.py). On a CPU, the same
    forward can round a rare value one level apart from one process to the next: of ten
    ``eden-serve interpolate --inflight 2`` runs of one 40-frame clip on an AVX512 CPU, two differed
    from the others in 28 of the first middle's 73,728 values (MKL's kernels, whose order of sums
    varied with the thread the forward ran on)."""
    got_files, want_files = contents(got), contents(want)
    assert list(got_files) == list(want_files)
    originals = list(got_files)[::factor]
    assert [got_files[name] for name in originals] == [want_files[name] for name in originals]
    assert_same_frames([pixels(png) for png in got_files.values()], [pixels(png) for png in want_files.values()], factor)


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)))


def leftovers(folder: Path):
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name)


def journal_of(dst: Path, directory: bool):
    name = f".{dst.stem}.partial-resume{'' if directory else dst.suffix}.journal"
    return json.loads((dst.parent / name).read_text())


def inputs(tmp_path, kind):
    """(input, output) of a clip of 9 frames (a video: 12)."""
    if kind == "directory":
        return synthetic.write_clip(tmp_path / "in", 9, SIZE[1], SIZE[0]), tmp_path / "out"
    if kind == "mkv":  # FFV1: lossless and intra-only, so its bytes depend on the frames alone
        return make_video(tmp_path / "in.mkv", *CFR_12, video="ffv1"), tmp_path / "out.mkv"
    frames = synthetic.clip(9, SIZE[1], SIZE[0])
    if kind == "gif":
        frames = [frame.quantize(64) for frame in frames]
    suffix = {"gif": ".gif", "apng": ".png", "webp": ".webp"}[kind]
    frames[0].save(tmp_path / f"in{suffix}", save_all=True, append_images=frames[1:], duration=[70, 40, 90] * 3,
                   loop=0, **({"lossless": True} if kind == "webp" else {}))
    return tmp_path / f"in{suffix}", tmp_path / f"out{suffix}"


@pytest.mark.parametrize("kind, model, factor, chunk, at", [
    ("directory", "tiny", 2, 2, 3),
    ("directory", "tiny", 4, 2, 9),
    ("gif", "average", 2, 2, 3),
    ("apng", "average", 4, 3, 8),
    ("webp", "average", 8, 2, 20),
    ("mkv", "average", 2, 2, 4),
])
def test_a_killed_run_resumed_equals_an_uninterrupted_one(tmp_path, tiny_models, kind, model, factor, chunk, at):
    src, dst = inputs(tmp_path, kind)
    result = killed_run(src, dst, model, factor, chunk, at)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert not dst.exists() and len(leftovers(tmp_path)) >= 2  # the partial output and its journal (and cache)
    journal = journal_of(dst, kind == "directory")
    assert journal["identity"]["factor"] == factor and journal["identity"]["seed"] == 3
    if kind == "mkv":  # a video is written again, with the middles computed so far
        assert journal["checkpoint"] is None and len(list(tmp_path.glob(".out.partial-resume.mkv.middles/*.png"))) >= 2
    else:
        assert journal["checkpoint"]["position"] > 0

    options = dict(seed=3, chunk=chunk, factor=factor, progress=False)
    if model == "tiny":
        resumed = interpolate_clip_in_process(src, dst, *tiny_models, resume=True, **options)
        interpolate_clip_in_process(src, tmp_path / f"whole{dst.suffix}", *tiny_models, **options)
    else:
        resumed = interpolate_clip(src, dst, pairwise(average), resume=True, fingerprint=STAND_IN, **options)
        interpolate_clip(src, tmp_path / f"whole{dst.suffix}", pairwise(average), **options)
    pairs = 11 if kind == "mkv" else 8
    total = (factor - 1) * pairs
    assert 0 < resumed.resumed < total and resumed.pairs + resumed.resumed == total  # only the rest computed
    assert resumed.frames == factor * pairs + 1
    if model == "tiny":
        assert_same_run(dst, tmp_path / f"whole{dst.suffix}", factor)
    else:
        assert contents(dst) == contents(tmp_path / f"whole{dst.suffix}")
    assert leftovers(tmp_path) == []


def cli(*args):
    return [sys.executable, "-m", "eden_serve.commands.cli", "interpolate", *map(str, args), "--config", "tiny", "--chunk", "2"]


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory):
    """A clip of many chunks (the signal's run is held from its second, harness/faults' clip-hold),
    and its uninterrupted output."""
    root = tmp_path_factory.mktemp("long")
    src = synthetic.write_clip(root / "in", 40, 128, 192)
    result = subprocess.run(cli(src, "-o", root / "whole"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return src, root / "whole"


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_the_command_stopped_by_a_signal_keeps_its_work_and_resumes(tmp_path, tmp_path_factory, long_clip, sig, code):
    src, whole = long_clip
    dst, folder = tmp_path / "out", tmp_path_factory.mktemp("faults")
    journal = tmp_path / ".out.partial-resume.journal"
    # Its chunks from pair 2 on are held until the signal stops the run (harness/faults' clip-hold):
    # the first chunk's two pairs are written, and checkpointed, and the run is still going when
    # the signal comes, however fast the machine computes.
    # A shell without job control starts background jobs with SIGINT ignored, and the command
    # (rightly) inherits that; a terminal's Ctrl-C reaches a command that has the default disposition.
    run = subprocess.Popen(cli(src, "-o", dst, "--resume", "--inflight", "1"), stderr=subprocess.PIPE, text=True,
                           env={**os.environ, **faults.held_clip(folder, 2)},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while run.poll() is None and not (journal.exists() and json.loads(journal.read_text())["checkpoint"]):
            time.sleep(0.01)
        run.send_signal(sig)
        _, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    assert faults.fired(folder, "clip-hold"), stderr
    assert run.returncode == code, stderr
    assert "warning: stopped; .out.partial-resume and its journal keep" in stderr
    assert "--resume continues" in stderr and "Traceback" not in stderr
    done = json.loads(journal.read_text())["checkpoint"]["position"]
    assert 0 < done < 39 and not dst.exists()

    again = subprocess.run(cli(src, "-o", dst, "--resume"), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resumed after {done} pairs done before" in again.stdout
    assert_same_run(dst, whole, 2)
    assert leftovers(tmp_path) == []


def stop_at(at):
    """A stand-in that stops the run (as Ctrl-C would) at pair ``at``."""

    def process(index, frame0, frame1, seed):
        if index == at:
            raise KeyboardInterrupt
        return average(index, frame0, frame1, seed)

    return pairwise(process)


def test_an_interrupted_run_keeps_its_partial_output_and_says_so(tmp_path):
    src, dst = inputs(tmp_path, "gif")
    with pytest.warns(UserWarning, match=r"stopped; \.out\.partial-resume\.gif and its journal keep 4 frames of the input: "
                                         r"the same command with --resume continues from there"):
        with pytest.raises(KeyboardInterrupt):
            interpolate_clip(src, dst, stop_at(5), chunk=2, resume=True, fingerprint=STAND_IN, progress=False)
    assert leftovers(tmp_path) == [".out.partial-resume.gif", ".out.partial-resume.gif.journal"]
    summary = interpolate_clip(src, dst, pairwise(average), chunk=2, resume=True, fingerprint=STAND_IN, progress=False)
    assert (summary.resumed, summary.pairs) == (4, 4)
    interpolate_clip(src, tmp_path / "whole.gif", pairwise(average), chunk=2, progress=False)
    assert dst.read_bytes() == (tmp_path / "whole.gif").read_bytes()


def test_a_run_stopped_before_its_first_checkpoint_keeps_nothing(tmp_path):
    src, dst = inputs(tmp_path, "directory")
    with pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, dst, stop_at(0), chunk=2, resume=True, fingerprint=STAND_IN, progress=False)
    assert leftovers(tmp_path) == [] and not dst.exists()


@pytest.mark.parametrize("change, message", [
    ({"seed": 4}, "seed 3 then, 4 now"),
    ({"factor": 4}, "factor 2 then, 4 now"),
    ({"chunk": 3}, "chunk 2 then, 3 now"),
    ({"fingerprint": {"processor": "other"}}, "processor.processor 'average' then, 'other' now"),
    ({"touch": True}, "input.directory"),
])
def test_a_resume_with_other_input_or_options_is_refused(tmp_path, change, message):
    src, dst = inputs(tmp_path, "directory")
    options = dict(seed=3, factor=2, chunk=2, fingerprint=STAND_IN)
    with pytest.warns(UserWarning, match="stopped"), pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, dst, stop_at(5), resume=True, progress=False, **options)
    kept = leftovers(tmp_path)
    if change.pop("touch", False):
        (src / "frame3.png").write_bytes((src / "frame3.png").read_bytes())  # same bytes, a new time
        os.utime(src / "frame3.png", ns=(0, 0))
    with pytest.raises(BadInputError) as info:
        interpolate_clip(src, dst, pairwise(average), resume=True, progress=False, **{**options, **change})
    text = str(info.value)
    assert text.startswith("cannot resume out: .out.partial-resume was made with ") and message in text, text
    assert "give the same input and options, or delete .out.partial-resume.journal and .out.partial-resume" in text
    assert "\n" not in text and leftovers(tmp_path) == kept


def test_a_partial_output_another_run_is_writing_is_refused(tmp_path):
    src, dst = inputs(tmp_path, "gif")
    with pytest.warns(UserWarning, match="stopped"), pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, dst, stop_at(5), chunk=2, resume=True, fingerprint=STAND_IN, progress=False)
    with open(tmp_path / ".out.partial-resume.gif", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(BadInputError, match=r"^another run is writing out\.gif \(\.out\.partial-resume\.gif is locked\)$"):
            interpolate_clip(src, dst, pairwise(average), chunk=2, resume=True, fingerprint=STAND_IN, progress=False)
    (tmp_path / ".out.partial-resume.gif.journal").unlink()
    with pytest.raises(BadInputError, match=r"\.out\.partial-resume\.gif has no journal; delete it$"):
        interpolate_clip(src, dst, pairwise(average), chunk=2, resume=True, fingerprint=STAND_IN, progress=False)


def test_the_journal_records_what_makes_a_resume_valid(tmp_path, tiny_models, monkeypatch):
    src, dst = inputs(tmp_path, "directory")
    with pytest.warns(UserWarning, match="stopped"), pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, dst, stop_at(12), chunk=2, factor=4, resume=True, fingerprint=STAND_IN, progress=False)
    identity = journal_of(dst, True)["identity"]
    assert set(identity) == {"input", "frames", "factor", "chunk", "seed", "processor"}
    assert identity["frames"] == 9 and identity["processor"] == STAND_IN and len(identity["input"]["directory"]) == 32
    with pytest.raises(BadInputError, match=r"was made with processor\.\w+ None then, .+ now"):
        interpolate_clip_in_process(src, dst, *tiny_models, chunk=2, factor=4, seed=0, resume=True, progress=False)

    # In process, the processor is the model: its weights, device and precision, the codec, torch and the CPU.
    other = tmp_path / "other"
    in_process = pipeline.in_process
    def stopping(*args, **kwargs):
        process = in_process(*args, **kwargs)

        def stop(index, frames, seed):
            if index >= 4:
                raise KeyboardInterrupt
            return process(index, frames, seed)

        return stop

    monkeypatch.setattr(pipeline, "in_process", stopping)
    with pytest.warns(UserWarning, match="stopped"), pytest.raises(KeyboardInterrupt):
        interpolate_clip_in_process(src, other, *tiny_models, chunk=2, resume=True, inflight=1, progress=False)
    processor = journal_of(other, True)["identity"]["processor"]
    assert set(processor) == {"codec", "batch_tokens", "scene_threshold", "weights", "device", "precision", "torch", "threads", "cpu"}
    assert processor["codec"] == "bf16+zstd" and processor["device"] == "cpu" and len(processor["weights"]) == 32


@pytest.mark.parametrize("kind, retiming", [("directory", {"factor": Fraction(5, 2)}), ("mkv", {"fps": Fraction(30)})])
def test_a_retimed_run_resumes_from_its_cached_middles(tmp_path, kind, retiming):
    """A retimed output is written again from the start, each middle computed before read back
    from the cache, so only the middles not computed yet are computed again."""
    src, dst = inputs(tmp_path, kind)
    calls = []

    def stopping(index, frames, seed):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(index)
        return pairwise(average)(index, frames, seed)

    options = dict(chunk=2, inflight=1, resume=True, fingerprint=STAND_IN, progress=False, **retiming)
    with pytest.warns(UserWarning, match=r"journal keep \d+ middle frames"), pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, dst, stopping, **options)
    done = sum(1 for p in (tmp_path / ".out.partial-resume{}.middles".format(dst.suffix)).iterdir())
    summary = interpolate_clip(src, dst, pairwise(average), **options)
    whole = interpolate_clip(src, tmp_path / f"whole{dst.suffix}", pairwise(average), chunk=2, progress=False,
                             **retiming)
    assert done >= 3 and (summary.resumed, summary.pairs) == (done, whole.pairs - done)
    assert contents(dst) == contents(tmp_path / f"whole{dst.suffix}")
    assert leftovers(tmp_path) == []


def stopped_partial(tmp_path, kind, at=5):
    """A clip and the partial output, journal (and cache) of a resumable run stopped at pair ``at``."""
    src, dst = inputs(tmp_path, kind)
    with pytest.warns(UserWarning, match="stopped"), pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, dst, stop_at(at), chunk=2, seed=3, resume=True, fingerprint=STAND_IN, progress=False)
    return src, dst


def resume_average(src, dst):
    return interpolate_clip(src, dst, pairwise(average), chunk=2, seed=3, resume=True, fingerprint=STAND_IN, progress=False)


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def edit_journal(dst: Path, directory: bool, edit) -> None:
    path = dst.parent / f".{dst.stem}.partial-resume{'' if directory else dst.suffix}.journal"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("kind, damage, message", [
    ("directory", lambda partial: [p.unlink() for p in sorted(partial.iterdir())[2:5]],
     r"\.out\.partial-resume holds 5 of the 8 frames its journal recorded"),
    ("directory", lambda partial: flip(sorted(partial.iterdir())[3], 200), r"\.out\.partial-resume differs from what its journal recorded"),
    ("directory", lambda partial: sorted(partial.iterdir())[1].rename(partial / "000009.png"), "holds 7 of the 8 frames"),
    ("apng", lambda partial: flip(partial, 300), r"\.out\.partial-resume\.png differs from what its journal recorded"),
    ("gif", lambda partial: flip(partial, partial.stat().st_size // 2), "differs from what its journal recorded"),
    ("gif", lambda partial: partial.write_bytes(partial.read_bytes()[:100]), "is shorter than its journal recorded"),
])
def test_a_damaged_partial_output_is_refused(tmp_path, kind, damage, message):
    src, dst = stopped_partial(tmp_path, kind)
    partial = dst.parent / f".{dst.stem}.partial-resume{'' if kind == 'directory' else dst.suffix}"
    damage(partial)
    with pytest.raises(BadInputError, match=message + r".*; delete \.out\.partial-resume(\.\w+)?\.journal and \.out\.partial-resume"):
        resume_average(src, dst)
    assert not dst.exists()


@pytest.mark.parametrize("edit, message", [
    (lambda j: j["checkpoint"].update(position=2), "its journal was changed after this program wrote it"),
    (lambda j: j["checkpoint"].update(position=6), "its journal was changed"),
    (lambda j: j["checkpoint"].update(position=-4), "its journal was changed"),
    (lambda j: j.update(checkpoint="x"), "its journal was changed"),
    (lambda j: j["checkpoint"].pop("writer"), "its journal was changed"),
    (lambda j: j.pop("seal"), "its journal was changed"),
    (lambda j: j.update(version=1), "its journal is not version 2"),
])
def test_an_edited_journal_is_refused(tmp_path, edit, message):
    src, dst = stopped_partial(tmp_path, "directory")
    edit_journal(dst, True, edit)
    with pytest.raises(BadInputError, match=message):
        resume_average(src, dst)
    assert not dst.exists()


def test_a_partial_output_of_the_wrong_kind_is_refused(tmp_path):
    src, dst = stopped_partial(tmp_path, "directory")
    partial = tmp_path / ".out.partial-resume"
    shutil.rmtree(partial)
    partial.write_bytes(b"a file")
    with pytest.raises(BadInputError, match=r"\.out\.partial-resume is a file, not what this output builds; delete"):
        resume_average(src, dst)


def test_a_damaged_cached_middle_is_refused(tmp_path):
    src, dst = inputs(tmp_path, "mkv")
    with pytest.warns(UserWarning, match="stopped"), pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, dst, stop_at(5), chunk=2, seed=3, resume=True, fingerprint=STAND_IN, progress=False)
    cached = sorted((tmp_path / ".out.partial-resume.mkv.middles").glob("*.png"))
    assert len(cached) >= 2 and all(len(p.stem.split("-")[-1]) == 32 for p in cached)
    flip(cached[1], cached[1].stat().st_size // 2)
    with pytest.raises(BadInputError, match=r"the cached middle frame 1-000000001-\w+\.png is damaged; delete"):
        resume_average(src, dst)
    assert not dst.exists()


@pytest.mark.parametrize("case", ["journal", "frames deleted", "partial is a file"])
def test_the_command_refuses_a_bad_resume_in_one_line(tmp_path, tiny_models, case):
    """A hand-edited journal, frames deleted from the partial output, a partial directory replaced by
    a file: one line, exit 2, never exit 0 with fewer frames."""
    src, dst = inputs(tmp_path, "directory")
    assert killed_run(src, dst, "tiny", 2, 2, 3).returncode == -signal.SIGKILL
    partial = tmp_path / ".out.partial-resume"
    if case == "journal":
        edit_journal(dst, True, lambda j: j["checkpoint"].update(position=2))
    elif case == "frames deleted":
        for path in sorted(partial.iterdir())[:2]:
            path.unlink()
    else:
        shutil.rmtree(partial)
        partial.write_bytes(b"")
    result = subprocess.run(cli(src, "-o", dst, "--resume", "--seed", "3"), capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stderr.splitlines() if ": warning: no checkpoint given" not in line]
    assert result.returncode == 2 and len(errors) == 1 and errors[0].startswith("eden-serve: error: cannot resume"), result.stderr
    assert "to start again" in errors[0] and not dst.exists()


def test_the_journal_is_written_through_a_new_file_never_a_planted_link(tmp_path):
    from eden_serve.media.resume import write_durably

    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours")
    journal = tmp_path / ".out.partial-resume.journal"
    (tmp_path / (journal.name + ".tmp")).symlink_to(victim)  # the temporary name of earlier releases
    write_durably(journal, b"{}")
    assert journal.read_bytes() == b"{}" and victim.read_bytes() == b"not yours"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([journal.name, journal.name + ".tmp", "victim"])


def reseal(dst: Path, directory: bool, edit) -> None:
    """The journal edited, with its seal made again: a journal forged rather than damaged."""
    from eden_serve.media.resume import _seal

    path = dst.parent / f".{dst.stem}.partial-resume{'' if directory else dst.suffix}.journal"
    data = json.loads(path.read_text())
    del data["seal"]
    edit(data)
    path.write_text(json.dumps({**data, "seal": _seal(data)}))


@pytest.mark.parametrize("kind, edit", [
    ("directory", lambda j: j["checkpoint"].update(position="8")),
    ("directory", lambda j: j["checkpoint"].update(position=10**6)),
    ("directory", lambda j: j["checkpoint"].update(position=-4)),
    ("directory", lambda j: j["checkpoint"].update(position=True)),
    ("directory", lambda j: j["checkpoint"].pop("writer")),
    ("directory", lambda j: j.update(checkpoint="x")),
    ("directory", lambda j: j["checkpoint"]["writer"].update(count="8")),
    ("gif", lambda j: j["checkpoint"]["writer"].update(offset=5.5)),
    ("apng", lambda j: j["checkpoint"]["writer"].update(sequence="x")),
])
def test_a_forged_journal_is_refused_in_one_line(tmp_path, kind, edit):
    """The seal tells an edited journal, not a forged one (anyone can seal): a checkpoint of other
    types or out of the input's range was an internal error (TypeError, KeyError, IndexError,
    struct.error) or, for a negative position, a resumed run that wrote a wrong output."""
    src, dst = stopped_partial(tmp_path, kind)
    reseal(dst, kind == "directory", edit)
    with pytest.raises(BadInputError, match=r"its journal's checkpoint is not one this program saves; delete "):
        resume_average(src, dst)
    assert not dst.exists()


# A resume in a child process of bounded memory: one that reads /dev/zero or waits on a FIFO for
# ever must not take this process with it.
RESUME = """
import resource, sys
import numpy as np
from PIL import Image
from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.errors import EdenError

resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

def average(index, frame0, frame1, seed):
    mean = (np.asarray(frame0.image.convert("RGB"), np.float32) + np.asarray(frame1.image.convert("RGB"), np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))

try:
    interpolate_clip(sys.argv[1], sys.argv[2], pairwise(average), chunk=2, seed=3, resume=True,
                     fingerprint={"processor": "average"}, progress=False)
except EdenError as exc:
    print(f"refused: {exc}")
else:
    print("resumed")
"""


def resume_in_child(src: Path, dst: Path) -> str:
    try:
        result = subprocess.run([sys.executable, "-c", RESUME, str(src), str(dst)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "waited for ever"
    return result.stdout.strip() or f"exit {result.returncode}: {result.stderr.strip().splitlines()[-1:]}"


def plant_zero_journal(tmp_path: Path, partial: Path) -> None:
    journal = partial.with_name(partial.name + ".journal")
    journal.unlink()
    journal.symlink_to("/dev/zero")


def plant_fifo_journal(tmp_path: Path, partial: Path) -> None:
    journal = partial.with_name(partial.name + ".journal")
    journal.unlink()
    os.mkfifo(journal)


def plant_fifo_partial(tmp_path: Path, partial: Path) -> None:
    partial.unlink()
    os.mkfifo(partial)


def plant_cache_link(tmp_path: Path, partial: Path) -> None:
    cache, elsewhere = partial.with_name(partial.name + ".middles"), tmp_path / "elsewhere"
    cache.rename(elsewhere)
    cache.symlink_to(elsewhere, target_is_directory=True)


def plant_zero_middle(tmp_path: Path, partial: Path) -> None:
    first = sorted(partial.with_name(partial.name + ".middles").glob("*.png"))[0]
    first.unlink()
    first.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind, plant, message", [
    ("directory", plant_zero_journal, r"\.out\.partial-resume\.journal is a symbolic link, not what this output builds"),
    ("directory", plant_fifo_journal, r"\.out\.partial-resume\.journal is neither a file nor a directory"),
    ("gif", plant_fifo_partial, r"\.out\.partial-resume\.gif is neither a file nor a directory"),
    ("mkv", plant_cache_link, r"\.out\.partial-resume\.mkv\.middles is a symbolic link, not what this output builds; "
                              r"delete \.out\.partial-resume\.mkv\.middles, or delete"),
    ("mkv", plant_zero_middle, r"the cached middle frame 1-000000000-\w+\.png is damaged \(a symbolic link\)"),
])
def test_a_planted_journal_partial_output_or_cache_is_refused_never_read_or_followed(tmp_path, kind, plant, message):
    """Beside the output, a journal that is a link to /dev/zero (read until memory ran out) or a
    FIFO (waited on for ever), a partial output that is a FIFO (its lock's open waited for ever), a
    cache that is a link out of the folder (read, then written there), a cached middle that is a
    link to /dev/zero: each refused in one line, before anything is read through it."""
    src, dst = stopped_partial(tmp_path, kind)
    plant(tmp_path, dst.parent / f".{dst.stem}.partial-resume{'' if kind == 'directory' else dst.suffix}")
    outcome = resume_in_child(src, dst)
    assert outcome.startswith("refused: cannot resume") and re.search(message, outcome), outcome
    assert not dst.exists()


def test_a_cache_planted_as_a_link_before_a_fresh_run_is_removed_not_written_through(tmp_path):
    """No partial output yet: the stale cache a resumable run removes first was a link, which
    rmtree refused quietly, so the run's middles went where the link pointed."""
    src, dst = inputs(tmp_path, "mkv")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / ".out.partial-resume.mkv.middles").symlink_to(elsewhere, target_is_directory=True)
    with pytest.warns(UserWarning, match="stopped"), pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, dst, stop_at(5), chunk=2, seed=3, resume=True, fingerprint=STAND_IN, progress=False)
    cache = tmp_path / ".out.partial-resume.mkv.middles"
    assert list(elsewhere.iterdir()) == [] and not cache.is_symlink() and len(list(cache.glob("*.png"))) >= 2


@pytest.mark.parametrize("suffix", [".mkv", ".avi"])
def test_an_output_refused_midway_keeps_nothing_and_promises_no_resume(tmp_path, suffix):
    """A variable rate's frames closer than the output's clock are refused as they come, once middles
    are cached (Matroska's 1 ms; AVI's constant tick): the partial output, journal and cache were
    kept, saying that the same command with --resume continues from there, where it met the same
    refusal. Nothing can continue that output: the refusal is said once, and nothing is left."""
    src = make_video(tmp_path / "vfr.mkv", [0, 40, 80, 120, 160, 200, 240, 280, 300, 301, 340], Fraction(1, 1000), audio=None)
    dst = tmp_path / f"out{suffix}"
    for _ in range(2):
        with warnings.catch_warnings(record=True) as said, \
                pytest.raises(BadInputError, match=r"closer than a tick of its container's clock"):
            warnings.simplefilter("always")
            interpolate_clip(src, dst, pairwise(average), chunk=2, resume=True, fingerprint=STAND_IN, progress=False)
        assert not [str(w.message) for w in said if "resume" in str(w.message)]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["vfr.mkv"]


def test_a_full_disk_beneath_a_refusal_keeps_the_work_for_a_resume(tmp_path):
    """FFmpeg's "cannot write" (a BadInputError) raised from a full disk ends once space is made: the
    cached middles stay, and the warning says so; a refusal with no such error beneath leaves nothing."""
    from eden_serve.media.resume import Journal

    def stopped(beneath):
        journal = Journal(tmp_path / "out.mkv", {"input": "stand-in"})
        with pytest.raises(BadInputError), journal.output():
            journal.keep_middles(1, 0, [Image.new("RGB", (8, 8))])
            try:
                raise beneath
            except Exception:
                raise BadInputError("cannot write 'out.mkv'") from None

    with pytest.warns(UserWarning, match=r"keep 1 middle frames: the same command with --resume continues from there"):
        stopped(OSError(28, "No space left on device"))
    assert sorted(os.listdir(tmp_path)) == [".out.partial-resume.mkv", ".out.partial-resume.mkv.journal",
                                            ".out.partial-resume.mkv.middles"]
    shutil.rmtree(tmp_path / ".out.partial-resume.mkv.middles")
    for name in os.listdir(tmp_path):
        os.unlink(tmp_path / name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stopped(ValueError("frames closer than its clock"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("damage, line", [
    ("size", r"frame6\.png is 80x64, unlike frame0\.png before it \(96x64\)"),
    ("bytes", r"frame6\.png is not a readable image \(UnidentifiedImageError\)"),
])
def test_a_bad_frame_mid_clip_is_named_and_no_resume_is_promised(tmp_path, damage, line):
    """A frame the processor refuses mid-clip (of another size, not an image) stops the run after
    checkpoints were saved. Before, the partial output and journal stayed, saying that the same
    command with --resume continues from there: it met the same frame again, and once the frame was
    mended the input's identity no longer matched the journal's, so no resume could use them. The
    one line now names the file, exit 2, and nothing is left; mended, the same command runs whole."""
    src, dst = inputs(tmp_path, "directory")
    good = (src / "frame6.png").read_bytes()
    if damage == "size":
        Image.new("RGB", (80, 64)).save(src / "frame6.png")
    else:
        (src / "frame6.png").write_bytes(b"not an image")
    command = cli(src, "-o", dst, "--resume", "--inflight", "1")
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    said = [text for text in result.stderr.splitlines() if "synthetic weights" not in text]
    assert len(said) == 1 and re.fullmatch(r"eden-serve: error: pairs 4-5 \(frame4\.png → frame6\.png\): " + line, said[0]), said
    assert leftovers(tmp_path) == [] and not dst.exists()

    (src / "frame6.png").write_bytes(good)
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "resumed" not in again.stdout, again.stderr
    assert len(list(dst.iterdir())) == 17 and leftovers(tmp_path) == []


def fail_at(at, error):
    """A stand-in that fails at pair ``at`` with ``error``, as a server still down after every retry
    or a device out of memory would."""

    def process(index, frame0, frame1, seed):
        if index == at:
            raise error
        return average(index, frame0, frame1, seed)

    return pairwise(process)


@pytest.mark.parametrize("error", [UnavailableError("connection refused (gave up after 5 tries)"),
                                   RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")])
def test_a_transient_failure_keeps_the_work_and_promises_a_resume(tmp_path, error):
    """What may pass (a server unreachable, memory short) keeps the work and says that the same
    command with --resume continues, which it does."""
    src, dst = inputs(tmp_path, "directory")
    with pytest.warns(UserWarning, match=r"keep 4 frames of the input: the same command with --resume continues from there"), \
            pytest.raises((PairError, RuntimeError), match="connection refused|out of memory"):
        interpolate_clip(src, dst, fail_at(5, error), chunk=2, inflight=1, resume=True, fingerprint=STAND_IN, progress=False)
    assert leftovers(tmp_path) == [".out.partial-resume", ".out.partial-resume.journal"]
    summary = interpolate_clip(src, dst, pairwise(average), chunk=2, resume=True, fingerprint=STAND_IN, progress=False)
    assert (summary.resumed, summary.pairs) == (4, 4) and leftovers(tmp_path) == []


def test_what_refuses_an_output_for_good():
    """The contract of media.atomic.refused, by what a chunk can fail with: the input's fault (here,
    or a server's 400 bad_input) is final; a server's other refusals, what may pass, a disk that is
    full and a file this run may not open (mended without changing what a resume checks) are not."""
    from eden_serve.media.atomic import refused

    def raised(error, beneath=None):
        try:
            try:
                raise beneath or ValueError("none")
            except Exception:
                raise error from None
        except Exception as exc:
            return exc

    def chunk_of(cause):
        try:
            raise PairError(4, Path("frame4.png"), Path("frame6.png"), cause, 2) from cause
        except PairError as exc:
            return exc

    final = [BadInputError("frame6.png is not a readable image"), ServerError(400, "bad_input", "frames differ in size")]
    passing = [UnavailableError("gave up"), ServerError(413, "frame_too_large", "over the limit"),
               ServerError(409, "model_mismatch", "another model"), RuntimeError("CUDA out of memory"),
               raised(BadInputError("cannot read frame6.png: Permission denied"), PermissionError(13, "Permission denied")),
               raised(BadInputError("cannot write 'out.mkv'"), OSError(28, "No space left on device"))]
    assert [refused(e) for e in final] == [True, True] and [refused(chunk_of(e)) for e in final] == [True, True]
    assert not any(refused(e) or refused(chunk_of(e)) for e in passing)
    assert not refused(PairError(4, Path("frame4.png"), Path("frame6.png"), BadInputError("2 middle frames came back for 3 pairs")))

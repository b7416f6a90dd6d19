"""A clip run that stops early leaves nothing behind: whichever way it stops (a processor's error,
a bad frame, Ctrl-C, the page's stop, a full disk), once :func:`interpolate_clip` has returned no
thread of the run is alive, nothing more is written beside the output, and the partial output is
gone (or kept, with its journal, where ``--resume`` says so); a process running many stopped runs
(the page) holds no more threads or open files after them than before."""

import errno
import gc
import os
import re
import signal
import subprocess
import threading
import time
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import FunctionProcessor, Middles, Wrapper
from eden_serve.commands import cli
from eden_serve.commands.shared import clip_in_process
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.errors import BadInputError, PairError
from eden_serve.media.atomic import atomic_output
from eden_serve.media.frames import to_png
from eden_serve.media.resume import Journal, write_durably
from eden_serve.model import synthetic
from eden_serve.page.runs import FINISHED, Run, Runner
from harness.signals import signalled
import test_video
from test_video import CFR_12, make_video

SIZE = (96, 64)  # width, height
STAND_IN = {"processor": "average"}
WAITING = "waiting for the chunks under way to end (interrupt again to leave at once)"  # what a stopped run says


def average(frames):
    """The stand-in model: each pair's mean."""
    arrays = [np.asarray(frame.image.convert("RGB"), np.float32) for frame in frames]
    return [Image.fromarray(((a + b) / 2).round().astype(np.uint8)) for a, b in zip(arrays, arrays[1:])]


def run_threads() -> list[str]:
    """The names of the threads a clip run starts that are alive now."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(("eden-pair", "eden-read", "eden-write")))


def files(folder):
    """Every name under ``folder``, hidden ones and the cache's included."""
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def failing_while_others_work(cancel: threading.Event, fail_at: int, error: BaseException, lingered: list, linger: float = 0.3,
                              patience: float = 5, said: pytest.WarningsRecorder | None = None):
    """A processor whose chunk ``fail_at`` raises ``error`` once the other chunks in flight have
    started; those wait for the run to be cancelled, then finish a little later (as a forward or a
    request in flight does) and return their middles: ``linger`` s later, or, where ``said``
    records the run's warnings, once the run has said it waits for them."""
    started, lock = set(), threading.Lock()

    def process(index, frames, seed):
        with lock:
            started.add(index)
        if index == fail_at:
            while len(started) < 3 and not cancel.is_set():
                time.sleep(0.005)
            raise error
        if cancel.wait(patience):
            if said is None:
                time.sleep(linger)  # still busy when the run stops
            else:
                deadline = time.monotonic() + patience
                while not any(WAITING in str(warning.message) for warning in said) and time.monotonic() < deadline:
                    time.sleep(0.01)
            lingered.append(index)
        return Middles(average(frames))

    return FunctionProcessor(process)


@pytest.mark.parametrize("error, raised", [
    (BadInputError("a bad frame"), PairError), (RuntimeError("a bug"), RuntimeError), (KeyboardInterrupt(), KeyboardInterrupt),
])
def test_a_resumable_run_that_stops_writes_nothing_after_it_returns(tmp_path, error, raised):
    """--resume caches each chunk's middles as it is done (media/resume.py): a chunk still being
    computed when the run stops must not add its middles after the run has settled its output."""
    src = synthetic.write_clip(tmp_path / "in", 17, SIZE[1], SIZE[0])
    dst = tmp_path / "out"
    cancel, lingered = threading.Event(), []
    processor = failing_while_others_work(cancel, 4, error, lingered)
    with pytest.raises(raised):
        interpolate_clip(src, dst, processor, chunk=2, inflight=4, factor=Fraction(5, 2), resume=True,
                         fingerprint=STAND_IN, progress=False, cancel=cancel)
    alive, left = run_threads(), files(tmp_path)
    time.sleep(0.6)  # past the stand-in's lingering: a thread left running would write by now
    assert files(tmp_path) == left
    assert alive == []
    # what it kept, it says it keeps: the cache and the journal are there together, or neither is
    kept = [name for name in left if ".partial-resume" in name]
    assert not kept or ".out.partial-resume.journal" in kept


@pytest.mark.parametrize("error, raised", [(BadInputError("a bad frame"), PairError), (KeyboardInterrupt(), KeyboardInterrupt)])
def test_a_run_that_stops_leaves_no_thread_and_no_partial_output(tmp_path, error, raised):
    src = synthetic.write_clip(tmp_path / "in", 17, SIZE[1], SIZE[0])
    cancel, lingered = threading.Event(), []
    with pytest.raises(raised):
        interpolate_clip(src, tmp_path / "out", failing_while_others_work(cancel, 4, error, lingered), chunk=2, inflight=4,
                         progress=False, cancel=cancel)
    assert run_threads() == []
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_a_run_that_waits_for_its_chunks_says_so_and_how_to_leave_at_once(tmp_path):
    """A forward in process cannot be cut: a run stopped while chunks still compute waits for them,
    and says so (a Ctrl-C that seemed to do nothing for a chunk's forward, on a CPU a minute)."""
    src = synthetic.write_clip(tmp_path / "in", 17, SIZE[1], SIZE[0])
    cancel, lingered = threading.Event(), []
    said = pytest.warns(UserWarning, match=re.escape(WAITING))
    # the others wait for the stop however long it takes to come (a loaded machine: over 5 s), then
    # until the run says it waits for them (after a sleep, a run starved for a second on a loaded
    # machine found them ended and rightly said nothing); the first chunk fails, whose middles the
    # run waits for first (a later one's failure is met after the chunks before it: here, after
    # their 120 s of patience)
    processor = failing_while_others_work(cancel, 0, KeyboardInterrupt(), lingered, patience=120, said=said)
    with said, pytest.raises(KeyboardInterrupt):
        interpolate_clip(src, tmp_path / "out", processor, chunk=2, inflight=4, progress=False, cancel=cancel)
    assert lingered and run_threads() == []


def test_a_worker_left_running_caches_nothing_once_the_output_is_settled(tmp_path):
    """A second Ctrl-C leaves the run without waiting for its workers (clips/workers.py): what one
    of them then hands the journal is not cached beside the output the run has settled."""
    journal = Journal(tmp_path / "out.mkv", {"input": "stand-in"})
    with pytest.raises(KeyboardInterrupt):
        with journal.output():
            raise KeyboardInterrupt
    journal.keep_middles(1, 0, [Image.new("RGB", SIZE)])
    assert os.listdir(tmp_path) == []


class StoppedAfterFirstChunk(Wrapper):
    """The page's stop button pressed once a run's first chunk is done; the chunks in flight then
    take a little longer to end (as a forward does), and see the stop as they end."""

    def __init__(self, inner, run: Run):
        super().__init__(inner)
        self.run = run

    def __call__(self, index, frames, seed, arrived=None):
        if index == 0:
            result = self.inner(index, frames, seed, arrived)
            self.run.cancel.set()
            return result
        if self.run.cancel.wait(5):
            time.sleep(0.2)
        return self.inner(index, frames, seed, arrived)


def test_the_pages_stopped_runs_leave_no_thread_or_open_file_behind(tmp_path, tiny_models, open_files):
    """The page runs its clips one after another in one process (page/runs.py): twenty runs of a
    video through the tiny model, each stopped after its first chunk, hold no more threads or open
    files once they have ended than one did, and leave no partial output."""
    src = make_video(tmp_path / "in.mkv", *CFR_12, video="ffv1", audio=None)

    def execute(run: Run):
        watch = lambda processor: StoppedAfterFirstChunk(run.watch(processor), run)  # noqa: E731
        return clip_in_process(run.args, run.source, run.output, lambda: tiny_models, watch=watch)

    runner = Runner(execute)

    def stopped_run(n: int) -> Run:
        folder = tmp_path / f"run{n}"
        folder.mkdir()
        args = cli._build_parser().parse_args(["interpolate", str(src), "-o", str(folder / "result.mkv"), "--config", "tiny",
                                               "--device", "cpu", "--chunk", "2", "--inflight", "3", "--decoder", "host"])
        args.cloud = args.server = None  # as the page's own options have them in process
        run = Run(str(n), args, str(src), folder / "result.mkv", None)
        runner.submit(run)
        while run.state not in FINISHED:
            time.sleep(0.01)
        assert run.state == "cancelled", run.reason
        return run

    try:
        stopped_run(0)  # what a first run sets up for good (torch's threads, the codecs' tables)
        threads, fds = run_threads(), open_files()
        alive = set(threading.enumerate())  # a thread of an earlier test may end meanwhile: only new ones count
        for n in range(1, 21):
            stopped_run(n)
            assert run_threads() == threads == [] and set(threading.enumerate()) <= alive
        held = open_files()
        assert len(held) <= len(fds), sorted(set(held) - set(fds))
        assert [path for path in tmp_path.rglob("*") if not path.is_dir()] == [src]  # the oldest runs' folders pruned
    finally:
        runner.stop()


@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_the_command_stopped_by_a_signal_says_so_in_one_line_and_leaves_nothing(tmp_path, sig, code, line):
    # long enough (hundreds of pairs) that the run is still going whenever the signal comes
    src = make_video(tmp_path / "in.mkv", [1024 * k for k in range(400)], Fraction(1, 12288), video="ffv1", audio=None)
    dst = tmp_path / "out.mkv"
    returncode, stderr = signalled(["interpolate", src, "-o", dst, "--config", "tiny", "--chunk", "1", "--factor", "4"],
                                   tmp_path, sig)
    assert returncode == code, stderr
    assert stderr.splitlines()[-1:] == [f"eden-serve: {line}"] and "Traceback" not in stderr, stderr
    assert sorted(os.listdir(tmp_path)) == ["in.mkv"], stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_once_the_output_is_settled_does_not_turn_success_into_a_kill(tmp_path, sig):
    """Sent again and again from the moment the output appears until the command ends: before, a
    signal during the interpreter's exit ended the run by the signal itself (-2, once Python had
    given SIGINT back to the system) without a word, or with a KeyboardInterrupt traceback from an
    atexit callback. Now a run whose output is settled exits 0; one stopped before that, 130 or 143
    with its one line; the output stays whole either way."""
    sources = [tmp_path / "f0.png", tmp_path / "f1.png"]
    for path, frame in zip(sources, synthetic.frame_pair(40, 60)):
        path.write_bytes(to_png(frame))
    returncode, stderr = signalled(["interpolate", *sources, "-o", tmp_path / "mid.png", "--config", "tiny"], tmp_path, sig,
                                   when=lambda names: "mid.png" in names, every=0.005)
    stopped = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}[sig]
    assert returncode == 0 or (returncode, stderr.splitlines()[-1]) == (stopped[0], f"eden-serve: {stopped[1]}"), stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert Image.open(tmp_path / "mid.png").size == (60, 40)


@pytest.fixture
def full_disk(tmp_path):
    """A file system of 1 MiB (a tmpfs: mounting one needs root), unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.parametrize("output, resume, names", [
    ("out", False, r"/\.out\.partial-[0-9a-f]{8}/\d{6}\.png"),  # a PNG of the directory's, written by Pillow
    ("out.mkv", False, r"/\.out\.partial-[0-9a-f]{8}\.mkv"),
    # the video or a middle cached beside it, whichever fills the disk first
    ("out.mkv", True, r"/\.out\.partial-resume\.mkv(\.middles/1-\d{9}-[0-9a-f]{32}\.png)?"),
])
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_no_thread(tmp_path, full_disk, capsys, monkeypatch, output, resume, names):
    """The output's disk fills up mid-clip: exit 2, one line that names the file it was writing,
    no thread of the run left, and no partial output (a --resume run keeps its work, and says so)."""
    if output.endswith(".mkv"):
        monkeypatch.setattr(test_video, "WIDTH", 384)
        monkeypatch.setattr(test_video, "HEIGHT", 256)
        src = make_video(tmp_path / "in.mkv", [1024 * k for k in range(24)], Fraction(1, 12288), video="ffv1", audio=None)
        encoder = ["--vcodec", "ffv1"]  # lossless: the synthetic model's middles, noise, fill the disk soon
    else:
        src, encoder = synthetic.write_clip(tmp_path / "in", 24, 256, 384), []
    argv = ["interpolate", str(src), "-o", str(full_disk / output), "--config", "tiny", "--chunk", "2", *encoder,
            *(["--resume"] if resume else [])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(argv) == 2
    err = capsys.readouterr().err + "".join(f"warning: {w.message}\n" for w in caught)
    line = err.splitlines()[0]
    assert re.fullmatch(rf"eden-serve: error: No space left on device: '{re.escape(str(full_disk))}{names}'", line), line
    assert run_threads() == []
    left = sorted(os.listdir(full_disk))
    if resume and left:
        assert left == [".out.partial-resume.mkv", ".out.partial-resume.mkv.journal", ".out.partial-resume.mkv.middles"]
        assert not [name for name in os.listdir(full_disk / left[2]) if not name.endswith(".png")]
        assert "warning: stopped; .out.partial-resume.mkv and its journal keep" in err
    else:
        assert left == []


def test_runs_that_fill_the_disk_leave_no_file_open(tmp_path, full_disk, monkeypatch, open_files, capsys):
    """The page runs its clips in one process: runs of a video with audio whose disk fills hold no
    more open files once they have failed than one did, without the cyclic collector. Before, the
    output's trailer failed on the full disk, and its writer closed no more: the input, opened again
    for its audio, stayed open until the collector found it, one descriptor a run."""
    monkeypatch.setattr(test_video, "WIDTH", 384)
    monkeypatch.setattr(test_video, "HEIGHT", 256)
    src = make_video(tmp_path / "in.mkv", [1024 * k for k in range(24)], Fraction(1, 12288), video="ffv1", audio="aac")
    argv = ["interpolate", str(src), "-o", str(full_disk / "out.mkv"), "--config", "tiny", "--chunk", "2", "--vcodec", "ffv1"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(argv) == 2  # what a first run sets up for good
        gc.collect()
        gc.disable()
        try:
            held = open_files()
            for _ in range(3):
                assert cli.main(argv) == 2
            assert sorted(set(open_files()) - set(held)) == []
        finally:
            gc.enable()
    assert all("No space left on device" in line for line in capsys.readouterr().err.splitlines())
    assert os.listdir(full_disk) == []


def test_a_middle_the_disk_has_no_room_for_is_named_and_leaves_no_tmp(full_disk):
    """--resume's cache (media/resume.py): the full disk's error names the middle's file, and the
    file it was being written as is gone."""
    cache = full_disk / ".out.partial-resume.mkv.middles"
    cache.mkdir()
    with pytest.raises(OSError) as info:
        write_durably(cache / "1-000000000-0.png", os.urandom(2 << 20))
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(cache / "1-000000000-0.png"))
    assert os.listdir(cache) == []


def test_a_frame_that_cannot_be_read_midway_leaves_no_thread_and_no_output(tmp_path):
    """The reader fails (frame 8 is no image) while the chunks before it are still being computed."""
    src = synthetic.write_clip(tmp_path / "in", 17, SIZE[1], SIZE[0])
    (src / sorted(os.listdir(src), key=lambda name: int(name[5:-4]))[8]).write_bytes(b"\x89PNG\r\n\x1a\nnot a PNG")
    cancel, lingered = threading.Event(), []
    with pytest.raises(PairError, match=r"frame8\.png is not a readable image"):
        interpolate_clip(src, tmp_path / "out", failing_while_others_work(cancel, None, None, lingered), chunk=2, inflight=4,
                         progress=False, cancel=cancel)
    assert run_threads() == []
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("directory", [True, False], ids=["directory", "file"])
def test_an_interrupt_the_moment_the_partial_output_is_made_leaves_nothing(tmp_path, monkeypatch, directory):
    """A signal's handler runs at the first instruction after the system call that made the partial
    output (where another thread held the interpreter meanwhile, before the next line): Ctrl-C or
    SIGTERM then must still remove it (the client's signal test left an empty partial directory
    once in eight runs under load)."""
    mkdir, open_ = Path.mkdir, os.open

    def interrupted_after(make):
        def made(*args, **kwargs):
            result = make(*args, **kwargs)
            if any(".partial-" in name for name in os.listdir(tmp_path)):
                if isinstance(result, int):  # the descriptor the interrupted call made, the test's to close
                    os.close(result)
                raise KeyboardInterrupt
            return result
        return made

    if directory:
        monkeypatch.setattr(Path, "mkdir", interrupted_after(mkdir))
    else:
        monkeypatch.setattr(os, "open", interrupted_after(open_))
    with pytest.raises(KeyboardInterrupt):
        with atomic_output(tmp_path / ("out" if directory else "out.png"), directory):
            pass
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []

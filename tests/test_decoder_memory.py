"""The host decoder's wins remembered (eden_serve/media/decoder_memory.py): a stream on which the host's
decoder won the trials of ``--decoder auto`` here goes to it untried the next time; NVDEC's wins are
tried again on every run; another machine or stream is tried again; a damaged or unwritable file
means trials, never an error. On this CPU, the GPU's name and driver stood in for (they are read
through CUDA), the candidates' speeds set on the test's clock (test_decoders.Costing); the stream's
part of the key, the host's cores and the file are the real ones."""

import json
from fractions import Fraction

import pytest
import torch
from test_decoders import Clock, Costing
from test_video import real_video

from eden_serve.clips import pipeline
from eden_serve.media import decoder_memory, decoders, segments
av = pytest.importorskip("av")

GPU = {"gpu": "NVIDIA H200", "cuda": "13.0", "driver": "580.159.04"}


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory")
    return {"clip": real_video(folder / "in.mp4", 10, Fraction(25), size=(96, 64), audio=None),
            "size": real_video(folder / "small.mp4", 10, Fraction(25), size=(64, 48), audio=None),
            "codec": real_video(folder / "mpeg4.mp4", 10, Fraction(25), size=(96, 64), video="mpeg4", audio=None)}


class Trials:
    """The real trials on the test's clock, counted; candidates whose frames cost ``costs`` seconds each."""

    def __init__(self, monkeypatch, costs):
        self.clock, self.calls, self._trial = Clock(), [], decoders.trial
        self.costs = dict(costs)
        monkeypatch.setattr(decoders, "trial", self)
        monkeypatch.setattr(decoders, "candidates", lambda device: [Costing(name, self.costs[name], self.clock) for name in self.costs])

    def __call__(self, decoder, path, frames, rgb, clock=None):
        self.calls.append(decoder.name)
        return self._trial(decoder, path, frames, rgb, self.clock)

    def run(self, clip, setting="auto"):
        """``decoded_by`` as ``eden-serve interpolate`` calls it: the decoder's name and the trials it ran."""
        before = len(self.calls)
        opened = pipeline.decoded_by(clip, setting, torch.device("cpu"), pipeline.ClipOptions())
        if opened == clip:
            return "host", self.calls[before:]
        opened.container.close()
        return opened.decoded_by.name, self.calls[before:]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The file in the user's cache directory, in the test's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(decoder_memory.FILE_ENV, raising=False)
    return tmp_path / "cache" / "eden-serve" / "decoders.json"


@pytest.fixture
def cache(home, monkeypatch):
    """The file, beside a GPU and its driver stood in for."""
    monkeypatch.setattr(decoder_memory, "gpu", lambda device: dict(GPU))
    return home


HOST_WINS = {"host": 0.001, "nvdec": 0.004, "nvdec-device": 0.002}
NVDEC_WINS = {"host": 0.004, "nvdec": 0.003, "nvdec-device": 0.001}


def test_a_host_win_is_remembered_and_the_next_run_tries_nothing(clips, cache, monkeypatch, caplog):
    trials = Trials(monkeypatch, HOST_WINS)
    caplog.set_level("INFO", logger=decoders.logger.name)
    assert trials.run(clips["clip"]) == ("host", ["host", "nvdec", "nvdec-device"])
    assert caplog.records[-1].getMessage().endswith(f"host chosen, remembered in {cache} (delete it to measure again)")
    assert trials.run(clips["clip"]) == ("host", [])
    assert "host chosen untried" in caplog.records[-1].getMessage() and str(cache) in caplog.records[-1].getMessage()
    assert trials.run(clips["clip"], "nvdec-device") == ("nvdec-device", [])  # a decoder named is used as named
    cache.unlink()  # forgotten
    assert trials.run(clips["clip"])[1] == ["host", "nvdec", "nvdec-device"]


def test_choose_itself_skips_the_trials_it_remembers(clips, cache, monkeypatch):
    trials = Trials(monkeypatch, HOST_WINS)
    memory = decoder_memory.Memory(torch.device("cuda"))
    for expected in (["host", "nvdec", "nvdec-device"], []):
        before = len(trials.calls)
        chosen, made = decoders.choose(clips["clip"], decoders.candidates(None), lambda frame: frame, memory=memory)
        assert chosen.name == "host" and trials.calls[before:] == expected and len(made) == len(expected)


def test_an_nvdec_win_is_tried_on_every_run(clips, cache, monkeypatch):
    """Beside a host win remembered for another stream: NVDEC's frames are checked on each clip."""
    trials = Trials(monkeypatch, HOST_WINS)
    trials.run(clips["size"])
    assert trials.run(clips["size"]) == ("host", [])
    trials.costs.update(NVDEC_WINS)
    for _ in range(2):
        assert trials.run(clips["clip"]) == ("nvdec-device", ["host", "nvdec", "nvdec-device"])
    assert [win["key"]["size"] for win in json.loads(cache.read_text())["host_won"]] == ["64x48"]


def test_a_host_that_only_outlasted_refusals_is_not_remembered(clips, cache, monkeypatch):
    """NVDEC that does not open here may open later (another process held it): nothing was measured.
    Once NVDEC runs and the host outruns it, the win is remembered."""
    trials = Trials(monkeypatch, HOST_WINS)
    with monkeypatch.context() as refused:
        refused.setattr(decoders, "candidates", lambda device: [Costing("host", 0.001, trials.clock),
                                                                Costing("nvdec", 0.001, trials.clock, fails="open")])
        for _ in range(2):
            assert trials.run(clips["clip"]) == ("host", ["host", "nvdec"])
    assert trials.run(clips["clip"]) == ("host", ["host", "nvdec", "nvdec-device"])
    assert trials.run(clips["clip"]) == ("host", [])


@pytest.mark.parametrize("change", ["size", "codec", "cores", "gpu", "driver"])
def test_another_stream_or_machine_is_tried_again(clips, cache, monkeypatch, change):
    trials = Trials(monkeypatch, HOST_WINS)
    trials.run(clips["clip"])
    assert trials.run(clips["clip"]) == ("host", [])
    cores = segments.host_cores()
    with monkeypatch.context() as changed:
        clip = clips[change] if change in clips else clips["clip"]
        if change == "cores":
            changed.setattr(segments, "host_cores", lambda: cores + 1)
        if change in ("gpu", "driver"):
            changed.setattr(decoder_memory, "gpu", lambda device: {**GPU, change: "other"})
        assert trials.run(clip) == ("host", ["host", "nvdec", "nvdec-device"])
    assert trials.run(clips["clip"]) == ("host", [])  # the first key still remembered beside the second


DAMAGED = {"empty": b"", "cut short": b"{", "not UTF-8": b"\xff\xfe{}", "a list": b"[]", "null": b"null",
           "wins not a list": b'{"format": 1, "host_won": {}}', "a win not an object": b'{"format": 1, "host_won": [3]}',
           "a key not an object": b'{"format": 1, "host_won": [{"key": [1]}]}', "another format": b'{"format": 99, "host_won": []}',
           "nested too deep": b"[" * 100_000, "too large": b" " * (decoder_memory.MAX_BYTES + 1) + b"{}"}


@pytest.mark.parametrize("contents", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_file_means_trials_and_is_replaced(clips, cache, monkeypatch, contents):
    trials = Trials(monkeypatch, HOST_WINS)
    cache.parent.mkdir(parents=True)
    cache.write_bytes(contents)
    assert trials.run(clips["clip"]) == ("host", ["host", "nvdec", "nvdec-device"])
    assert trials.run(clips["clip"]) == ("host", [])


@pytest.mark.parametrize("blocked", ["the folder is a file", "the file is a folder"])
def test_an_unwritable_file_means_trials_and_says_so(clips, cache, monkeypatch, caplog, blocked):
    trials = Trials(monkeypatch, HOST_WINS)
    caplog.set_level("INFO", logger=decoders.logger.name)
    if blocked == "the folder is a file":
        cache.parent.parent.mkdir(parents=True)
        cache.parent.write_text("")
    else:
        cache.mkdir(parents=True)
    for _ in range(2):
        assert trials.run(clips["clip"]) == ("host", ["host", "nvdec", "nvdec-device"])
        assert "host chosen, not remembered (" in caplog.records[-1].getMessage()


def test_a_key_not_read_here_is_not_remembered(clips, home, monkeypatch, caplog):
    """Beside a device whose GPU is not read (here, the CPU), the host's win is not remembered, and the
    line says what was missing; the stream's part is read from the file itself."""
    trials = Trials(monkeypatch, HOST_WINS)
    caplog.set_level("INFO", logger=decoders.logger.name)
    for _ in range(2):
        assert trials.run(clips["clip"])[1] == ["host", "nvdec", "nvdec-device"]
        line = caplog.records[-1].getMessage()
        assert "host chosen, not remembered (unknown here: gpu" in line and "driver)" in line
    assert not home.exists()
    key = decoder_memory.Memory(torch.device("cpu")).key(clips["clip"])
    assert {name: key[name] for name in ("codec", "pix_fmt", "size", "cores")} == {
        "codec": "h264", "pix_fmt": "yuv420p", "size": "96x64", "cores": segments.host_cores()}


def test_the_file_may_be_put_elsewhere(clips, cache, monkeypatch, tmp_path):
    elsewhere = tmp_path / "check" / "decoders.json"
    monkeypatch.setenv(decoder_memory.FILE_ENV, str(elsewhere))
    trials = Trials(monkeypatch, HOST_WINS)
    trials.run(clips["clip"])
    assert trials.run(clips["clip"]) == ("host", []) and elsewhere.is_file() and not cache.exists()


@pytest.mark.parametrize("sys_module, proc", [
    ("580.159.04\n", None),
    (None, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build  (dvs-builder@U16)  Thu Jan 1 2026\n"),
    (None, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16)\nGCC version: 12\n"),
    (None, None)])
def test_the_drivers_release_is_read_from_its_kernel_module(tmp_path, monkeypatch, sys_module, proc):
    files = []
    for name, text, (_, pattern) in zip(("module", "proc"), (sys_module, proc), decoder_memory.DRIVER_FILES, strict=True):
        if text is not None:
            (tmp_path / name).write_text(text)
        files.append((str(tmp_path / name), pattern))
    monkeypatch.setattr(decoder_memory, "DRIVER_FILES", tuple(files))
    assert decoder_memory.driver_version() == ("580.159.04" if sys_module or proc else None)


def test_the_file_keeps_the_newest_wins(cache):
    memory = decoder_memory.Memory(torch.device("cuda"))
    keys = [{**GPU, "size": f"{width}x64"} for width in range(decoder_memory.KEEP + 6)]
    for key in keys:
        assert memory.remember(key).startswith("remembered in ")
    assert [win["key"] for win in json.loads(cache.read_text())["host_won"]] == keys[-decoder_memory.KEEP:]
    assert memory.host_won(keys[-1]) and memory.host_won(keys[6]) and not memory.host_won(keys[5])

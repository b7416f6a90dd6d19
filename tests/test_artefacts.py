"""The edge's forward compiled ahead (eden_serve/edge/artefacts.py): made by ``eden-serve archive
--prepare`` on this CPU with the tiny model (inductor, its C++ kernels), carried in the edge archive
and beside it; a fresh process with an empty inductor cache compiles the prepared shapes from it
(every region a cache hit, none compiled anew) and runs them compiled, the middles within the
documented rounding bound of the eager ones; a file made for another PyTorch, device or model, a
damaged one, or one whose tar would write outside the cache is refused before anything of it is
extracted, and the edge compiles as without it; the served edge loads what its archive carries and
starts compiling it at load. In a clip run in process, nothing of the artefacts is extracted nor
compiled before the first middle has been handed to the writer."""

import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from eden_serve.commands.cli import main
from eden_serve.edge import artefacts
from eden_serve.serving import archive

SHAPE = (64, 96, 4)  # frames of 64x96, forwards of 4 pairs: a clip's chunks of 4 on this CPU

# A fresh process: inductor's cache empty, the artefacts loaded, the prepared shape compiled from them.
LOAD = r"""
import json, os, sys, time, warnings
warnings.simplefilter("ignore")
started = time.perf_counter()
import torch
from torch._dynamo.utils import counters
from eden_serve.model.checkpoint import load_pair
from eden_serve.config import preset
from eden_serve.edge import Acceleration, Compile, artefacts
from eden_serve.clips.pipeline import interpolate_chunk
from eden_serve.model.synthetic import frame_pair
cloud, edge = load_pair(None, preset("tiny"))
edge.accelerate(Acceleration("off", Compile()))
loaded = time.perf_counter()
shapes = artefacts.load_into(edge, sys.argv[1])
edge.runner.wait_compiled()
ready = time.perf_counter()
frames = [torch.rand(3, 64, 96, generator=torch.Generator().manual_seed(k)) for k in range(5)]
compiled, _ = interpolate_chunk(cloud, edge, frames, seed=3, codec="fp32")
edge.accelerate(Acceleration("off", None))
eager, _ = interpolate_chunk(cloud, edge, frames, seed=3, codec="fp32")
print(json.dumps({"shapes": shapes, "load_s": ready - loaded,
                  "hits": counters["inductor"]["fxgraph_cache_hit"], "misses": counters["inductor"]["fxgraph_cache_miss"],
                  "max_difference": (compiled - eager).abs().max().item(), "files": sum(1 for _ in os.scandir(os.environ["TORCHINDUCTOR_CACHE_DIR"]))}))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Archives of the tiny model with the forward prepared for :data:`SHAPE` on this CPU."""
    store = tmp_path_factory.mktemp("store")
    started = time.perf_counter()
    archive.build(store, config="tiny", prepared=archive.Prepared((SHAPE,), "cpu"))
    (store / "making_s").write_text(str(time.perf_counter() - started))
    return store


def fresh_process(path: Path, cache: Path) -> dict:
    # A forced CPU capability is part of the artefacts' key: the fresh process runs under this one's.
    forced = {"ATEN_CPU_CAPABILITY": os.environ["ATEN_CPU_CAPABILITY"]} if "ATEN_CPU_CAPABILITY" in os.environ else {}
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin", "HOME": str(cache.parent), **forced}
    done = subprocess.run([sys.executable, "-c", LOAD, str(path)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_archive_carries_the_compiled_forward(store):
    with zipfile.ZipFile(store / "eden_ditdec.mar") as mar:
        inside = mar.read(artefacts.FILE_NAME)
    beside = (store / "eden_ditdec.compiled.bin").read_bytes()
    assert inside == beside
    header, _ = artefacts.read_header(store / "eden_ditdec.compiled.bin")
    assert header["shapes"] == [list(SHAPE)]
    assert header["key"]["device"] == "cpu" and header["key"]["precision"] == "fp32" and header["key"]["torch"]


def test_a_fresh_process_compiles_the_prepared_shape_from_it(store, tmp_path, capsys):
    cache = tmp_path / "inductor"
    cache.mkdir()
    found = fresh_process(store / "eden_ditdec.compiled.bin", cache)
    assert found["shapes"] == [list(SHAPE)]
    assert found["hits"] >= 6 and found["misses"] == 0  # every region of both stages from the artefacts, none compiled anew
    assert found["max_difference"] <= 1 / 255  # compiled against eager fp32: within a level
    with capsys.disabled():
        print(f"\ncompiled ahead: made (archive build included) in {float((store / 'making_s').read_text()):.1f} s; "
              f"a fresh process compiled the shape from it in {found['load_s']:.1f} s")


def forged(path: Path, source: Path, key: dict | None = None, data: bytes | None = None) -> Path:
    header, start = artefacts.read_header(source)
    original = source.read_bytes()[start:]
    return artefacts.write(path, key if key is not None else header["key"], header["shapes"], data if data is not None else original)


@pytest.fixture
def edge(tmp_path, monkeypatch):
    """The tiny edge compiled in the background (inductor) into an empty cache of its own."""
    from eden_serve.model.checkpoint import load_pair
    from eden_serve.config import preset
    from eden_serve.edge import Acceleration, Compile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    _, edge = load_pair(None, preset("tiny"))
    edge.accelerate(Acceleration("off", Compile()))
    yield edge
    edge.runner.close()


@pytest.mark.parametrize("field, value", [("torch", "0.0.0"), ("device", "NVIDIA H100 80GB HBM3"), ("capability", "9.0"),
                                          ("driver", "580.159.04"), ("weights", "0" * 32), ("precision", "bf16")])
def test_a_key_made_elsewhere_is_refused_before_anything_is_extracted(store, tmp_path, edge, caplog, field, value):
    header, _ = artefacts.read_header(store / "eden_ditdec.compiled.bin")
    other = forged(tmp_path / "other.bin", store / "eden_ditdec.compiled.bin", {**header["key"], field: value})
    with caplog.at_level(logging.WARNING, logger=artefacts.__name__):
        assert artefacts.load_into(edge, other) is None
    assert f"made for another {field}" in caplog.text or field in caplog.text
    assert not (tmp_path / "inductor").exists() or not any((tmp_path / "inductor").rglob("*.py"))
    assert not edge.runner.background.asked and not edge.runner.background.held  # the forward compiles as without artefacts


def test_an_amd_gpus_arch_is_in_the_key(monkeypatch):
    """Under ROCm two GPUs of one reported capability (an MI50 and an MI210 both say 9.0) run kernels
    built for their own arch: an artefact made on one must not load on the other."""
    import torch

    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(artefacts, "_driver_version", lambda: "60400")
    keys = []
    for arch in ("gfx906:sramecc+:xnack-", "gfx90a:sramecc+:xnack-"):
        properties = SimpleNamespace(name="AMD Instinct", major=9, minor=0, gcnArchName=arch)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None, p=properties: p)
        keys.append(artefacts.environment(torch.device("cuda:0")))
    assert keys[0]["arch"] == "gfx906:sramecc+:xnack-" and keys[0]["hip"] == "6.4.0"
    assert keys[0] != keys[1]


def test_damaged_artefacts_are_refused(store, tmp_path, edge, caplog):
    header, start = artefacts.read_header(store / "eden_ditdec.compiled.bin")
    data = bytearray((store / "eden_ditdec.compiled.bin").read_bytes()[start:])
    data[len(data) // 2] ^= 1
    damaged = store / "damaged.bin"
    damaged.write_bytes((store / "eden_ditdec.compiled.bin").read_bytes()[:start] + bytes(data))
    with caplog.at_level(logging.WARNING, logger=artefacts.__name__):
        assert artefacts.load_into(edge, damaged) is None
    assert "damaged" in caplog.text and not edge.runner.background.asked


def test_a_tar_that_writes_outside_the_cache_is_refused(store, tmp_path, edge, caplog):
    header, _ = artefacts.read_header(store / "eden_ditdec.compiled.bin")
    bundle = tmp_path / "evil.tar"
    (tmp_path / "payload").write_text("x")
    with tarfile.open(bundle, "w") as tar:
        tar.add(tmp_path / "payload", arcname="fine/entry.py")
        tar.add(tmp_path / "payload", arcname="../escaped.py")
    evil = artefacts.write(tmp_path / "evil.bin", header["key"], header["shapes"], bundle.read_bytes())
    with caplog.at_level(logging.WARNING, logger=artefacts.__name__):
        assert artefacts.load_into(edge, evil) is None
    assert "cannot be extracted" in caplog.text
    assert not (tmp_path / "escaped.py").exists() and not (tmp_path / "inductor" / "fine").exists()


def test_the_command_refuses_what_is_not_such_a_file(tmp_path, capsys):
    bogus = tmp_path / "bogus.bin"
    bogus.write_bytes(b"not artefacts")
    frame = Path("tests/data/scene_cut/02.png")
    code = main(["interpolate", str(frame), str(frame), "-o", str(tmp_path / "m.png"), "--config", "tiny", "--compiled", str(bogus)])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("not a file of compiled artefacts (eden-serve archive --prepare makes them)")
    assert not (tmp_path / "m.png").exists()


def test_the_served_edge_loads_what_its_archive_carries(store, tmp_path, monkeypatch):
    from eden_serve.serving.services import EdgeService
    from eden_serve.serving.worker import Settings

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    with zipfile.ZipFile(store / "eden_ditdec.mar") as mar:
        mar.extractall(tmp_path / "model")
    settings = Settings.from_yaml({"pt2": {"compile": {"enable": True}}})
    model = EdgeService.load_model(tmp_path / "model" / "eden_edge.safetensors", "cpu", settings)
    try:
        # Started at load, before any request (a long-lived worker's time after load is most often
        # idle): a wait that releases nothing sees both stages compiled and swapped in.
        assert not model.runner.background.held
        assert model.runner.background.wait(600) and len(model.runner.swapped) == 2 and not model.runner.background.failed
    finally:
        model.runner.close()


def test_a_refused_file_leaves_the_forward_compiling_as_without_it(tmp_path, monkeypatch, caplog):
    """Refused, the edge compiles each key from its third forward in the background, as always
    (dynamo's eager backend here: the key's compile options say which)."""
    from eden_serve.model.checkpoint import load_pair
    from eden_serve.config import preset
    from eden_serve.edge import Acceleration, Compile
    from eden_serve.edge import middles_of
    from eden_serve.model.synthetic import chunk

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    _, edge = load_pair(None, preset("tiny"))
    edge.accelerate(Acceleration("off", Compile(backend="eager")))
    try:
        other = artefacts.write(tmp_path / "other.bin", {**artefacts.key(edge, edge.runner.compile), "torch": "0.0.0"}, [(64, 96, 2)], b"")
        with caplog.at_level(logging.WARNING, logger=artefacts.__name__):
            assert artefacts.load_into(edge, other) is None
        assert not edge.runner.background.asked
        pairs = [chunk(edge.config, (64, 96), frames=3, seed=7).pair(j) for j in range(2)]
        for _ in range(3):
            middles_of(edge, pairs)
        assert edge.runner.background.asked and edge.runner.wait_compiled(300) and len(edge.runner.swapped) == 2
    finally:
        edge.runner.close()


@pytest.fixture
def models(tmp_path, monkeypatch):
    """The tiny cloud and edge, the edge compiled in the background by dynamo's eager backend (what
    is compiled and when, not inductor's speed, is under test) into an empty cache of its own."""
    from eden_serve.model.checkpoint import load_pair
    from eden_serve.config import preset
    from eden_serve.edge import Acceleration, Compile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cloud, edge = load_pair(None, preset("tiny"))
    edge.accelerate(Acceleration("off", Compile(backend="eager")))
    yield cloud, edge
    edge.runner.close()


def marked(path: Path, edge, shape: tuple[int, int, int]) -> Path:
    """Artefacts of ``edge``'s key for ``shape`` whose tar holds one marker file, which shows when they are extracted."""
    bundle = io.BytesIO()
    with tarfile.open(fileobj=bundle, mode="w") as tar:
        entry = tarfile.TarInfo("marker/prepared")
        entry.size = 1
        tar.addfile(entry, io.BytesIO(b"x"))
    return artefacts.write(path, artefacts.key(edge, edge.runner.compile), [shape], bundle.getvalue())


def frames_folder(folder: Path, sizes: list[tuple[int, int]]) -> Path:
    from PIL import Image
    from eden_serve.model.synthetic import scene

    folder.mkdir()
    for k, (height, width) in enumerate(sizes):
        Image.fromarray(scene(height, width, k / 4)).save(folder / f"{k:02d}.png")
    return folder


def test_a_clip_hands_its_first_middle_to_the_writer_before_anything_prepared_starts(tmp_path, models, monkeypatch):
    """A clip of one pair: its middle is handed to the writer before the artefacts are extracted and
    before any compilation ahead starts; then, waited for, the prepared shape's two stages are
    compiled and swapped in (from the artefacts: one forward never asks for a key by itself)."""
    from eden_serve.clips.pipeline import interpolate_clip_in_process
    from eden_serve.media import DirectoryWriter

    cloud, edge = models
    marker = tmp_path / "inductor" / "marker" / "prepared"
    events = []
    work = edge.runner.background.work
    edge.runner.background.work = lambda key, job: (events.append(("compile", key[0])), work(key, job))[1]
    add_middle = DirectoryWriter.add_middle
    monkeypatch.setattr(DirectoryWriter, "add_middle",
                        lambda writer, *a, **k: (events.append(("handed", marker.exists())), add_middle(writer, *a, **k))[1])
    assert artefacts.load_into(edge, marked(tmp_path / "prepared.bin", edge, (64, 96, 1))) == [(64, 96, 1)]
    assert not marker.exists()

    summary = interpolate_clip_in_process(frames_folder(tmp_path / "in", [(64, 96)] * 2), tmp_path / "out", cloud, edge,
                                          codec="fp32", chunk=1)
    assert summary.pairs == 1 and len(list((tmp_path / "out").iterdir())) == 3
    assert edge.runner.wait_compiled(300) and not edge.runner.background.failed
    assert events[0] == ("handed", False)  # the first middle handed over, nothing of the artefacts extracted yet
    assert sorted(name for what, name in events if what == "compile") == ["render_uint8", "sample"]
    assert marker.exists() and len(edge.runner.swapped) == 2


def test_a_run_that_ends_before_its_first_middle_starts_nothing_and_closes(tmp_path, models):
    """A clip that fails before any middle (its frames differ in size): no compiling thread was
    started, nothing extracted, and closing the runner leaves nothing held to start later."""
    from eden_serve.clips.pipeline import interpolate_clip_in_process
    from eden_serve.errors import EdenError

    cloud, edge = models
    before = set(threading.enumerate())
    assert artefacts.load_into(edge, marked(tmp_path / "prepared.bin", edge, (64, 96, 1)))
    with pytest.raises(EdenError):
        interpolate_clip_in_process(frames_folder(tmp_path / "in", [(64, 96), (96, 64)]), tmp_path / "out", cloud, edge,
                                    codec="fp32", chunk=1)
    edge.runner.close()
    edge.runner.release()  # after the close: nothing to start
    assert not [t for t in set(threading.enumerate()) - before if t.name == "eden-compile"]
    assert not edge.runner.background.asked and not edge.runner.background.held
    assert not (tmp_path / "inductor" / "marker").exists() and not (tmp_path / "out").exists()

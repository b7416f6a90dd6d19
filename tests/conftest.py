import dataclasses
import json
import os
import warnings
import weakref
from pathlib import Path

# The suite is the CPU's contract (bits and bounds against CPU kernels); a GPU's is the GPU check's
# (benchmarks/gpu_check.py). On a machine with GPUs, `--device auto`, TorchServe's workers and every
# `eden-serve` the tests start would take one, so none is visible to the tests or what they start.
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import numpy as np  # noqa: E402 - after the GPUs are hidden, before torch can see them
import pytest  # noqa: E402
import torch  # noqa: E402

from eden_serve import media
from eden_serve.cloud.encoder import CloudEncoder
from eden_serve.config import PRESETS
from eden_serve.edge import EdgeModel
from eden_serve.model.checkpoint import module_from_state
from harness.scheduling import OrdinaryScheduling
from harness.servers import build_archives, loopback_http, torchserve  # noqa: F401 - loopback_http for the tests
from eden_serve.model.synthetic import state_dict as synthetic_state_dict

# A test stuck, or a thread left running that is not a daemon, ends the run instead of hanging it.
pytest_plugins = ["harness.hangs"]

GOLDEN_DIR = Path(__file__).parent / "golden"


def changed(chunk, **change):
    """``chunk`` with the fields ``change`` names replaced, its own or its decisions' (differences,
    seeds, cuts, cloud): what ``dataclasses.replace`` gives for a chunk's own fields."""
    own = {name: value for name, value in change.items() if name in {f.name for f in dataclasses.fields(chunk)}}
    decided = {name: value for name, value in change.items() if name not in own}
    return dataclasses.replace(chunk, **own, **({"decisions": dataclasses.replace(chunk.decisions, **decided)} if decided else {}))
GOLDEN_CASES = ["tiny_70x100", "tiny_64x96"]


class Golden:
    """One interpolation by the official implementation: its weights, inputs and outputs."""

    def __init__(self, name: str):
        data = np.load(GOLDEN_DIR / f"{name}.npz")
        self.meta = json.loads(str(data["config"]))
        self.config = PRESETS["tiny"]
        self.state = {k.removeprefix("weights/"): torch.from_numpy(data[k]) for k in data.files if k.startswith("weights/")}
        self.arrays = {k: torch.from_numpy(data[k]) for k in data.files if not k.startswith(("weights/", "config"))}
        self.frame0 = self.arrays["frame0"].permute(2, 0, 1).float() / 255
        self.frame1 = self.arrays["frame1"].permute(2, 0, 1).float() / 255
        self.seed = self.meta["noise_seed"]

    def cloud(self) -> CloudEncoder:
        return CloudEncoder(module_from_state(self.state, "cloud", self.config), self.config)

    def edge(self, precision: str = "fp32") -> EdgeModel:
        return EdgeModel(module_from_state(self.state, "edge", self.config), self.config, precision=precision)


# The inner loop (docs/development.md, at the top): `pytest -m inner` runs the tests of the wire, the
# cloud, the edge and the media that need no real TorchServe, network, browser or GPU check, less the
# few marked slow, in under 3 minutes on 2 cores. The whole suite stays what CI runs.
INNER = {
    "test_wire", "test_wire_pixels", "test_wire_keyed", "test_wire_limits", "test_kinds", "test_bitstream",
    "test_elision", "test_answers", "test_raw", "test_cloud", "test_scene_cuts", "test_edge", "test_forward",
    "test_graphs", "test_precision", "test_sizing", "test_model", "test_config", "test_errors",
    "test_synthetic", "test_frames", "test_clips", "test_video", "test_encoding", "test_packets",
    "test_threads", "test_timing", "test_colour", "test_depth", "test_pipeline", "test_layout", "test_docs",
    "test_segments", "test_planes", "test_decoders", "test_raw_planes", "test_continued", "test_steady",
}
OUTER = ("serving", "network", "slow")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.stem in INNER and not any(item.get_closest_marker(name) for name in OUTER):
            item.add_marker(pytest.mark.inner)


@pytest.fixture(scope="session", autouse=True)
def ordinary_scheduling():
    """The run and every process it starts stay under the ordinary time-sharing policy
    (harness/scheduling.py says why); the run warns where something had to be moved back."""
    with OrdinaryScheduling() as watcher:
        yield watcher
    if watcher.moved:
        warnings.warn(f"{len(watcher.moved)} thread(s) of the test run were found under a real-time policy "
                      f"and put back under SCHED_OTHER (harness/scheduling.py)")


@pytest.fixture
def open_files(ordinary_scheduling):
    """What this process holds open, as ``fd:target`` strings, read between two scans of the
    run's scheduling watcher (each scan of /proc holds a descriptor of its own for a moment)."""

    def held() -> list[str]:
        with ordinary_scheduling.paused():
            found = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    found.append(f"{fd}:{os.readlink(f'/proc/self/fd/{fd}')}")
                except OSError:
                    pass  # the listing's own descriptor, closed by now
            return sorted(found)

    return held


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    """Where the page's tests save their screenshots: a temporary folder, so that a run changes no
    tracked file; EDEN_SCREENSHOTS=docs/img refreshes the documentation's (docs/development.md)."""
    folder = os.environ.get("EDEN_SCREENSHOTS")
    return Path(folder) if folder else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="session", params=GOLDEN_CASES)
def golden(request) -> Golden:
    return Golden(request.param)


@pytest.fixture(scope="session")
def tiny_state() -> dict:
    return synthetic_state_dict(PRESETS["tiny"], seed=0)


@pytest.fixture(scope="session")
def tiny_models(tiny_state):
    config = PRESETS["tiny"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CloudEncoder(module_from_state(tiny_state, "cloud", config), config), EdgeModel(
            module_from_state(tiny_state, "edge", config), config
        )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The tiny model's archives (eden_encoder.mar, eden_ditdec.mar, eden.war), once per test module."""
    return build_archives(tmp_path_factory.mktemp("model_store"), config="tiny")


@pytest.fixture(scope="module")
def server(store):
    """One real TorchServe with both halves and the workflow, stopped after the module."""
    with torchserve(store, models=["eden_encoder.mar", "eden_ditdec.mar"], workflows=["eden.war"]) as s:
        yield s


@pytest.fixture
def live_frames(monkeypatch) -> weakref.WeakSet:
    """Every media.Frame made from now on, while it is alive."""
    live = weakref.WeakSet()
    original_init = media.Frame.__init__

    def counting_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        live.add(self)

    monkeypatch.setattr(media.Frame, "__init__", counting_init)
    return live


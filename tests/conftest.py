import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from eden_serve.checkpoint import module_from_state
from eden_serve.cloud import CloudEncoder
from eden_serve.config import PRESETS
from eden_serve.edge import EdgeModel
from eden_serve.synthetic import state_dict as synthetic_state_dict

GOLDEN_DIR = Path(__file__).parent / "golden"
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

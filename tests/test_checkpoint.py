"""The official checkpoint format, its strict validation, and the cloud/edge split."""

import pickle

import pytest
import torch

from eden_serve.config import PRESETS
from eden_serve.errors import CheckpointError
from eden_serve.model.checkpoint import load_cloud, load_edge, load_half, load_official, split, write_halves
from eden_serve.model.synthetic import state_dict as synthetic_state_dict
from eden_serve.model.weights import is_cloud_key

TINY = PRESETS["tiny"]


def save(tmp_path, obj, name="eden.pt"):
    path = tmp_path / name
    torch.save(obj, path)
    return path


def test_official_dimensions_load_strictly(tmp_path):
    state = synthetic_state_dict(PRESETS["official"], seed=1)
    loaded = load_official(save(tmp_path, {"eden": state, "step": 1000}), PRESETS["official"])
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)


def test_bare_state_dict_is_accepted(tmp_path, tiny_state):
    assert load_official(save(tmp_path, tiny_state), TINY).keys() == tiny_state.keys()


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda s: s.pop("dit_blocks.1.mlp.fc2.bias"), "missing key 'dit_blocks.1.mlp.fc2.bias'"),
        (lambda s: s.__setitem__("extra.weight", torch.zeros(1)), "unexpected key 'extra.weight'"),
        (lambda s: s.__setitem__("proj_in.weight", torch.zeros(3, 3)), "key 'proj_in.weight' has shape (3, 3)"),
    ],
)
def test_wrong_state_dicts_are_refused_naming_the_key(tmp_path, tiny_state, corrupt, message):
    state = dict(tiny_state)
    corrupt(state)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_official(save(tmp_path, {"eden": state}), TINY)


def test_checkpoint_of_other_dimensions_is_refused(tmp_path, tiny_state):
    with pytest.raises(CheckpointError, match="has shape"):
        load_official(save(tmp_path, {"eden": tiny_state}), PRESETS["official"])


class Exploit:
    def __reduce__(self):
        return (print, ("code ran",))


@pytest.mark.parametrize(
    "write",
    [
        lambda p: p.write_bytes(b"definitely not a checkpoint"),
        lambda p: p.write_bytes(pickle.dumps(Exploit())),
        lambda p: torch.save([1, 2, 3], p),
    ],
    ids=["garbage", "pickle-with-code", "not-a-dict"],
)
def test_non_checkpoints_are_refused(tmp_path, write, capsys):
    path = tmp_path / "eden.pt"
    write(path)
    with pytest.raises(CheckpointError):
        load_official(path, TINY)
    assert "code ran" not in capsys.readouterr().out


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_official(tmp_path / "nope.pt", TINY)


def test_split_is_by_module_and_halves_round_trip(tmp_path, tiny_state):
    halves = split(tiny_state)
    assert set(halves["cloud"]) == {k for k in tiny_state if k.split(".")[0].endswith(("_cond_dit", "_cond_dec"))}
    assert len(halves["cloud"]) == 8 and all(not is_cloud_key(k) for k in halves["edge"])
    paths = write_halves(tiny_state, tmp_path, TINY)
    cloud, edge = load_cloud(paths["cloud"]), load_edge(paths["edge"])
    assert cloud.config == TINY and edge.config == TINY
    for side, path in paths.items():
        module, _ = load_half(path, side)
        assert all(torch.equal(v, tiny_state[k]) for k, v in module.state_dict().items())


def test_halves_refuse_the_wrong_side_and_garbage(tmp_path, tiny_state):
    paths = write_halves(tiny_state, tmp_path, TINY)
    with pytest.raises(CheckpointError, match="holds 'cloud' weights"):
        load_edge(paths["cloud"])
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="not a safetensors"):
        load_cloud(bad)


"""eden_serve/serving/archive.py: the archives built in process, the checkpoint read once, the model-configs
written from the build's options, and bad options refused before any work."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
import zipfile

import pytest
import torch
import yaml

from eden_serve import wire
from eden_serve.config import preset
from eden_serve.errors import BadInputError
from eden_serve.model import checkpoint
from eden_serve.model.checkpoint import load_half, split
from eden_serve.model.synthetic import state_dict as synthetic_state_dict
from eden_serve.serving import archive
from eden_serve.serving.worker import Settings

TINY = preset("tiny")


@pytest.fixture(scope="module")
def official_file(tmp_path_factory):
    """A checkpoint in the official file's shape (a dict with an "eden" state dict), tiny dimensions."""
    path = tmp_path_factory.mktemp("ckpt") / "eden.pt"
    torch.save({"eden": synthetic_state_dict(TINY, seed=7)}, path)
    return path


@pytest.fixture(scope="module")
def built(official_file, tmp_path_factory):
    """The archives of ``official_file``, and how many times the build called torch.load."""
    loads = []
    original = torch.load

    def counting(*args, **kwargs):
        loads.append(args[0])
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint.torch, "load", counting)
        paths = archive.build(tmp_path_factory.mktemp("store"), checkpoint=official_file, config="tiny",
                              options=archive.Options(codec="int8+zstd", precision="auto", threads=3))
    return paths, loads


def test_the_checkpoint_is_read_once_per_build(built, official_file):
    _, loads = built
    assert loads == [official_file]


def test_the_build_writes_the_three_archives(built):
    paths, _ = built
    assert sorted(paths) == ["eden.war", "eden_ditdec.mar", "eden_encoder.mar"]
    assert all(path.is_file() and path.parent == paths["eden.war"].parent for path in paths.values())
    with zipfile.ZipFile(paths["eden.war"]) as war:
        assert yaml.safe_load(war.read("eden.yaml"))["dag"] == {"eden_encoder": ["eden_ditdec"]}


@pytest.mark.parametrize("name, side", [("eden_encoder", "cloud"), ("eden_ditdec", "edge")])
def test_each_archive_holds_its_half_handler_config_and_the_package(built, name, side, official_file, tmp_path):
    paths, _ = built
    with zipfile.ZipFile(paths[f"{name}.mar"]) as mar:
        names = mar.namelist()
        manifest = json.loads(mar.read("MAR-INF/MANIFEST.json"))
        assert manifest["model"] == {"modelName": name, "handler": f"{name}_handler.py", "modelVersion": "1.0",
                                     "configFile": "model-config.yaml"}
        assert mar.getinfo(f"eden_{side}.safetensors").compress_type == zipfile.ZIP_STORED
        assert {"eden_serve/serving/archive.py", "eden_serve/serving/handler.py", "eden_serve/wire/envelope.py"} <= set(names)
        assert not [n for n in names if "__pycache__" in n or "/torchserve/" in n or n.endswith(".pyc")]
        settings = Settings.from_yaml(yaml.safe_load(mar.read("model-config.yaml")))
        mar.extract(f"eden_{side}.safetensors", tmp_path)
    assert settings.threads == 3
    if side == "cloud":
        assert settings.codec == "int8+zstd"
    else:
        assert settings.precision == "auto"
    # The half is the checkpoint's, tensor for tensor.
    module, config = load_half(tmp_path / f"eden_{side}.safetensors", side)
    expected = split(synthetic_state_dict(TINY, seed=7))[side]
    assert config == TINY
    assert module.state_dict().keys() == expected.keys()
    assert all(torch.equal(value, expected[key]) for key, value in module.state_dict().items())


def test_the_model_configs_keep_their_comments_and_take_the_options():
    text = archive.model_config_text("eden_encoder", archive.Options(codec="fp16", threads=2))
    source = (archive.GLUE / "eden_encoder-config.yaml").read_text()
    assert text.count("\n") == source.count("\n")
    assert [line for line in source.splitlines() if line.startswith("#")] == [line for line in text.splitlines() if line.startswith("#")]
    settings = Settings.from_yaml(yaml.safe_load(text))
    assert (settings.codec, settings.threads) == ("fp16", 2)
    defaults = Settings.from_yaml(yaml.safe_load(archive.model_config_text("eden_ditdec", archive.Options())))
    assert (defaults.precision, defaults.threads) == ("fp32", 0)
    assert yaml.safe_load(archive.model_config_text("eden_encoder", archive.Options()))["handler"]["codec"] == wire.DEFAULT_CODEC


@pytest.mark.parametrize("root", [None, "/srv/media", '/srv/a "quoted" dir: #1'])
def test_the_media_root_is_written_as_yaml_and_read_back(root):
    text = archive.model_config_text("eden_encoder", archive.Options(media_root=root))
    assert Settings.from_yaml(yaml.safe_load(text)).media_root == root
    assert "media_root" not in archive.model_config_text("eden_ditdec", archive.Options(media_root=root))


@pytest.mark.parametrize("options, message", [
    (archive.Options(codec="gzip"), "--codec: unknown codec 'gzip'"),
    (archive.Options(precision="fp8"), "--precision must be one of fp32, bf16, auto"),
    (archive.Options(threads=-1), "--threads must be an integer >= 0"),
    (archive.Options(media_root="media"), "--media-root must be an absolute directory path"),
])
def test_bad_options_are_refused_before_any_work(options, message, tmp_path):
    with pytest.raises(BadInputError, match=message.replace("(", r"\(")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            archive.build(tmp_path / "store", config="tiny", options=options)
    assert not (tmp_path / "store").exists()


def test_the_command_refuses_a_bad_option_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "archive", "--config", "tiny", "--model-store",
                             str(tmp_path / "store"), "--codec", "gzip"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"eden-serve: error: --codec: unknown codec 'gzip'; choose one of {', '.join(wire.CODECS)}"]
    assert not (tmp_path / "store").exists()

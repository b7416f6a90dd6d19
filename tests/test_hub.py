"""Official weights by hub reference: parsing, the offline cache, strict checking, the CLI and archive.sh.

No machine here reaches the hub, so every test runs with HF_HUB_OFFLINE=1 against a cache it builds
in huggingface_hub's layout: models--ORG--NAME/{blobs/SHA256, refs/REV, snapshots/COMMIT/FILE -> blob}.
"""

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eden_serve.config import PRESETS
from eden_serve.errors import CheckpointError
from eden_serve.model.checkpoint import load_half, split
from eden_serve.model.hub import HubFile, parse_reference
from harness.servers import REPO
from eden_serve.model.synthetic import state_dict as synthetic_state_dict

TINY = PRESETS["tiny"]
MAIN_COMMIT, TAGGED_COMMIT = "a" * 40, "b" * 40
SEEDS = {MAIN_COMMIT: 4, TAGGED_COMMIT: 3}  # a different checkpoint at each commit


def add_file(cache: Path, repo: str, commit: str, filename: str, data: bytes) -> None:
    folder = cache / f"models--{repo.replace('/', '--')}"
    blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = folder / "snapshots" / commit / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))


def add_ref(cache: Path, repo: str, ref: str, commit: str) -> None:
    path = cache / f"models--{repo.replace('/', '--')}" / "refs" / ref
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(commit)


def checkpoint_bytes(tmp_path: Path, obj) -> bytes:
    path = tmp_path / "staging.pt"
    torch.save(obj, path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """zhZ524/EDEN with eden.pt at two commits: main -> seed 4, tag v1 -> seed 3."""
    tmp = tmp_path_factory.mktemp("hub")
    cache = tmp / "cache"
    for commit, seed in SEEDS.items():
        add_file(cache, "zhZ524/EDEN", commit, "eden.pt", checkpoint_bytes(tmp, {"eden": synthetic_state_dict(TINY, seed)}))
    add_ref(cache, "zhZ524/EDEN", "main", MAIN_COMMIT)
    add_ref(cache, "zhZ524/EDEN", "v1", TAGGED_COMMIT)
    # Another repository whose eden.pt lacks a tensor: the strict check must refuse it.
    broken = synthetic_state_dict(TINY, 0)
    broken.pop("proj_in.weight")
    add_file(cache, "someone/not-eden", MAIN_COMMIT, "eden.pt", checkpoint_bytes(tmp, {"eden": broken}))
    add_ref(cache, "someone/not-eden", "main", MAIN_COMMIT)
    return cache


def offline_env(cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def cli(cache: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eden_serve.commands.cli", *map(str, args)], env=offline_env(cache), capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("hf://zhZ524/EDEN/eden.pt", HubFile("zhZ524/EDEN", "eden.pt")),
        ("hf://zhZ524/EDEN/eden.pt@v1", HubFile("zhZ524/EDEN", "eden.pt", "v1")),
        ("hf://zhZ524/EDEN@v1/eden.pt", HubFile("zhZ524/EDEN", "eden.pt", "v1")),
        ("hf://org/my.model-2/weights/eden.pt@" + MAIN_COMMIT, HubFile("org/my.model-2", "weights/eden.pt", MAIN_COMMIT)),
    ],
)
def test_references_parse(text, expected):
    assert parse_reference(text) == expected


@pytest.mark.parametrize(
    "text", ["hf://zhZ524/EDEN", "hf://zhZ524", "hf://zhZ524/EDEN/eden.pt@", "hf://zhZ524/EDEN@a/eden.pt@b", "hf://zh Z/EDEN/eden.pt", "zhZ524/EDEN/eden.pt"]
)
def test_malformed_references_are_refused(text):
    with pytest.raises(CheckpointError, match="not a hub reference"):
        parse_reference(text)


@pytest.mark.parametrize(
    "revision, commit", [(None, MAIN_COMMIT), ("v1", TAGGED_COMMIT), (TAGGED_COMMIT, TAGGED_COMMIT)], ids=["default", "tag", "commit"]
)
def test_download_prints_the_cached_file_of_the_revision(hub_cache, revision, commit):
    result = cli(hub_cache, "download", "--config", "tiny", *(["--revision", revision] if revision else []))
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path == hub_cache / "models--zhZ524--EDEN" / "snapshots" / commit / "eden.pt"
    state = torch.load(path, weights_only=True)["eden"]
    expected = synthetic_state_dict(TINY, SEEDS[commit])
    assert all(torch.equal(state[k], expected[k]) for k in expected)


def test_offline_with_nothing_cached_is_one_line_and_exit_2(tmp_path):
    result = cli(tmp_path / "empty-cache", "download")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"eden-serve: error: hf://zhZ524/EDEN/eden.pt is not in the hub cache ({tmp_path / 'empty-cache'}) and HF_HUB_OFFLINE=1 forbids downloading it"
    ]
    assert result.stdout == ""


def test_downloaded_file_is_checked_strictly(hub_cache):
    result = cli(hub_cache, "download", "--repo", "someone/not-eden", "--config", "tiny")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "missing key 'proj_in.weight'" in result.stderr
    # The official dimensions by default: a tiny checkpoint does not pass for the official one.
    result = cli(hub_cache, "download")
    assert result.returncode == 2 and "has shape" in result.stderr and "another --config" in result.stderr


@pytest.mark.parametrize("reference", ["hf://zhZ524/EDEN/eden.pt@missing", "hf://zhZ524/EDEN/other.pt", "hf://zhZ524/EDEN"])
def test_bad_references_on_the_command_line_are_one_line_and_exit_2(hub_cache, tmp_path, reference):
    result = cli(hub_cache, "split-checkpoint", reference, "--config", "tiny", "--out", tmp_path / "w")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("eden-serve: error: ")
    assert not (tmp_path / "w").exists()


def test_split_checkpoint_reads_a_reference(hub_cache, tmp_path):
    result = cli(hub_cache, "split-checkpoint", "hf://zhZ524/EDEN/eden.pt@v1", "--config", "tiny", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    expected = split(synthetic_state_dict(TINY, SEEDS[TAGGED_COMMIT]))
    for side in ("cloud", "edge"):
        module, _ = load_half(tmp_path / f"eden_{side}.safetensors", side)
        assert all(torch.equal(value, expected[side][key]) for key, value in module.state_dict().items())


def test_archive_sh_reads_a_reference(hub_cache, tmp_path):
    store = tmp_path / "store"
    result = subprocess.run(
        ["bash", str(REPO / "archive.sh"), "--checkpoint", "hf://zhZ524/EDEN/eden.pt", "--config", "tiny", "--model-store", str(store)],
        env=offline_env(hub_cache), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "synthetic" not in result.stderr
    assert sorted(p.name for p in store.iterdir()) == ["eden.war", "eden_ditdec.mar", "eden_encoder.mar"]


def test_archive_sh_refuses_a_missing_reference_offline(tmp_path):
    result = subprocess.run(
        ["bash", str(REPO / "archive.sh"), "--checkpoint", "hf://zhZ524/EDEN/eden.pt", "--config", "tiny", "--model-store", str(tmp_path / "store")],
        env=offline_env(tmp_path / "empty-cache"), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in result.stderr
    assert not list((tmp_path / "store").glob("*.mar"))


@pytest.mark.parametrize("reference", ["hf://a/b/../../x", "hf://../../x", "hf://a/b/./x", "hf://a/b/x//y", "hf://a/b/x@../../y",
                                       "hf://a/b/..", "hf://a/b/x\\..\\y"])
def test_references_that_leave_their_repository_are_refused(reference):
    with pytest.raises(CheckpointError, match="is not allowed in a hub reference"):
        parse_reference(reference)


@pytest.mark.parametrize("option", [["--file", "../../x"], ["--file", "/etc/passwd"], ["--file", "a\\b"], ["--repo", "../.."],
                                    ["--revision", "../../main"]])
def test_download_refuses_paths_out_of_the_repository_before_any_access(tmp_path, option):
    """Our own check, before huggingface_hub sees anything: one line, and no cache is created."""
    result = cli(tmp_path / "cache", "download", *option)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "is not allowed in a hub reference" in result.stderr and not (tmp_path / "cache").exists()


def test_an_unreachable_hub_is_one_try_and_one_line(hub_cache, tmp_path):
    """Online, with the hub's port closed: our one line with the reason, not huggingface_hub's
    retry warnings; a file in the cache is still found."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    env = {**offline_env(tmp_path / "empty-cache"), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint, "NO_PROXY": "127.0.0.1"}
    result = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "download"], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"eden-serve: error: hf://zhZ524/EDEN/eden.pt: the hub cannot be reached (127.0.0.1:{endpoint.rsplit(':', 1)[1]}: "
        f"Connection refused) and the file is not in the hub cache ({tmp_path / 'empty-cache'})"
    ]
    env["HF_HUB_CACHE"] = str(hub_cache)
    result = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "download", "--config", "tiny"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert Path(result.stdout.strip()) == hub_cache / "models--zhZ524--EDEN" / "snapshots" / MAIN_COMMIT / "eden.pt"

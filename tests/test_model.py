"""The model's layout against the released checkpoint, and its embeddings."""

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import GOLDEN_DIR

from eden_serve.config import PRESETS, EdenConfig
from eden_serve.model.weights import EmbeddingCache, expected_layout, pos_embedding


def test_official_layout_matches_the_released_checkpoint():
    released = {}
    for line in (GOLDEN_DIR / "eden_state_dict_layout.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            key, shape = line.split("\t")
            released[key] = tuple(int(d) for d in shape.split("x"))
    assert expected_layout(PRESETS["official"]) == released


def test_positional_embedding_layout():
    pos = pos_embedding(EdenConfig(hidden_dim=8, num_heads=2), 4, 6, 2)  # 2 x 3 query grid of a 4 x 6 patch grid
    assert pos.shape == (6, 8) and pos.dtype == torch.float32
    # Row 0 has row coordinate 0: the second half (row embedding) is [sin 0, sin 0, cos 0, cos 0].
    torch.testing.assert_close(pos[0, 4:], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    # Tokens of one row share the row half; tokens of one column share the column half.
    torch.testing.assert_close(pos[0, 4:], pos[2, 4:])
    torch.testing.assert_close(pos[0, :4], pos[3, :4])


def test_embeddings_are_kept_by_device_within_a_byte_budget():
    config = EdenConfig(hidden_dim=8, num_heads=2)
    cache = EmbeddingCache(max_bytes=3 * 6 * 8 * 4)  # three 6-token grids
    made = []

    def make(key):
        return lambda: made.append(key) or torch.zeros(6, 8)

    keys = [(config, 4, 6, 2, torch.device(d)) for d in ("cpu", "meta")] + [(config, 6, 4, 2, torch.device("cpu"))]
    for key in keys + keys:
        cache.get(key, make(key))
    assert made == keys and cache.bytes == 3 * 6 * 8 * 4  # the second round hit
    cache.get(keys[0], make(keys[0]))  # most recent now: the meta one is the oldest
    cache.get((config, 2, 6, 1, torch.device("cpu")), make("fourth"))
    cache.get(keys[1], make(keys[1]))
    assert made[-2:] == ["fourth", keys[1]] and cache.bytes <= cache.max_bytes
    cache.get((config, 40, 60, 1, torch.device("cpu")), make("too large"))  # never kept
    assert cache.bytes <= cache.max_bytes and len(cache._entries) == 3
    assert pos_embedding(config, 4, 6, 2, "meta").device.type == "meta"


def test_threads_that_miss_one_key_at_once_get_the_one_tensor_stored():
    """Four threads miss one key together (each makes its tensor while the others do): all get the
    tensor the cache keeps, not each its own."""
    cache = EmbeddingCache()
    together = threading.Barrier(4)

    def make():
        together.wait(timeout=30)
        return torch.zeros(6, 8)

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: cache.get(("key",), make), range(4)))
    assert all(tensor is got[0] for tensor in got) and cache.get(("key",), make) is got[0]
    assert cache.bytes == 6 * 8 * 4


RSS_SCRIPT = """
import resource, sys
from eden_serve.config import PRESETS
from eden_serve.model import weights as model
config = PRESETS["official"]
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for i in range(40):  # 40 sizes about 1080p, as a worker sees when clips of many sizes come in
    ph, pw = 64 + 2 * (i % 5), 112 + 2 * (i // 5)
    for stride in (1, 2):
        model.pos_embedding(config, ph, pw, stride)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) * 1024
print(grown, model.EMBEDDINGS.bytes, model.EMBEDDINGS.max_bytes)
"""


@pytest.mark.slow  # many frame sizes' embeddings: the whole suite's, not the inner loop's
def test_cycling_frame_sizes_keeps_the_embeddings_within_the_budget():
    """40 frame sizes of about 1080p are 1.2 GB of embeddings: a worker keeps at most its budget."""
    result = subprocess.run([sys.executable, "-c", RSS_SCRIPT], capture_output=True, text=True, timeout=600, check=True)
    grown, kept, budget = (int(v) for v in result.stdout.split())
    assert kept <= budget
    assert grown < budget + (250 << 20), f"peak RSS grew {grown >> 20} MiB for a {budget >> 20} MiB budget"

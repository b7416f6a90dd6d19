"""The model's layout against the released checkpoint, and its embeddings."""

import torch
from conftest import GOLDEN_DIR

from eden_serve.config import PRESETS, EdenConfig
from eden_serve.model import expected_layout, pos_embedding


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

"""EdenConfig: the geometry every side derives from it, the presets, the fingerprint."""

import pytest

from eden_serve.config import PRESETS, EdenConfig, preset
from eden_serve.errors import BadInputError

OFFICIAL = PRESETS["official"]


@pytest.mark.parametrize("size, padding, grid", [
    ((64, 96), (0, 0, 0, 0), (4, 6)),  # already whole query patches
    ((70, 100), (13, 13, 14, 14), (6, 8)),  # 26 and 28 to add: halves
    ((33, 65), (15, 16, 15, 16), (4, 6)),  # odd totals: the extra row/column after
    ((480, 854), (0, 0, 5, 5), (30, 54)),  # 854 = 26 * 32 + 22
])
def test_padding_and_patch_grid(size, padding, grid):
    assert OFFICIAL.padding(*size) == padding
    assert OFFICIAL.patch_grid(*size) == grid
    top, bottom, left, right = padding
    assert (size[0] + top + bottom) % OFFICIAL.pad_multiple == 0 == (size[1] + left + right) % OFFICIAL.pad_multiple


def test_presets_round_trip_and_name_themselves():
    for name, config in PRESETS.items():
        assert EdenConfig.from_dict(config.to_dict()) == config
        assert config.name == name and preset(name) is config
    assert EdenConfig(hidden_dim=32, num_heads=2).name.startswith("custom-")


def test_fingerprint_tells_dimensions_apart():
    assert OFFICIAL.fingerprint() == EdenConfig().fingerprint()
    assert OFFICIAL.fingerprint() != PRESETS["tiny"].fingerprint()


def test_unknown_preset_is_bad_input():
    with pytest.raises(BadInputError, match="unknown config 'huge'"):
        preset("huge")

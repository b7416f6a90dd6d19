"""Acceptance: with the official dimensions and an official-layout checkpoint given to archive.sh,
the same frames and seed give the identical PNG through the workflow, through the two predictions
calls, and in process."""

import pytest
import requests
import torch

from eden_serve import wire
from eden_serve.clips.pipeline import interpolate_pair
from eden_serve.config import PRESETS
from eden_serve.media.frames import load_frame, to_png
from eden_serve.model.checkpoint import load_pair
from harness.servers import build_archives, torchserve
from eden_serve.model.synthetic import frame_pair
from eden_serve.model.synthetic import state_dict as synthetic_state_dict

pytestmark = pytest.mark.serving


def test_official_checkpoint_gives_one_png_three_ways(tmp_path):
    config = PRESETS["official"]
    checkpoint = tmp_path / "eden.pt"
    torch.save({"eden": synthetic_state_dict(config, seed=5)}, checkpoint)
    store = build_archives(tmp_path / "store", config="official", checkpoint=checkpoint)

    frame0, frame1 = (to_png(f) for f in frame_pair(70, 100))
    seed = 3
    cloud, edge = load_pair(checkpoint, config)
    middle, _ = interpolate_pair(cloud, edge, load_frame(frame0), load_frame(frame1), seed, wire.DEFAULT_CODEC)
    expected = to_png(middle)
    del cloud, edge

    files = {"frame0": ("f0.png", frame0), "frame1": ("f1.png", frame1), "seed": (None, str(seed))}
    with torchserve(store, models=["eden_encoder.mar", "eden_ditdec.mar"], workflows=["eden.war"], token_auth=False) as server:
        through_workflow = requests.post(f"{server.inference_url}/wfpredict/eden", files=files, timeout=300)
        payload = requests.post(f"{server.inference_url}/predictions/eden_encoder", files=files, timeout=300)
        through_two_calls = requests.post(
            f"{server.inference_url}/predictions/eden_ditdec", data=payload.content,
            headers={"Content-Type": "application/octet-stream"}, timeout=300,
        )
    assert payload.status_code == 200 and payload.content.startswith(b"EDENWIRE")
    assert through_two_calls.status_code == 200 and through_two_calls.headers["Content-Type"] == "image/png"
    assert through_workflow.status_code == 200
    assert through_two_calls.content == expected
    assert through_workflow.content == expected

"""A 10-bit clip between two real TorchServe halves (tiny model): its frames go up as 16-bit PNGs
(frames codec) or stay the cloud's own HEVC packets (bitstream codec, a server-side source), the
edge answers 16-bit middles, and the output equals the in-process run bit for bit. A server-side
source's colour (tags, range, depth, chroma location, HDR10's metadata) reaches the client's output
as a local file's does."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from eden_serve import wire
from eden_serve.model.checkpoint import load_archived
from eden_serve.client import Client
from eden_serve.media import Encoding
from eden_serve.media.colour import LIMITED, Colour
from eden_serve.clips.pipeline import interpolate_clip_in_process
from eden_serve.serving.worker import default_threads, usable_cores
from eden_serve.wire.raw import raw_bytes
from harness.servers import build_archives, torchserve
from harness.videos import make_graded_clip
from test_colour import P3, stated

av = pytest.importorskip("av")
pytestmark = pytest.mark.serving

SIZE = (64, 96)  # height, width
FRAMES = 7
# One request at a time, chunks not ramped: the edge batches exactly the in-process run's pairs, so
# the sums are the same (a ramped first chunk of one pair rounds otherwise on some CPUs).
RUN = {"seed": 5, "chunk": 3, "inflight": 1, "ramp": False, "progress": False, "encoding": Encoding("ffv1")}
# Server-side sources with colour: HDR10 as masters state it (BT.2020, PQ, limited range, chroma
# sited top left, a P3 mastering display), and SDR BT.709 in MP4.
SOURCES = {"hdr10.mkv": ("libx265", "yuv420p10le", Colour(9, 16, 9, LIMITED, P3, (1000, 400), chroma=3)),
           "bt709.mp4": ("libx264", "yuv420p", Colour(1, 1, 1, LIMITED))}


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A media root with a 10-bit HEVC clip, servers holding the tiny archives with that root, and the
    in-process output of the clip with the weights of those archives and the workers' thread count."""
    root = tmp_path_factory.mktemp("deep")
    media = root / "media"
    media.mkdir()
    make_graded_clip(media / "ramp10.mkv", "libx265", "yuv420p10le", SIZE, FRAMES, options={"crf": "12"})
    for name, (codec, pix_fmt, colour) in SOURCES.items():
        make_graded_clip(media / name, codec, pix_fmt, SIZE, 4, colour, {"crf": "12"})
    store = build_archives(root / "store", config="tiny", media_root=media)
    threads = torch.get_num_threads()
    torch.set_num_threads(default_threads("edge", usable_cores()))
    try:
        interpolate_clip_in_process(media / "ramp10.mkv", root / "expected.mkv", *load_archived(store), codec=wire.FRAMES_CODEC, **RUN)
    finally:
        torch.set_num_threads(threads)
    with torchserve(store, models=["eden_encoder.mar", "eden_ditdec.mar"], token_auth=False) as server:
        yield server, media, root / "expected.mkv"


def decoded(path) -> list[tuple[int, np.ndarray]]:
    """Each frame's time and its pixels at 16 bits."""
    with av.open(str(path)) as container:
        assert container.streams.video[0].codec_context.pix_fmt == "yuv420p10le"
        return [(frame.pts, frame.to_ndarray(format="rgb48le")) for frame in container.decode(video=0)]


def same_video(a, b) -> bool:
    x, y = decoded(a), decoded(b)
    return len(x) == len(y) == 2 * FRAMES - 1 and all(p == q and np.array_equal(f, g) for (p, f), (q, g) in zip(x, y))


@pytest.mark.parametrize("codec, source", [(wire.FRAMES_CODEC, "local"), (wire.BITSTREAM_CODEC, "cloud")])
def test_a_10_bit_clip_through_the_servers_equals_the_in_process_run(deep, tmp_path, codec, source):
    server, media, expected = deep
    src = "cloud:ramp10.mkv" if source == "cloud" else media / "ramp10.mkv"
    with Client(cloud=server.inference_url, edge=server.inference_url, codec=codec) as client:
        summary = client.interpolate_clip(src, tmp_path / "out.mkv", **RUN)
    assert same_video(tmp_path / "out.mkv", expected)
    # The middles came back at 16 bits: raw middles (an edge on loopback) of 6 bytes a pixel.
    assert summary.received_bytes >= (FRAMES - 1) * raw_bytes(SIZE[1], SIZE[0], 16)


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_cloud_sources_colour_reaches_the_output_as_a_local_files_does(deep, tmp_path, name):
    """Written by the encoder the input's codec has (x265, x264), as the client writes a local file."""
    server, media, _ = deep
    outputs = {}
    for where, src in (("cloud", f"cloud:{name}"), ("local", media / name)):
        outputs[where] = tmp_path / f"{where}{media.joinpath(name).suffix}"
        with Client(cloud=server.inference_url, edge=server.inference_url, codec=wire.FRAMES_CODEC) as client:
            client.interpolate_clip(src, outputs[where], seed=5, chunk=3, inflight=1, progress=False)
    source = stated(media / name)
    made = SOURCES[name][2]  # the clip states what it was made with; a location left unstated is
    assert source[0] == (made if made.chroma else replace(made, chroma=1))  # H.264's default, left
    assert stated(outputs["cloud"]) == stated(outputs["local"]) == source

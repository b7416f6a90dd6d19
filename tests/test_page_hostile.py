"""``eden-serve page`` as an attacker sees it (issue 39), against real page processes and, for the
login, a real headless chromium (harness/browser.py), all always stopped:

- ``cloud:`` names are opened as the cloud opens them: playlists, concatenation lists (through a
  link out of the root, or naming a FIFO) and text get 400, frames over ``--max-pixels`` 413 for
  information and playback alike, and nothing outside the media root is opened (harness/hostile's
  page catalogue, with the page's other classes: its login and its bounds);
- a server on another port of 127.0.0.1 gets neither the token nor the page's media, in the
  browser that holds the page's login; a URL the page signed serves the page itself only;
- a non-loopback ``--host`` needs ``--allow-cleartext``; ``page --help`` describes the command;
- uploads and finished runs are bounded.
"""

from __future__ import annotations

import http.server
import json
import os
import time
from pathlib import Path

import anyio
import pytest
import requests
from PIL import Image
from test_page import SCENE_CUT, TINY, cli, error_line, make_mp4
from websockets.sync.client import connect

from eden_serve.page import runs, uploads
from eden_serve.page.guard import Signer
from harness.browser import chromium, page_server, until
from harness.hostile import OpenWatch, PageTarget, media_root, page_catalogue, page_options, recording_server
from harness.servers import loopback_http

NOWHERE = "http://127.0.0.1:9"  # a cloud and an edge the page never reaches: these requests are its own


@pytest.fixture(scope="module")
def hostile_root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    with recording_server() as (url, fetched):
        root = media_root(folder, url)
        watch = OpenWatch(folder / "outside.mp4")
        yield folder, root, watch, fetched
        watch.close()


def test_each_hostile_request_to_the_page_gets_its_documented_answer(hostile_root):
    folder, root, watch, fetched = hostile_root
    with page_server(*page_options(NOWHERE, "unused", root, folder / "page")) as page:
        target = PageTarget(page.origin, page.token, folder / "page")
        answers = {hostile.name: answer(hostile, target) for hostile in page_catalogue(root)}
        assert {name: got for name, got in answers.items() if got != expected(name, root)} == {}
        assert requests.get(f"{page.origin}/sources", headers={"Authorization": f"Bearer {page.token}"}, timeout=30).ok
    assert watch.count() == 0 and fetched == []
    assert not any(line for line in page.output if "Traceback" in line or "RecursionError" in line), page.output


def test_the_source_list_leaves_out_links_that_lead_out_of_the_root_or_nowhere(tmp_path):
    """Names the cloud would refuse (403, 404) are not offered to pick."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    for path in (tmp_path / "outside.mp4", root / "inside.mp4", root / "sub" / "deeper.mkv"):
        path.write_bytes(b"\0" * 16)
    (root / "escape.mp4").symlink_to(tmp_path / "outside.mp4")
    (root / "dangling.mkv").symlink_to(tmp_path / "none.mkv")
    (root / "alias.mp4").symlink_to("inside.mp4")
    (root / "sub" / "up.mp4").symlink_to("../inside.mp4")
    assert uploads.list_sources(root) == ["alias.mp4", "inside.mp4", "sub/deeper.mkv", "sub/up.mp4"]


def test_the_source_list_through_the_page_leaves_out_hidden_names_and_names_no_request_can_carry(tmp_path):
    """A file named in another encoding than UTF-8 made the whole /sources a 500 (the JSON could
    not be encoded); hidden names (an output being written into the root, .NAME.partial-…, and
    whatever a hidden folder holds) were offered; a loop of links is not walked."""
    root = tmp_path / "root"
    (root / ".hidden").mkdir(parents=True)
    for name in ("video.mp4", ".video.partial-1a2b.mp4", ".hidden/inside.mp4", "été.mkv"):
        (root / name).write_bytes(b"\0" * 16)
    with open(os.path.join(os.fsencode(root), b"latin-1 \xe9t\xe9.mp4"), "wb") as file:
        file.write(b"\0" * 16)
    (root / "loop").symlink_to(root, target_is_directory=True)
    with page_server(*page_options(NOWHERE, "unused", root, tmp_path / "page")) as page:
        listed = requests.get(f"{page.origin}/sources", headers={"Authorization": f"Bearer {page.token}"}, timeout=30)
    assert listed.status_code == 200 and listed.json() == {"sources": ["video.mp4", "été.mkv"]}, listed.text
    assert not any("Traceback" in line for line in page.output), page.output


def answer(hostile, target: PageTarget) -> tuple:
    try:
        return hostile.send(target)
    except Exception as exc:  # noqa: BLE001 - no answer (a read that hung, a connection closed) is a mismatch too
        return type(exc).__name__, None


def expected(name: str, root: Path) -> tuple:
    return next(hostile.expected for hostile in page_catalogue(root) if hostile.name == name)


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    with page_server(*TINY, "--work-dir", str(tmp_path_factory.mktemp("work"))) as running:
        yield running


def finished_run(page, folder: Path) -> str:
    """A run of the scene-cut clip through the page's own API: its id once it is done."""
    bearer = {"Authorization": f"Bearer {page.token}"}
    clip = make_mp4(folder / "cut.mp4")
    upload = requests.post(f"{page.origin}/uploads", data=clip.read_bytes(), headers=bearer, timeout=60).json()
    with connect(page.origin.replace("http://", "ws://") + "/live", origin=page.origin, additional_headers=bearer) as socket:
        socket.recv(timeout=30)
        socket.send(json.dumps({"type": "start", "clip": {"upload": upload["id"]}, "options": {"vcodec": "ffv1"}}))
        while (run := json.loads(socket.recv(timeout=300))).get("state") not in ("done", "failed", "cancelled"):
            pass
    assert run["state"] == "done", run
    return run["id"]


class Foreign(http.server.BaseHTTPRequestHandler):
    """Another local server: it records every request it gets and serves :attr:`page` at ``/``."""

    page = ""
    seen: list[str] = []

    def do_GET(self):
        self.seen.append(f"{self.path}\n{self.headers}")
        body = self.page.encode() if self.path == "/" else b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if self.path == "/" else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


# What a page of another server tries on this one, in a browser that holds its login: load its
# media, its preview and its live connection, and ask its own server with whatever the browser adds.
FOREIGN_PAGE = """<!doctype html><title>another server</title><body><script>
const results = {};
const load = (name, tag, src) => new Promise((done) => {
  const element = document.createElement(tag);
  element.muted = true;
  element.addEventListener(tag === "video" ? "loadedmetadata" : "load", () => done(results[name] = "loaded"));
  element.addEventListener("error", () => done(results[name] = "refused"));
  element.src = src;
  document.body.append(element);
});
const socket = () => new Promise((done) => {
  const ws = new WebSocket(%(live)s);
  ws.onopen = () => done(results.socket = "open");
  ws.onclose = () => done(results.socket = results.socket || "refused");
});
Promise.all([%(loads)s, socket(), fetch("/echo", { credentials: "include" })])
  .then(() => { document.title = JSON.stringify(results); });
</script></body>"""


def foreign_results(browser, url: str, origin: str, media: dict[str, tuple[str, str]]) -> dict:
    Foreign.page = FOREIGN_PAGE % {
        "live": json.dumps(origin.replace("http://", "ws://") + "/live"),
        "loads": ", ".join(f"load({json.dumps(name)}, {json.dumps(tag)}, {json.dumps(origin + path)})"
                           for name, (tag, path) in media.items())}
    tab = browser.new_page()
    try:
        tab.goto(url + "/")
        return json.loads(until(tab, "document.title.startsWith('{') && document.title", timeout=60))
    finally:
        tab.close()


def test_another_port_of_this_host_gets_neither_the_token_nor_the_media(in_process, tmp_path):
    run = finished_run(in_process, tmp_path)
    Foreign.seen = []
    with chromium() as browser, loopback_http(Foreign) as foreign:
        page = browser.new_page()
        page.goto(in_process.url)  # the user's login, in this browser
        until(page, "document.body.dataset.ready === 'true'")
        got = foreign_results(browser, foreign, in_process.origin, {
            "result": ("video", f"/runs/{run}/play"), "download": ("video", f"/runs/{run}/result"),
            "preview": ("img", f"/runs/{run}/preview.png")})
    assert got == {"result": "refused", "download": "refused", "preview": "refused", "socket": "refused"}
    assert len(Foreign.seen) >= 2 and not any(in_process.token in request for request in Foreign.seen), Foreign.seen


def test_a_signed_url_serves_the_page_itself_only(in_process, tmp_path):
    run = finished_run(in_process, tmp_path)
    bearer = {"Authorization": f"Bearer {in_process.token}"}
    signed = requests.get(f"{in_process.origin}/sign", params={"path": f"/runs/{run}/play"}, headers=bearer, timeout=30).json()["url"]
    assert requests.get(in_process.origin + signed, timeout=30).status_code == 200  # no token: the signature is enough
    for refused in (signed.replace(f"/runs/{run}/play", "/runs"), signed[:-1] + ("0" if signed[-1] != "0" else "1")):
        assert requests.get(in_process.origin + refused, timeout=30).status_code == 403
    with chromium() as browser, loopback_http(Foreign) as foreign:
        page = browser.new_page()
        page.goto(in_process.url)
        until(page, "document.body.dataset.ready === 'true'")
        page.evaluate("(src) => { const v = document.getElementById('result'); v.src = src; }", signed)
        until(page, "document.getElementById('result').readyState >= 1")  # the page itself loads it
        got = foreign_results(browser, foreign, in_process.origin, {"signed": ("video", signed)})
    assert got == {"signed": "refused", "socket": "refused"}  # the same URL, from another port: Sec-Fetch-Site


def test_a_non_loopback_host_needs_allow_cleartext_and_help_describes_the_command():
    refused = cli("page", "--host", "192.0.2.1", *TINY)  # TEST-NET-1: refused before it is bound
    assert refused.returncode == 2 and "--allow-cleartext" in error_line(refused)
    allowed = cli("page", "--host", "192.0.2.1", "--allow-cleartext", *TINY)  # past that check, to the bind
    assert allowed.returncode == 2 and "cannot listen on 192.0.2.1" in error_line(allowed)
    helped = cli("page", "--help")
    head = helped.stdout.split("\noptions:")[0]
    assert [part for part in head.split("\n\n") if part.strip() and not part.startswith("usage:")], helped.stdout


def gif(path: Path, frames: int = 2) -> bytes:
    images = [Image.open(p).convert("RGB").quantize(16) for p in SCENE_CUT[:frames]]
    images[0].save(path, save_all=True, append_images=images[1:], duration=80, loop=0)
    return path.read_bytes()


def test_uploads_are_bounded_by_count_and_bytes_and_the_oldest_unused_go_first(tmp_path):
    clip = gif(tmp_path / "clip.gif")
    kept = uploads.Uploads(tmp_path / "uploads", max_bytes=4 * len(clip), max_pixels=None,
                           in_use=lambda path: path == first.path)

    async def receive():
        return await kept.receive(iter_bytes(clip), len(clip), "clip.gif")

    first = anyio.run(receive)
    made = [anyio.run(receive) for _ in range(uploads.UPLOADS_KEPT + 3)]
    # Within 2 x max_bytes, the newest 7 beside the first, which a run uses.
    assert list(kept.items) == [first.id, *[u.id for u in made[-7:]]]
    assert sorted(p.name for p in (tmp_path / "uploads").iterdir()) == sorted(u.path.name for u in kept.items.values())


async def iter_bytes(data: bytes):
    yield data


def test_finished_runs_are_pruned_those_of_closed_pages_first(tmp_path):
    runner = runs.Runner(lambda run: "")
    made = []
    try:
        for k in range(runs.RUNS_KEPT + 4):
            (tmp_path / f"run{k}").mkdir()
            (tmp_path / f"run{k}" / "result.mkv").write_bytes(b"x")
            made.append(runs.Run(f"{k:016x}", None, "clip", tmp_path / f"run{k}" / "result.mkv", None))
            made[-1].page_open = k != 5
        for run in made:
            runner.submit(run)
        deadline = time.monotonic() + 30
        while runner.waiting or any(run.state not in runs.FINISHED for run in made):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        runner.stop()
    gone = {5, 0, 1, 2}  # the closed page's first, then the oldest
    assert set(runner.runs) == {run.key for k, run in enumerate(made) if k not in gone}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"run{k}" for k in range(len(made)) if k not in gone)


def test_a_signed_url_is_good_for_its_path_and_its_minutes_only():
    signer = Signer(lifetime=300)
    url = signer.sign("/sources/play?name=a%20b.mp4", now=1000)
    path, query = url.split("?", 1)
    assert signer.check(path, query, now=1000) and signer.check(path, query, now=1299)
    assert not signer.check(path, query, now=1300)  # expired
    assert not signer.check("/sources/play", query.replace("a%20b", "c"), now=1000)  # another source
    assert not Signer(lifetime=300).check(path, query, now=1000)  # another page's key
    later = signer.sign("/runs/0123456789abcdef/play", now=10**9)  # signed far ahead: refused now
    assert not signer.check(*later.split("?", 1), now=1000)

"""Real TorchServe (tiny model) against requests an attacker or a careless operator would send
(issue 12): each must get its documented 4xx, fetch nothing, keep nothing alive and kill no worker."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from PIL import Image

from eden_serve import wire
from eden_serve.config import preset
from eden_serve.model import synthetic
from eden_serve.serving.launcher import BASE_CONFIG, read_properties
from harness.hostile import recording_server
from harness.servers import torchserve


pytestmark = pytest.mark.serving

TIMEOUT = 120


@pytest.fixture
def web_server():
    """An HTTP server on loopback that records every request it gets (and serves nothing)."""
    with recording_server() as (url, seen):
        yield url, seen


def register(server, url: str) -> requests.Response:
    return requests.post(f"{server.management_url}/workflows", params={"url": url}, headers=server.management_headers,
                         timeout=TIMEOUT)


def test_workflows_register_only_from_the_model_store(server, store, web_server, tmp_path):
    """The management key must not be a key to run code from elsewhere: no URL is fetched, no file
    outside the store is copied in; eden.war, in the store, registered when the server started."""
    base, seen = web_server
    outside = tmp_path / "other.war"
    shutil.copy(store / "eden.war", outside)
    before = sorted(p.name for p in store.iterdir())
    for url in (f"{base}/other.war", f"HTTP://127.0.0.1:{base.rsplit(':', 1)[1]}/other.war", outside.as_uri()):
        response = register(server, url)
        assert response.status_code == 404 and "does not match any allowed URL" in response.json()["message"], response.text
    assert seen == []
    assert sorted(p.name for p in store.iterdir()) == before
    listed = requests.get(f"{server.management_url}/workflows", headers=server.management_headers, timeout=TIMEOUT)
    assert [w["workflowName"] for w in listed.json()["workflows"]] == ["eden"]


# --- refused requests keep nothing -----------------------------------------------------------------

MiB = 1 << 20
# Headroom for what a worker legitimately keeps after its first requests (allocator arenas, caches);
# what a refused request must not keep is its body: 16 bodies of 50 MiB would be 800 MiB.
RSS_MARGIN = 300 * MiB


def rss(pid: int) -> int:
    """Resident bytes of a worker process (its pid from the management API)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def edge(server, body, content_type: str = "application/octet-stream") -> requests.Response:
    headers = {**server.inference_headers, "Content-Type": content_type}
    return requests.post(f"{server.inference_url}/predictions/eden_ditdec", data=body, headers=headers, timeout=TIMEOUT)


def encoder(server, fields: dict) -> requests.Response:
    files = {k: (k, v, "image/png") if isinstance(v, bytes) else (None, str(v)) for k, v in fields.items()}
    return requests.post(f"{server.inference_url}/predictions/eden_encoder", files=files, headers=server.inference_headers,
                         timeout=TIMEOUT)


def png(height: int, width: int, value: int = 0) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (value, value, value)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_refused_payloads_do_not_stay_in_the_edge_worker(server):
    (pid,) = server.worker_pids("eden_ditdec")
    start = rss(pid)
    # A payload whose digest does not match: refused after the worker has read and hashed it.
    body = wire.MAGIC + wire.FORMAT_VERSION.to_bytes(2, "little") + bytes(2) + (16).to_bytes(4, "little") + bytes(50 * MiB)
    for _ in range(16):
        response = edge(server, body)
        assert response.status_code == 400 and response.json()["type"] == "bad_payload", response.text
    assert server.worker_pids("eden_ditdec") == [pid]
    assert rss(pid) - start < RSS_MARGIN


def test_refused_4k_pairs_do_not_stay_in_the_encoder_worker(server):
    (pid,) = server.worker_pids("eden_encoder")
    start = rss(pid)
    # Two 4K frames of different heights: both are decoded (200 MB of float pixels) before the refusal.
    fields = {"frame0": png(2160, 3840), "frame1": png(2144, 3840)}
    for _ in range(8):
        response = encoder(server, fields)
        assert response.status_code == 400 and "differ in size" in response.json()["message"], response.text
    assert server.worker_pids("eden_encoder") == [pid]
    assert rss(pid) - start < RSS_MARGIN


def test_a_4k_chunk_is_refused_from_its_headers(server):
    """17 frames that declare 4K and hold no pixels: judged from their headers (413 for the chunk's
    tokens; 400 for frames of two sizes), never decoded, which would find them unreadable; the
    worker keeps nothing."""
    (pid,) = server.worker_pids("eden_encoder")
    start = rss(pid)
    header = synthetic.image_header("PNG", 3840, 2160)
    for _ in range(4):
        response = encoder(server, {f"frame{i}": header for i in range(17)})
        assert response.status_code == 413 and response.json()["type"] == "chunk_too_large", response.text
        response = encoder(server, {**{f"frame{i}": header for i in range(16)}, "frame16": png(48, 64)})
        assert response.status_code == 400 and "frame0 is 3840x2160, frame16 is 64x48" in response.json()["message"], response.text
    assert server.worker_pids("eden_encoder") == [pid]
    assert rss(pid) - start < RSS_MARGIN


def test_a_body_over_the_request_limit_is_refused_by_its_length(server, tmp_path):
    """TorchServe's own 413, with an empty body (README "Capacity"); before, the limit was 480 MiB."""
    limit = int(read_properties(BASE_CONFIG)["max_request_size"])
    assert limit == 200 * MiB
    body = tmp_path / "body"
    with open(body, "wb") as sparse:
        sparse.truncate(limit + 1)
    with open(body, "rb") as stream:
        response = edge(server, stream)
    assert (response.status_code, response.content) == (413, b"")


# --- bodies that look like JSON --------------------------------------------------------------------


def peak_growth(pid: int, send) -> int:
    """How far ``send()`` pushes the worker's resident memory above where it was, at its peak."""
    start = rss(pid)
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM, the peak, to the current resident size
    send()
    with open(f"/proc/{pid}/status") as status:
        peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    return peak - start


def test_a_large_json_body_costs_no_more_than_any_body(server):
    """An 80 MiB error document is no encoder's: refused unparsed (before: parsed, echoed back with
    its status, 26 s and +320 MB at the peak), as any other 80 MiB of junk."""
    (pid,) = server.worker_pids("eden_ditdec")
    document = json.dumps({"code": 400, "type": "bad_input", "message": "x" * (80 * MiB)}).encode()

    def refused(body, content_type):
        response = edge(server, body, content_type)
        assert (response.status_code, response.json()["type"]) == (400, "bad_payload"), response.text[:300]

    # Holding a body costs about its size once, less where the worker's heap kept room from an earlier
    # request (glibc keeps up to 64 MiB of freed heap resident), more while the worker's receive buffer
    # grows (it appends what each recv returns: 1.55 times the body was seen, unparsed); parsing the
    # document cost four times its size. One body above the larger of junk and the body tells them
    # apart whatever the heap held before.
    junk = peak_growth(pid, lambda: refused(b"J" * len(document), "application/octet-stream"))
    for content_type in ("application/octet-stream", "application/json"):
        bound = max(junk, len(document)) + len(document)
        assert peak_growth(pid, lambda: refused(document, content_type)) < bound, content_type
    assert server.worker_pids("eden_ditdec") == [pid]


@pytest.mark.parametrize("content_type", ["application/octet-stream", "application/json"])
def test_deeply_nested_json_is_a_bad_payload(server, content_type):
    for body in (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, b"[" * 100_000 + b"]" * 100_000):
        response = edge(server, body, content_type)
        assert (response.status_code, response.json()["type"]) == (400, "bad_payload"), response.text


@pytest.mark.parametrize("code, kind", [(599, "x"), (503, "unavailable"), (500, "internal_error"), (200, "ok")])
def test_the_edge_echoes_no_document_but_an_encoders(server, code, kind):
    """Before: any {code, type, message} came back with its own status, so anyone could make the
    edge answer 599, or 503 (clients retry it)."""
    response = edge(server, json.dumps({"code": code, "type": kind, "message": "m"}))
    assert (response.status_code, response.json()["type"]) == (400, "bad_payload"), response.text


FORM = "application/x-www-form-urlencoded"


def test_a_urlencoded_body_is_refused_and_the_workers_live_on(server):
    """curl -d and --data-binary send a body as a urlencoded form unless told otherwise. TorchServe's
    frontend parses such a form before any handler: one it cannot parse (a % not followed by two hex
    digits, a CR without LF: any binary body, nearly) is its own 500, which no handler can change;
    one it can reaches the handler as fields. Before: the edge called those fields an "empty request"."""
    pids = server.worker_pids("eden_encoder"), server.worker_pids("eden_ditdec")
    response = edge(server, b"frame0=a&frame1=b", FORM)
    assert (response.status_code, response.json()["type"]) == (400, "bad_input"), response.text
    assert "form field" in response.json()["message"] and "application/octet-stream" in response.json()["message"]
    for body in (b"a=%zz", b"%zz=1", tiny_payload() + b"&a=%zz"):  # TorchServe's own 500: documented in docs/serving.md
        for refused in (edge(server, body, FORM), requests.post(
                f"{server.inference_url}/predictions/eden_encoder", data=body,
                headers={**server.inference_headers, "Content-Type": FORM}, timeout=TIMEOUT)):
            assert refused.status_code == 500 and refused.json()["type"] == "ErrorDataDecoderException", refused.text
    # A form whose fields are percent-encoded is read as any form: the encoder takes its frames.
    form = urllib.parse.urlencode({"frame0": png(64, 96, 10), "frame1": png(64, 96, 40)})
    response = requests.post(f"{server.inference_url}/predictions/eden_encoder", data=form,
                             headers={**server.inference_headers, "Content-Type": FORM}, timeout=TIMEOUT)
    assert response.status_code == 200 and response.content.startswith(wire.MAGIC), response.text[:300]
    assert edge(server, response.content).content.startswith(b"\x89PNG")
    assert (server.worker_pids("eden_encoder"), server.worker_pids("eden_ditdec")) == pids


# --- the configuration, from anywhere --------------------------------------------------------------


def tiny_payload(size: tuple[int, int] = (64, 96)) -> bytes:
    config = preset("tiny")
    return wire.encode(synthetic.chunk(config, size), config)


def test_the_configuration_works_from_any_directory(store):
    """config.properties as written (only its addresses moved to free ports), run from a directory
    that is not the repository's, with an absolute --model-store. Before: handlers/metrics.yaml was
    looked for there, the workers crash-looped and requests hung; model_store/ was the workflow store."""
    with torchserve(store, models=["eden_ditdec.mar"], workflows=["eden.war"], token_auth=False, as_written=True,
                    startup_timeout=120) as server:
        assert not (server.workdir / "handlers").exists()
        assert edge(server, tiny_payload()).content.startswith(b"\x89PNG")
        metrics = requests.get(f"{server.metrics_url}/metrics", timeout=TIMEOUT).text
        assert 'EdenDenoiseMs{ModelName="eden_ditdec",Level="Model"' in metrics


# --- the workflow under load -----------------------------------------------------------------------

# What a workflow node waits at most when eden.yaml sets no timeout-ms: TorchServe 0.12's default
# (WorkFlow.timeOutMs, read with javap), counted from when the node's job is queued, then tried once more.
DEFAULT_NODE_TIMEOUT_S = 10


def test_a_workflow_request_outlasts_the_default_node_timeout(server):
    """The workflow's edge worker is held up (stopped with SIGSTOP while it holds a request) for
    longer than the default node timeout, twice over, while a workflow request waits in its queue.
    The request must still get its frame once the worker goes on (before: a 500 after 2 x 10 s)."""
    (pid,) = server.worker_pids("eden__eden_ditdec")
    fields = {"frame0": png(64, 96, 10), "frame1": png(64, 96, 40)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        os.kill(pid, signal.SIGSTOP)
        try:
            held = pool.submit(requests.post, f"{server.inference_url}/predictions/eden__eden_ditdec", data=tiny_payload(),
                               headers={**server.inference_headers, "Content-Type": "application/octet-stream"}, timeout=TIMEOUT)
            time.sleep(1)  # the held request reaches the worker first; the workflow's edge job queues behind it
            queued = pool.submit(requests.post, f"{server.inference_url}/wfpredict/eden", headers=server.inference_headers,
                                 files={k: (k, v, "image/png") for k, v in fields.items()}, timeout=TIMEOUT)
            time.sleep(2.5 * DEFAULT_NODE_TIMEOUT_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert held.result().status_code == 200
        response = queued.result()
    assert response.status_code == 200 and response.content.startswith(b"\x89PNG"), response.text[:300]
    assert server.worker_pids("eden__eden_ditdec") == [pid]

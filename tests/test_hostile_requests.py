"""Real TorchServe (tiny model) against requests an attacker or a careless operator would send
(issue 12): each must get its documented 4xx, fetch nothing, keep nothing alive and kill no worker."""

from __future__ import annotations

import http.server
import shutil
import threading

import pytest
import requests

from eden_serve.serving.launcher import build_archives, torchserve

pytestmark = pytest.mark.serving

TIMEOUT = 120


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_archives(tmp_path_factory.mktemp("model_store"), config="tiny")


@pytest.fixture(scope="module")
def server(store):
    with torchserve(store, models=["eden_encoder.mar", "eden_ditdec.mar"], workflows=["eden.war"]) as s:
        yield s


@pytest.fixture
def web_server():
    """An HTTP server on loopback that records every request it gets (and serves nothing)."""
    seen = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()


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

"""The client's transports against a real TorchServe with both halves (tiny model): the edge's
streamed answers, HTTP against gRPC, refusals over gRPC; with servers of our own, a stream cut short
asked again only for what did not arrive, and chunks taken in their order by the cloud, the link and
the edge; and the stages' order on their own."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import io
import re
import threading
import time
import zipfile

import numpy as np
import pytest
import requests
from PIL import Image

from conftest import loopback_http
from eden_serve.client import DECODER, ENCODER, Client, _Chunk, transport_for
from eden_serve.client.transports import TRANSPORTS, Stage, Transport, Transports
from eden_serve.client.transports.grpc import GrpcTransport
from eden_serve.client.transports.grpc import target as grpc_target
from eden_serve.client.transports.http import HttpTransport
from eden_serve.client.tls import ClientTLS
from eden_serve.clips.workers import Arrivals
from eden_serve.commands.cli import main
from eden_serve.commands.shared import add_deployment_arguments
from eden_serve.errors import BadInputError, ServerError, UnavailableError
from eden_serve.media import Frame
from eden_serve.media.frames import png_bytes
from eden_serve.model import synthetic
from eden_serve.wire.answers import END, MIDDLE, STREAMED, record
from harness.rounding import assert_within_rounding

pytestmark = pytest.mark.serving

SIZE = (96, 64)  # width, height
FRAMES = 7


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip")
    for i, frame in enumerate(synthetic.clip(FRAMES, SIZE[1], SIZE[0])):
        frame.save(folder / f"{i:02d}.png")
    return folder


def payload_of(server, clip, frames: int) -> bytes:
    files = {f"frame{i}": path.read_bytes() for i, path in enumerate(sorted(clip.iterdir())[:frames])}
    response = requests.post(f"{server.inference_url}/predictions/{ENCODER}", files=files, data={"seed": "3"},
                             headers=server.inference_headers, timeout=120)
    assert response.status_code == 200, response.text
    return response.content


def edge_answer(server, payload: bytes, headers: dict | None = None) -> requests.Response:
    return requests.post(f"{server.inference_url}/predictions/{DECODER}", data=payload, timeout=120,
                         headers={**server.inference_headers, "Content-Type": "application/octet-stream", **(headers or {})})


def records(content: bytes) -> list[tuple[bytes, int, bytes]]:
    out = []
    while content:
        kind, index, length = content[0:1], int.from_bytes(content[1:5], "big"), int.from_bytes(content[5:9], "big")
        out.append((kind, index, content[9:9 + length]))
        content = content[9 + length:]
    return out


def test_streamed_chunk_answers_equal_whole_ones(server, clip):
    payload = payload_of(server, clip, 6)  # 5 pairs
    whole = edge_answer(server, payload)
    assert whole.headers["Content-Type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(whole.content)) as archive:
        pngs = [archive.read(f"{j:03d}.png") for j in range(5)]
    streamed = edge_answer(server, payload, {"X-Eden-Stream": "http"})
    assert streamed.headers["Content-Type"] == STREAMED and streamed.headers.get("Transfer-Encoding") == "chunked"
    assert records(streamed.content) == [(MIDDLE, j, png) for j, png in enumerate(pngs)] + [(END, 0, b"")]
    # From the fourth pair on, the edge computes two pairs where it computed five: another batch shape,
    # whose sums may run in another order (on AVX2 they did), so the middles hold the documented bound.
    later = records(edge_answer(server, payload, {"X-Eden-Stream": "http", "X-Eden-First": "3"}).content)
    assert [(kind, j) for kind, j, _ in later] == [(MIDDLE, 3), (MIDDLE, 4), (END, 0)]
    for (_, j, png), want in zip(later, pngs[3:]):
        assert_within_rounding(pixels(png), pixels(want), f"middle {j}")
    tail = edge_answer(server, payload, {"X-Eden-First": "3"})  # not streamed: a zip of the two
    with zipfile.ZipFile(io.BytesIO(tail.content)) as archive:
        assert len(archive.namelist()) == 2
        for name, want in zip(archive.namelist(), pngs[3:]):
            assert_within_rounding(pixels(archive.read(name)), pixels(want), name)


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)))


def test_a_stream_refused_before_its_first_middle_is_a_4xx(server, clip):
    refused = edge_answer(server, b"not a payload", {"X-Eden-Stream": "http"})
    assert refused.status_code == 400 and refused.json()["type"] == "bad_payload"
    beyond = edge_answer(server, payload_of(server, clip, 3), {"X-Eden-Stream": "http", "X-Eden-First": "3"})
    assert beyond.status_code == 400 and "first is 3" in beyond.json()["message"]


def test_a_stream_asked_from_past_its_last_middle_is_the_end_record_alone(server, clip):
    """A client that holds every middle of the chunk and asks again (clients before issue 32 did,
    when a worker died before the end record) gets the end, not a refusal (docs/streaming.md)."""
    payload = payload_of(server, clip, 3)
    streamed = edge_answer(server, payload, {"X-Eden-Stream": "http", "X-Eden-First": "2"})
    assert (streamed.status_code, streamed.headers["Content-Type"], streamed.content) == (200, STREAMED, record(END, 0))
    whole = edge_answer(server, payload, {"X-Eden-First": "2"})
    assert whole.status_code == 400 and "first is 2" in whole.json()["message"]


def client(server, transport: str, **options) -> Client:
    url = server.grpc_url if transport == "grpc" else server.inference_url
    return Client(cloud=url, edge=url, token=server.keys["inference"], transport=transport, **options)


def frames_of(folder) -> list[np.ndarray]:
    return [np.asarray(Image.open(p)) for p in sorted(folder.iterdir())]


def test_the_grpc_client_equals_the_http_client_frame_for_frame(server, clip, tmp_path):
    summaries = {}
    for transport in ("http", "grpc"):
        with client(server, transport) as c:
            # One request at the edge at a time: the same batches, so the same arithmetic, bit for bit.
            summaries[transport] = c.interpolate_clip(clip, tmp_path / transport, chunk=4, inflight=1, progress=False)
    assert summaries["grpc"].pairs == summaries["http"].pairs == FRAMES - 1
    assert summaries["grpc"].payload_bytes == summaries["http"].payload_bytes
    http, grpc = frames_of(tmp_path / "http"), frames_of(tmp_path / "grpc")
    assert len(http) == len(grpc) == 2 * FRAMES - 1
    assert all(np.array_equal(a, b) for a, b in zip(http, grpc))


def test_a_grpc_edge_refusal_ends_its_stream(server, clip):
    with client(server, "grpc", tries=1, timeout=60) as c:
        with pytest.raises(ServerError) as info:
            c.transport.ask_edge(b"not a payload", 0, 1, SIZE, lambda j, image: None)
    assert info.value.status == 400 and info.value.kind == "bad_payload"


def worker_pids(server, model: str) -> list[int]:
    described = requests.get(f"{server.management_url}/models/{model}", headers=server.management_headers, timeout=30)
    return sorted(worker["pid"] for worker in described.json()[0]["workers"])


def stream_predictions(server, model: str, inputs: dict[str, bytes]) -> list[bytes]:
    """The messages of a gRPC StreamPredictions call with these inputs, made as any gRPC client would."""
    transport = GrpcTransport(None, server.grpc_url, server.grpc_url, {"encoder": server.keys["inference"],
                                                                        "decoder": server.keys["inference"]}, 60, ClientTLS())
    try:
        call = transport.calls["decoder"]  # StreamPredictions
        request = transport.messages.PredictionsRequest(model_name=model, input=inputs)
        return [message.prediction for message in call(request, metadata=transport.metadata["decoder"], timeout=60)]
    finally:
        transport.close()


@pytest.mark.parametrize("model, kind", [(DECODER, "payload"), (DECODER, "junk"), (ENCODER, "frames")])
def test_a_grpc_stream_call_that_asks_no_stream_gets_its_whole_answer_and_kills_no_worker(server, clip, model, kind):
    """Before, the answer lacked the header that ends a StreamPredictions call: TorchServe's frontend
    failed the worker on it (a NullPointerException), which was restarted, its batch lost."""
    paths = sorted(clip.iterdir())
    inputs = {"payload": lambda: {"body": payload_of(server, clip, 2)}, "junk": lambda: {"body": b"not a payload"},
              "frames": lambda: {"frame0": paths[0].read_bytes(), "frame1": paths[1].read_bytes()}}[kind]()
    before = worker_pids(server, model)
    messages = stream_predictions(server, model, inputs)
    assert len(messages) == 1
    expected = {"payload": b"\x89PNG", "junk": b'{"code": 400, "type": "bad_payload"', "frames": b"EDENWIRE"}[kind]
    assert messages[0].startswith(expected)
    assert worker_pids(server, model) == before


def test_an_http_request_that_asks_for_a_grpc_stream_is_answered_over_http(server, clip):
    """Before, its refusal carried the header that ends a gRPC call, and over HTTP its status line
    was never sent: the request hung."""
    refused = edge_answer(server, b"not a payload", {"X-Eden-Stream": "grpc"})
    assert refused.status_code == 400 and refused.json()["type"] == "bad_payload"
    streamed = edge_answer(server, payload_of(server, clip, 3), {"X-Eden-Stream": "grpc"})
    assert streamed.headers["Content-Type"] == STREAMED
    assert [(kind, index) for kind, index, _ in records(streamed.content)] == [(MIDDLE, 0), (MIDDLE, 1), (END, 0)]


def one_line_and_exit_2(capsys, *argv) -> str:
    code = main(["client", *map(str, argv)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("eden-serve: error: "), err
    return err


def test_bad_input_over_grpc_is_one_line_and_exit_2(server, clip, tmp_path, capsys):
    frame0 = sorted(clip.iterdir())[0]
    (tmp_path / "bad.png").write_bytes(b"not an image")
    token = ["--token", server.keys["inference"]]
    out = tmp_path / "middle.png"
    err = one_line_and_exit_2(capsys, frame0, tmp_path / "bad.png", "-o", out, "--server", server.grpc_url,
                              "--transport", "grpc", *token)
    assert "frame1 is not a readable image" in err
    err = one_line_and_exit_2(capsys, frame0, frame0, "-o", out, "--server", server.grpc_url, "--transport", "grpc",
                              "--token", "wrong")
    assert "PERMISSION_DENIED" in err and "Token Authorization failed" in err
    err = one_line_and_exit_2(capsys, frame0, frame0, "-o", out, "--server", server.inference_url, "--transport", "grpc")
    assert "grpc:// or grpcs://" in err
    assert not out.exists()
    assert main(["client", str(frame0), str(frame0), "-o", str(out), "--server", server.grpc_url,
                 "--transport", "grpc", *token]) == 0
    assert Image.open(out).size == SIZE


def test_a_stream_cut_short_is_asked_again_for_what_did_not_arrive(tmp_path):
    """A server of our own: the encoder's answer is any payload; the edge sends two middles of
    four and drops the connection, then answers whatever it is asked from there."""
    middles = [png_bytes(Image.new("RGB", SIZE, (40 * j, 0, 0))) for j in range(4)]
    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            if self.path.endswith(ENCODER):
                self.send_response(200)
                self.send_header("Content-Length", "7")
                self.end_headers()
                self.wfile.write(b"payload")
                return
            first = int(self.headers["X-Eden-First"])
            asked.append(first)
            self.send_response(200)
            self.send_header("Content-Type", STREAMED)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            end = 2 if first == 0 else 4
            for part in [record(MIDDLE, j, middles[j]) for j in range(first, end)] + ([record(END, 0)] if end == 4 else []):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            if end == 4:
                self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True

        def log_message(self, *args):
            pass

    arrived = []
    with loopback_http(Handler) as url, Client(cloud=url, edge=url, backoff=0.01) as c:
        frames = [png_bytes(Image.new("RGB", SIZE)) for _ in range(5)]
        result = c._middles(_Chunk(frames, 0, SIZE), c._codec(_Chunk(frames, 0, SIZE)), arrived=lambda j, image: arrived.append(j))
    assert asked == [0, 2]
    assert arrived == [0, 1, 2, 3] and result.retries == 1
    assert [image.getpixel((0, 0))[0] for image in result.images] == [0, 40, 80, 120]



def test_the_split_client_takes_chunks_in_their_order_whatever_order_its_threads_ask_in(monkeypatch):
    """Four chunks queued 0, 1, 2, 3 whose threads ask in the order 3, 2, 1, 0 (as a first chunk's
    thread does when it is the one encoding the clip's first frames): the cloud is asked, the
    payloads read off the link and the edge asked in the chunks' order. One request per step, so
    that each record is made while its step's slot is held."""
    seen = {"cloud": [], "link": [], "edge": []}
    middle = record(MIDDLE, 0, png_bytes(Image.new("RGB", SIZE))) + record(END, 0)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path.endswith(ENCODER):
                answer, kind = b"payload %s" % re.search(rb'name="seed"\r\n\r\n(\d+)', body).group(1), "application/octet-stream"
            else:
                answer, kind = middle, STREAMED
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    encode, decode = HttpTransport.ask_cloud, HttpTransport.ask_edge

    def recording_encode(self, frames, form, first_byte=None, turn=None):
        seen["cloud"].append(int(form["seed"]))

        @contextlib.contextmanager
        def recorded_turn():
            with turn():
                seen["link"].append(int(form["seed"]))
                yield

        return encode(self, frames, form, first_byte, recorded_turn)

    def recording_decode(self, payload, *args):
        seen["edge"].append(int(payload.split()[1]))
        return decode(self, payload, *args)

    monkeypatch.setattr(HttpTransport, "ask_cloud", recording_encode)
    monkeypatch.setattr(HttpTransport, "ask_edge", recording_decode)
    frames = [Frame(i, str(i), image=Image.new("RGB", SIZE, (i, 0, 0))) for i in range(5)]
    with loopback_http(Handler) as url, Client(cloud=url, edge=url, backoff=0.01) as client:
        process = client.processor(inflight=1)
        for order in range(4):
            process.queued(order)
        threads = {k: threading.Thread(target=process, args=(k, frames[k : k + 2], k, Arrivals(1, k))) for k in range(4)}
        for k in (3, 2, 1):
            threads[k].start()
        time.sleep(0.3)  # chunks 3, 2 and 1 asking while chunk 0 has yet to
        threads[0].start()
        for thread in threads.values():
            thread.join(60)
    assert seen == {"cloud": [0, 1, 2, 3], "link": [0, 1, 2, 3], "edge": [0, 1, 2, 3]}


def entries(stage: Stage, orders: list[int | None], expected: list[int] = (), forgotten: list[int] = ()) -> list:
    """The order in which requests of ``orders``, asking in that order (each once the one before is
    waiting), enter ``stage``, one at a time; ``expected`` are announced first, ``forgotten`` withdrawn
    once all ask."""
    for order in expected:
        stage.expect(order)
    entered, lock, threads = [], threading.Lock(), []
    holding = threading.Event()

    def ask(order):
        with stage.slot(None, order):
            with lock:
                entered.append(order)
            holding.wait(0.05)

    for order in orders:
        threads.append(threading.Thread(target=ask, args=(order,)))
        threads[-1].start()
        # Each thread counted once, waiting or entered, before the next starts (the one in its slot
        # counted twice let the next start before this one asked, and overtake it on a busy machine).
        while len(stage._waiting) + len(entered) < len(threads) and threads[-1].is_alive():
            time.sleep(0.001)
    for order in forgotten:
        stage.forget(order)
    for thread in threads:
        thread.join(30)
    return entered


def test_a_stage_admits_announced_chunks_in_their_order():
    assert entries(Stage(1), [3, 2, 1, 0], expected=[0, 1, 2, 3]) == [0, 1, 2, 3]


def test_a_stage_waits_for_an_earlier_chunk_until_it_is_forgotten():
    """Chunk 0 never asks (it failed before this step): once it is forgotten, 1 and 2 go in order."""
    assert entries(Stage(1), [2, 1], expected=[0, 1, 2], forgotten=[0]) == [1, 2]


def test_a_stage_admits_unannounced_requests_as_they_ask():
    assert entries(Stage(1), [None, 5, None]) == [None, 5, None]


def test_a_stage_admits_up_to_its_limit_in_order():
    """Limit 2: the two earliest enter together; neither 2 nor 3 before them."""
    entered = entries(Stage(2), [3, 2, 1, 0], expected=[0, 1, 2, 3])
    assert set(entered[:2]) == {0, 1} and set(entered[2:]) == {2, 3}


def test_a_request_waiting_for_an_earlier_chunk_gives_up_when_cancelled():
    stage, cancel = Stage(1), threading.Event()
    stage.expect(0)
    stage.expect(1)
    cancel.set()
    with pytest.raises(UnavailableError, match="cancelled"):
        with stage.slot(cancel, 1):
            pass


def test_the_urls_scheme_picks_the_transport_unless_one_is_named():
    assert [transport_for(url) for url in ("http://a:8080", "https://a", "grpc://a:7070", "grpcs://a:7070")] == \
        [HttpTransport, HttpTransport, GrpcTransport, GrpcTransport]
    assert transport_for("ftp://a") is HttpTransport  # which then says what it takes
    assert transport_for("grpc://a:7070", "http") is HttpTransport and transport_for("http://a", "grpc") is GrpcTransport
    with pytest.raises(BadInputError, match="transport must be http or grpc, got 'ws'"):
        transport_for("http://a", "ws")
    with pytest.raises(BadInputError, match="must be an http:// or https:// URL"):
        Client("ftp://a")


@pytest.mark.parametrize("url, base", [("HTTP://a:8080/", "http://a:8080"), ("Https://a/eden/", "https://a/eden"),
                                       ("http://a:8080", "http://a:8080")])
def test_a_servers_url_is_the_base_of_its_paths_in_any_case(url, base):
    """Schemes are case-insensitive; HTTP:// was refused as not an http:// URL."""
    assert Client(url).transport.urls == {"workflow": f"{base}/wfpredict/eden"}


@pytest.mark.parametrize("url, address, secure", [("GRPC://127.0.0.1:7070", "127.0.0.1:7070", False),
                                                  ("Grpcs://a:7071/", "a:7071", True), ("GRPCS://a:7071", "a:7071", True)])
def test_a_grpc_url_is_read_in_any_case(url, address, secure):
    """Schemes are case-insensitive (RFC 3986); GRPC:// picked the gRPC transport, which then refused
    it as not a grpc:// URL."""
    assert transport_for(url) is GrpcTransport
    assert grpc_target(url, "--server") == (address, secure)
    client = Client(cloud=url, edge=url)
    try:
        assert isinstance(client.transport, GrpcTransport) and client.transport.urls == {"encoder": url, "decoder": url}
    finally:
        client.close()


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "grpc://127.0.0.1:7070"])
@pytest.mark.parametrize("token", ["✓", "abc…", "ab cd", "été"])
def test_a_token_no_header_carries_is_refused_in_one_line(url, token):
    """A pasted token with a character beyond Latin-1 failed the first request's header encoding:
    "internal error (UnicodeEncodeError)"."""
    with pytest.raises(BadInputError, match="outside visible ASCII"):
        Client(url, token=token)


@pytest.mark.parametrize("url", ["http://a:8080?x=1", "http://a:8080/#top", "http://a?", "http://[::1", "http:///path"])
def test_a_servers_url_with_a_query_fragment_or_no_host_is_refused(url):
    """A query landed before the paths: http://a:8080/?x=1/wfpredict/eden, a 405 from the server."""
    with pytest.raises(BadInputError, match="must be"):
        Client(url)


class LoopTransport(Transport):
    """A transport of a scheme of its own, answering the workflow in this process with grey middles:
    what another protocol brings to be mounted."""

    name, schemes, secure, workflow_api = "loop", ("loop", "loops"), ("loops",), True

    def __init__(self, server, cloud, edge, tokens, timeout, tls):
        self.reach({"workflow": server}, tokens)

    def workflow(self, frames, form, pairs, size):
        return [Image.new("RGB", size, (128, 128, 128))] * pairs, sum(map(len, frames)), 0


def test_another_transport_is_mounted_picked_by_its_scheme_and_offered_by_the_command(monkeypatch, recwarn):
    registry = Transports(HttpTransport, GrpcTransport)
    assert registry.mount(LoopTransport) is LoopTransport and registry.names == ["http", "grpc", "loop"]
    assert registry.for_url("loops://edge") is LoopTransport and registry.for_url("grpc://a:7070", "loop") is LoopTransport
    with pytest.raises(ValueError, match="already mounted: \\['loop'\\]"):
        registry.mount(type("Again", (LoopTransport,), {"name": "again", "schemes": ("loop",)}))
    monkeypatch.setitem(TRANSPORTS.by_name, "loop", LoopTransport)
    parser = argparse.ArgumentParser()
    add_deployment_arguments(parser)
    assert parser.parse_args(["--transport", "loop"]).transport == "loop"
    client = Client("loop://edge.example:9", token="secret")
    assert [str(w.message).split(", which")[0] for w in recwarn] == ["the token goes in clear to loop://edge.example:9"]
    assert isinstance(client.transport, LoopTransport) and client.transport.authorization == {"workflow": "Bearer secret"}
    middle = client.interpolate(Image.new("RGB", (48, 32)), Image.new("RGB", (48, 32)))
    assert middle.size == (48, 32) and middle.getpixel((0, 0)) == (128, 128, 128)

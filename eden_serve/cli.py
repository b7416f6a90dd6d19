"""The ``eden-serve`` command: interpolate, client, split-checkpoint, bench, download, archive, serve.

Every error the user can cause ends as one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
from PIL import Image

from . import archive, pipeline, synthetic, wire
from .atomic import save_image
from .bench import run_bench
from .checkpoint import load_official, load_pair, write_halves
from .client import DEFAULT_TIMEOUT, Client
from .clip_options import add_clip_arguments, clip_options, parse_size, refuse_clip_options, report
from .clips import Frame
from .cloud import SCENE_THRESHOLD, CloudEncoder
from .config import PRESETS, preset
from .edge import PRECISIONS, Acceleration, EdgeModel, default_precision
from .errors import BadInputError, EdenError
from .frames import DEFAULT_MAX_PIXELS, check_pair, load_frame, match_mode, to_uint8
from .hub import OFFICIAL_FILE, OFFICIAL_REPO, download
from .serving.launcher import BASE_CONFIG
from .serving.node import ARCHIVES, serve
from .serving.tls import ClientTLS
from .streaming import DEFAULT_CHUNK, DEFAULT_INFLIGHT
from .transports import TOKEN_ENV, read_token
from .wire.keyed import KEY_FILE_ENV

PROG = "eden-serve"
CHECKPOINT_REFERENCE = "hf://ORG/NAME/FILE[@REV]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


class DeviceFallbackWarning(UserWarning):
    """Two devices asked for, fewer visible: both halves run on one."""


def _device(name: str) -> str:
    """cpu, cuda, cuda:N or auto (the GPU where there is one) -> the device, checked to exist."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", name)
    if match is None:
        raise BadInputError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N, or CLOUD,EDGE such as cuda:0,cuda:1")
    if name == "cpu":
        return name
    if not torch.cuda.is_available():
        raise BadInputError(f"device {name} asked for, but CUDA is not available here; use --device cpu")
    if int(match.group(1) or 0) >= torch.cuda.device_count():
        raise BadInputError(f"device {name} asked for, but only {torch.cuda.device_count()} GPU(s) are visible")
    return name


def _devices(text: str) -> tuple[str, str]:
    """``--device``: one device for both halves, or ``CLOUD,EDGE``. Two GPUs asked for where fewer
    are visible run both halves on the first one, with a warning."""
    names = text.split(",")
    if len(names) == 1:
        return (_device(names[0]),) * 2
    if len(names) != 2:
        raise BadInputError(f"--device takes one device or two (CLOUD,EDGE), got {text!r}")
    gpus = [int(name.partition(":")[2] or 0) for name in names if name.startswith("cuda")]
    if gpus and torch.cuda.is_available() and max(gpus) >= torch.cuda.device_count():
        warnings.warn(f"--device {text}: only {torch.cuda.device_count()} GPU(s) visible; the cloud and the edge "
                      "both run on cuda:0", DeviceFallbackWarning, stacklevel=2)
        return "cuda:0", "cuda:0"
    cloud, edge = (_device(name) for name in names)
    return cloud, edge


def _threshold(text: str) -> float | None:
    if text == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 3:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 3] or off, got {text!r}")
    return value


def _threshold_text(text: str) -> str:
    _threshold(text)
    return text


def _model_options(parser: argparse.ArgumentParser, codec: str) -> None:
    parser.add_argument("--checkpoint", help=f"official eden.pt, a path or {CHECKPOINT_REFERENCE} (default: synthetic weights, not a real interpolation)")
    parser.add_argument("--config", choices=sorted(PRESETS), default="official", help="model dimensions (default: official)")
    parser.add_argument("--wire-codec", "--codec", dest="codec", default=codec,
                        help=f"cloud -> edge wire codec, not the video's (see --vcodec): {', '.join(wire.CODECS)}, or {wire.NO_WIRE}: "
                             f"the tensors handed from the cloud's device to the edge's in this process (default: {codec})")
    parser.add_argument("--precision", choices=PRECISIONS,
                        help="edge compute precision; auto: bf16 where the hardware runs it fast (default: auto on a GPU, fp32 on a CPU)")
    parser.add_argument("--device", default="auto",
                        help="auto (the GPU where there is one, else the CPU), cpu, cuda or cuda:N; or CLOUD,EDGE such as "
                             "cuda:0,cuda:1, the encoder on one and the DiT+decoder on the other (default: auto)")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="EDEN frame interpolation, split between a cloud encoder and an edge DiT+decoder.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = commands.add_parser("interpolate", help="middle frame of a pair, or every middle frame of a clip, in this process")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="FRAME0 FRAME1, or one clip: a directory of frames, a GIF/APNG/WebP or an MP4")
    p.add_argument("-o", "--output", required=True, help="output image (pair; format from the extension, e.g. .png) or clip of the input's kind")
    p.add_argument("--seed", type=int, default=0, help="noise seed (pair i of a clip uses seed + i; default 0)")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, help="refuse larger frames (default: 4K UHD)")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help=f"clip pairs per batch (default {DEFAULT_CHUNK})")
    p.add_argument("--scene-threshold", type=_threshold, default=SCENE_THRESHOLD,
                   help=f"scene-cut test: a pair scoring above it gets a copy of its earlier frame; off: never (default {SCENE_THRESHOLD})")
    p.add_argument("--inflight", type=int, default=pipeline.DEFAULT_INFLIGHT,
                   help=f"clip chunks in flight (default {pipeline.DEFAULT_INFLIGHT})")
    add_clip_arguments(p)
    _model_options(p, wire.NO_WIRE)
    Acceleration.add_arguments(p)

    p = commands.add_parser("split-checkpoint", help="official checkpoint -> cloud and edge safetensors weights")
    p.add_argument("checkpoint", nargs="?", help=f"official eden.pt, a path or {CHECKPOINT_REFERENCE} (default: synthetic weights)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--config", choices=sorted(PRESETS), default="official")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights")

    p = commands.add_parser("bench", help="median time per pair: encode / codec / denoise / decode, vs the reference path")
    p.add_argument("--size", type=parse_size, default=(480, 854), help="frame size HxW (default 480x854)")
    p.add_argument("--repeat", type=int, default=3, help="timed pairs after one warm-up (default 3)")
    p.add_argument("--no-reference", action="store_true", help="skip timing the reference path")
    _model_options(p, wire.DEFAULT_CODEC)

    p = commands.add_parser("download", help="the official checkpoint from the Hugging Face hub (cached); prints its local path")
    p.add_argument("--repo", default=OFFICIAL_REPO, help=f"hub repository (default {OFFICIAL_REPO})")
    p.add_argument("--file", default=OFFICIAL_FILE, help=f"file in the repository (default {OFFICIAL_FILE})")
    p.add_argument("--revision", help="branch, tag or commit (default: the repository's default branch)")
    p.add_argument("--config", choices=sorted(PRESETS), default="official", help="model dimensions the file must have (default: official)")

    p = commands.add_parser("archive", help="build the TorchServe archives (eden_encoder.mar, eden_ditdec.mar, eden.war)")
    p.add_argument("--checkpoint", help=f"official eden.pt, a path or {CHECKPOINT_REFERENCE} (default: synthetic weights, not a real interpolation)")
    p.add_argument("--model-store", default="model_store", help="where to write the archives (default: ./model_store)")
    p.add_argument("--config", choices=sorted(PRESETS), default="official", help="model dimensions (default: official)")
    _archive_options(p, "")

    add_serve_arguments(commands.add_parser("serve", help="one TorchServe node (cloud, edge or both) in the foreground: the container's process"))
    add_client_arguments(commands.add_parser("client", help="interpolate a pair or a clip through TorchServe"))
    return parser


def _refuse_an_input_as_output(output: str, inputs: list[str]) -> None:
    """Pair mode: the middle frame must not replace a frame (clip mode refuses its input likewise)."""
    for path in inputs:
        if Path(output).exists() and Path(path).exists() and os.path.samefile(output, path):
            raise BadInputError(f"output {output!r} is an input ({path!r}); choose another path")


def _models(args, devices: tuple[str, str]) -> tuple[CloudEncoder, EdgeModel]:
    """The two halves of ``interpolate``, the edge's forward run as its options say."""
    acceleration, edge_device = Acceleration.from_arguments(args), torch.device(devices[1])
    acceleration.graphs_on(edge_device)  # a contradiction fails before the weights load
    cloud, edge = load_pair(args.checkpoint, preset(args.config), devices[0], args.precision or default_precision(edge_device),
                            edge_device=devices[1])
    edge.accelerate(acceleration)
    return cloud, edge


def _interpolate(args) -> int:
    devices = _devices(args.device)
    wire.check_codec(args.codec)
    if len(args.inputs) == 1:
        options = clip_options(args)  # checked before the model loads
        cloud, edge = _models(args, devices)
        summary = pipeline.interpolate_clip_in_process(
            args.inputs[0], args.output, cloud, edge, codec=args.codec, seed=args.seed, chunk=args.chunk,
            inflight=args.inflight, progress=None, max_pixels=args.max_pixels, scene_threshold=args.scene_threshold,
            resume=args.resume, **options,
        )
        report(summary, args.output)
        return 0
    if len(args.inputs) != 2:
        raise BadInputError(f"interpolate takes two frames or one clip, got {len(args.inputs)} inputs")
    refuse_clip_options(args)
    _refuse_an_input_as_output(args.output, args.inputs)
    frame0 = load_frame(args.inputs[0], "frame0", args.max_pixels)
    frame1 = load_frame(args.inputs[1], "frame1", args.max_pixels)
    check_pair(frame0, frame1)
    cloud, edge = _models(args, devices)
    middle, payload_bytes = pipeline.interpolate_pair(cloud, edge, frame0, frame1, args.seed, args.codec,
                                                      scene_threshold=args.scene_threshold)
    save_image(Image.fromarray(to_uint8(middle)), args.output)
    print(f"wrote {args.output} ({middle.shape[2]}x{middle.shape[1]}, payload {payload_bytes} bytes, codec {args.codec}, seed {args.seed})")
    return 0


def _split_checkpoint(args) -> int:
    config = preset(args.config)
    if args.checkpoint is None:
        warnings.warn(synthetic.WEIGHTS_WARNING.format(seed=args.seed))
        state = synthetic.state_dict(config, args.seed)
    else:
        state = load_official(args.checkpoint, config)
    for side, path in write_halves(state, args.out, config).items():
        print(f"{side}: {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def _bench(args) -> int:
    devices = _devices(args.device)
    precision = args.precision or default_precision(torch.device(devices[1]))
    run_bench(checkpoint=args.checkpoint, config=preset(args.config), size=args.size, repeat=args.repeat, codec=args.codec,
              precision=precision, devices=devices, reference=not args.no_reference)
    return 0


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``eden-serve client``; :func:`run_client` takes the parsed namespace."""
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="two frames, or one clip: a directory of frames, an animated GIF/APNG/WebP, or a video; or "
                             "cloud:NAME, a video under the cloud's media root (docs/cloud-sources.md)")
    parser.add_argument("-o", "--output", required=True,
                        help="the middle frame for two frames; for a clip, a clip of the same kind (2N-1 frames)")
    where = parser.add_argument_group("deployment: --server, or --cloud and --edge")
    where.add_argument("--server", metavar="URL", help="TorchServe running the eden workflow, e.g. http://127.0.0.1:8080")
    where.add_argument("--cloud", metavar="URL", help="TorchServe running eden_encoder")
    where.add_argument("--edge", metavar="URL", help="TorchServe running eden_ditdec")
    where.add_argument("--transport", choices=("http", "grpc"), default="http",
                       help="http, or grpc with grpc:// or grpcs:// URLs of the gRPC inference ports; over gRPC "
                            "--server names a server with eden_encoder and eden_ditdec (default http)")
    auth = parser.add_argument_group(f"token (else ${TOKEN_ENV}; none if unset)")
    auth.add_argument("--token", help="inference token")
    auth.add_argument("--token-file", metavar="PATH", help="TorchServe key_file.json: its inference key is used")
    auth.add_argument("--edge-token", metavar="TOKEN", help="the edge server's token, where it differs from the cloud's")
    auth.add_argument("--edge-token-file", metavar="PATH", help="the edge server's key_file.json")
    parser.add_argument("--cacert", metavar="PEM", help="the CA that signed the servers' TLS certificates (default: the system's)")
    parser.add_argument("--seed", type=int, default=0,
                        help="noise seed of the first pair; pair i uses SEED + i (default 0)")
    parser.add_argument("--wire-codec", "--codec", dest="codec",
                        help="wire codec asked of the encoder, or auto (with --cloud/--edge: chosen per chunk from the measured "
                             "link and edge rates; docs/wire-codecs.md; bitstream for a cloud: source) (default: the server's)")
    parser.add_argument("--scene-threshold", type=_threshold_text,
                        help="scene-cut test asked of the encoder: a number, or off (default: the server's)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                        help=f"pairs per request: K + 1 frames, each sent once (default {DEFAULT_CHUNK})")
    parser.add_argument("--ramp", action=argparse.BooleanOptionalAction, default=True,
                        help="start with chunks of 1, 1, 2, 4, ... pairs up to --chunk, for a sooner first middle (default on)")
    parser.add_argument("--inflight", type=int, default=DEFAULT_INFLIGHT,
                        help=f"requests (chunks) in flight at each server (default {DEFAULT_INFLIGHT}); with --cloud/--edge "
                             "as many again are fetched from the cloud (two at a time) while the edge works")
    parser.add_argument("--tries", type=int, default=5,
                        help="attempts per request on connection errors and 5xx (default 5)")
    parser.add_argument("--backoff", type=float, default=1.0,
                        help="seconds before the first retry, doubling after (default 1)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds to wait for an answer (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar on stderr (default: when stderr is a terminal)")
    add_clip_arguments(parser)


def run_client(args: argparse.Namespace) -> int:
    """``eden-serve client``: raises :class:`EdenError` for anything the user can fix."""
    if len(args.inputs) > 2:
        raise BadInputError(f"give two frames or one clip, got {len(args.inputs)} inputs")
    if len(args.inputs) == 2:
        _refuse_an_input_as_output(args.output, args.inputs)
    token = read_token(args.token, args.token_file)
    edge_token = read_token(args.edge_token, args.edge_token_file) if args.edge_token or args.edge_token_file else None
    options = {"token": token, "edge_token": edge_token, "codec": args.codec, "tries": args.tries,
               "scene_threshold": args.scene_threshold,
               "backoff": args.backoff, "timeout": args.timeout, "tls": ClientTLS.from_file(args.cacert),
               "transport": args.transport}
    with Client(args.server, cloud=args.cloud, edge=args.edge, **options) as client:
        if len(args.inputs) == 2:
            refuse_clip_options(args)
            started = time.perf_counter()
            before, after = (Frame(i, path, path=Path(path)) for i, path in enumerate(args.inputs))
            middle = client.interpolate(before.path, after.path, seed=args.seed)
            save_image(match_mode(middle, before.image, after.image), args.output)
            print(f"wrote {args.output} ({middle.width}x{middle.height}, seed {args.seed}) "
                  f"in {time.perf_counter() - started:.2f} s")
            return 0
        summary = client.interpolate_clip(args.inputs[0], args.output, seed=args.seed, chunk=args.chunk, ramp=args.ramp,
                                          inflight=args.inflight, progress=args.progress, resume=args.resume,
                                          **clip_options(args))
        report(summary, args.output)
    return 0


def _archive_options(parser: argparse.ArgumentParser, of: str) -> None:
    """What a build writes into the archives' model-config.yaml; ``of`` qualifies the help."""
    defaults = archive.Options()
    parser.add_argument("--wire-codec", "--codec", dest="codec", default=defaults.codec, help=f"the encoder's wire codec for requests that name none{of} (default: {defaults.codec})")
    parser.add_argument("--precision", choices=PRECISIONS, default=defaults.precision,
                        help=f"the edge's compute precision{of}; auto: bf16 where the hardware runs it fast (default: {defaults.precision})")
    parser.add_argument("--threads", type=int, default=defaults.threads,
                        help=f"CPU threads per worker{of} (default {defaults.threads}: the half's share of the cores)")
    parser.add_argument("--media-root", metavar="DIR", default=defaults.media_root,
                        help=f"the directory of videos that requests may name as server-side sources{of} "
                             "(an absolute path; default: off; docs/cloud-sources.md)")


def _archive(args) -> int:
    options = archive.Options(codec=args.codec, precision=args.precision, threads=args.threads, media_root=args.media_root)
    paths = archive.build(args.model_store, checkpoint=args.checkpoint, config=args.config, options=options)
    print(archive.describe(paths, args.config, options))
    return 0


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("side", choices=sorted(ARCHIVES), help="cloud (encoder), edge (DiT+decoder) or both (one node, two models)")
    parser.add_argument("--model-store", default="model_store", help="the archives' directory (default: ./model_store)")
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--checkpoint", help=f"build the archives at start from this official eden.pt: a path or {CHECKPOINT_REFERENCE}")
    weights.add_argument("--synthetic", action="store_true", help="build the archives at start with synthetic weights (not a real interpolation)")
    parser.add_argument("--config", choices=sorted(PRESETS), default="official", help="model dimensions of the archives built at start (default: official)")
    _archive_options(parser, " of the archives built at start")
    parser.add_argument("--ts-config", default=str(BASE_CONFIG), help="base TorchServe configuration (default: the package's config.properties)")
    parser.add_argument("--properties", action="append", default=[], help="a properties file over the base (repeatable; later wins)")
    parser.add_argument("--startup-timeout", type=float, default=600, help="seconds for the workers to load (default 600)")
    tls = parser.add_argument_group("TLS and keyed payloads (docs/tls.md)")
    tls.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS and gRPC TLS with this certificate chain (RSA)")
    tls.add_argument("--tls-key", metavar="PEM", help="the certificate's private key: unencrypted PKCS#8 RSA")
    tls.add_argument("--wire-key-file", metavar="PATH",
                     help=f"a key shared by cloud and edge: the cloud tags its payloads, the edge refuses untagged ones "
                          f"with 403 (else ${KEY_FILE_ENV})")


def _serve(args) -> int:
    options = archive.Options(codec=args.codec, precision=args.precision, threads=args.threads, media_root=args.media_root)
    return serve(args.side, args.model_store, checkpoint=args.checkpoint, synthetic=args.synthetic, config=args.config,
                 options=options, ts_config=args.ts_config, properties=args.properties, startup_timeout=args.startup_timeout,
                 tls_cert=args.tls_cert, tls_key=args.tls_key, wire_key_file=args.wire_key_file)


def _download(args) -> int:
    path = download(args.repo, args.file, args.revision)
    load_official(path, preset(args.config))
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    # A plain kill then unwinds like Ctrl-C, so temporary outputs are removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    warnings.formatwarning = lambda message, *_args, **_kw: f"{PROG}: warning: {message}\n"
    args = _build_parser().parse_args(argv)
    try:
        commands = {"interpolate": _interpolate, "client": run_client, "split-checkpoint": _split_checkpoint,
                    "bench": _bench, "download": _download, "archive": _archive, "serve": _serve}
        return commands[args.command](args)
    except EdenError as exc:
        return _leave(2, argv, f"error: {exc}")
    except OSError as exc:  # the disk, not the input: full, read-only, a file vanished under the run
        return _leave(2, argv, f"error: {_os_error(exc)}")
    except KeyboardInterrupt:
        return _leave(130, argv, "interrupted")
    except SystemExit as exc:  # SIGTERM
        return _leave(exc.code, argv)
    except MemoryError:
        return _leave(2, argv, "error: out of memory; try smaller frames, a smaller --chunk or fewer --inflight")
    except Exception as exc:  # a bug: still one line, and no abort from threads left in a forward
        return _leave(2, argv, f"error: internal error ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); please report it")


def _os_error(exc: OSError) -> str:
    where = " -> ".join(repr(str(name)) for name in (exc.filename, exc.filename2) if name is not None)
    reason = exc.strerror or " ".join(str(exc).split())[:200] or type(exc).__name__
    return reason + (f": {where}" if where else "")


def _leave(code: int, argv: list[str] | None, line: str | None = None) -> int:
    """The exit code of a run that failed or was stopped, its reason printed in one line. The
    command itself (``argv`` None) leaves at once: a worker thread may still be inside a torch
    forward, and finalising the interpreter under it aborts the process ("terminate called without
    an active exception"). Outputs are settled by then."""
    if line is not None:
        print(f"{PROG}: {line}", file=sys.stderr)
    if argv is not None:
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

"""The ``eden-serve`` command: interpolate, client, page, split-checkpoint, bench, download, archive, serve.

Every error the user can cause ends as one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import torch

from .. import wire
from ..clips import pipeline
from ..clips.arguments import add_clip_arguments, parse_shape, parse_size, refuse_clip_options, report
from ..clips.streaming import DEFAULT_CHUNK, DEFAULT_INFLIGHT
from ..cloud.scene_cuts import SCENE_THRESHOLD
from ..config import PRESETS, preset
from ..edge import PRECISIONS, Acceleration, default_precision
from ..errors import BadInputError
from ..media import Frame, check_middle, save_middle
from ..media.atomic import check_output_directory
from ..media.decoders import DECODERS
from ..media.frames import DEFAULT_MAX_PIXELS, check_pair, picture_size, to_pixels
from ..model import synthetic
from ..model.checkpoint import load_official, write_halves
from ..model.hub import OFFICIAL_FILE, OFFICIAL_REPO, download
from ..page import PAGE_DESCRIPTION, add_page_arguments, run_page
from ..serving import archive
from ..serving.launcher import BASE_CONFIG
from ..serving.node import ARCHIVES, serve
from ..wire.keyed import KEY_FILE_ENV
from .bench import Bench, run_bench
from .shared import (
    CHECKPOINT_REFERENCE, PROG, add_deployment_arguments, add_model_options, attached_secrets, clip_in_process, clip_through,
    client_from, devices, failure, load_models, shown, threshold, threshold_text
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}{_dash_hint(message)}\n")


def _dash_hint(message: str) -> str:
    """How to name a file whose name starts with a dash, where argparse took one for an option."""
    words = message.partition("unrecognized arguments: ")[2].split(" ")
    if any(word.startswith("-") and os.path.lexists(word) for word in words):
        return " (a file whose name starts with a dash is given as ./-NAME, or after --)"
    return ""


def _add_device_clip_arguments(p: argparse.ArgumentParser) -> None:
    """How a clip in this process meets the edge's device: its decoder, and the middles' way back."""
    p.add_argument("--decoder", choices=DECODERS, default="auto",
                   help="a video's decoder: the host's, or the GPU's (nvdec: frames copied to the host; nvdec-device: kept on "
                        "the GPU); auto: the fastest on the clip's first frames beside a GPU (where the host's wins, such streams "
                        "go to it untried from then on: delete ~/.cache/eden-serve/decoders.json to measure again), the host's "
                        "beside a CPU (default auto)")
    p.add_argument("--middles-as", choices=pipeline.MIDDLES_AS, default="auto",
                   help="how a video's middles come back from the edge: the output's 4:2:0 planes, converted on the device "
                        "(half the bytes), or RGB converted by the writer; auto: planes on a GPU (default auto)")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="EDEN frame interpolation, split between a cloud encoder and an edge DiT+decoder.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = commands.add_parser("interpolate", help="middle frame of a pair, or every middle frame of a clip, in this process")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="FRAME0 FRAME1, or one clip: a directory of frames, a GIF/APNG/WebP or an MP4")
    p.add_argument("-o", "--output", required=True, help="output image (pair; format from the extension, e.g. .png) or clip of the input's kind")
    p.add_argument("--seed", type=int, default=0, help="noise seed (pair i of a clip uses seed + i; default 0)")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, help="refuse larger frames (default: 4K UHD)")
    p.add_argument("--chunk", type=int, help=f"clip pairs per chunk, computed in batched forwards (default {DEFAULT_CHUNK} on a CPU, "
                                             f"{pipeline.CLIP_DEFAULTS['cuda'].chunk} on a GPU)")
    p.add_argument("--scene-threshold", type=threshold, default=SCENE_THRESHOLD,
                   help=f"scene-cut test: a pair scoring above it gets a copy of its earlier frame; off: never (default {SCENE_THRESHOLD})")
    p.add_argument("--inflight", type=int, help=f"clip chunks in flight (default {pipeline.DEFAULT_INFLIGHT} on a CPU, "
                                                f"{pipeline.CLIP_DEFAULTS['cuda'].inflight} on a GPU)")
    p.add_argument("--ramp", action=argparse.BooleanOptionalAction,
                   help="start with chunks of 1, 1, 2, 4, ... pairs up to --chunk, for a sooner first middle (default: on a GPU)")
    _add_device_clip_arguments(p)
    add_clip_arguments(p)
    add_model_options(p, wire.NO_WIRE)
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
    add_model_options(p)

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
    p.add_argument("--prepare", type=parse_shape, action="append", metavar="HxW[xPAIRS]",
                   help="compile the edge's forward ahead for frames of this size (repeatable; PAIRS per forward, default "
                        "what the device takes), on --prepare-device, into the "
                        "edge archive and beside it: its workers (and eden-serve interpolate --compiled) compile it from there "
                        "in seconds; made on the GPU kind that will serve (docs/gpu.md, \"Compiled ahead\")")
    p.add_argument("--prepare-device", default="cuda", help="the device --prepare compiles on (default cuda)")

    add_serve_arguments(commands.add_parser("serve", help="one TorchServe node (cloud, edge or both) in the foreground: the container's process"))
    add_client_arguments(commands.add_parser("client", help="interpolate a pair or a clip through TorchServe"))
    add_page_arguments(commands.add_parser("page", help="a web page to drop a clip, watch it interpolated and compare it "
                                                        "with the original, in process or through servers (docs/page.md)",
                                           description=PAGE_DESCRIPTION))
    return parser


def _refuse_an_input_as_output(output: str, inputs: list[str]) -> None:
    """Pair mode: the middle frame must not replace a frame (clip mode refuses its input likewise)."""
    for path in inputs:
        if Path(output).exists() and Path(path).exists() and os.path.samefile(output, path):
            raise BadInputError(f"output {output!r} is an input ({path!r}); choose another path")


def _interpolate(args) -> int:
    devices(args.device)  # checked before any work
    wire.kind(args.codec, in_process=True)
    if len(args.inputs) == 1:
        summary = clip_in_process(args, args.inputs[0], args.output, lambda: load_models(args))
        report(summary, args.output, args.verbose)
        return 0
    if len(args.inputs) != 2:
        raise BadInputError(f"interpolate takes two frames or one clip, got {len(args.inputs)} inputs")
    refuse_clip_options(args)
    _refuse_an_input_as_output(args.output, args.inputs)
    # Named by their paths, as a clip's frames are by theirs: a refusal says which file.
    before, after = (Frame(i, shown(path), path=Path(path), max_pixels=args.max_pixels) for i, path in enumerate(args.inputs))
    check_pair(before.tensor, after.tensor, (before.name, after.name))
    check_middle(before, after, args.output)  # before the work: a 16-bit grey middle as JPEG
    cloud, edge = load_models(args)
    # At the depth a server answers (16 bits where either frame has more than 8), in the mode of the
    # frame before: the middle a directory clip, or the client, writes of the same pair.
    depth = max(before.depth, after.depth)
    middles, payload_bytes = pipeline.interpolate_chunk(cloud, edge, [before.tensor, after.tensor], args.seed, args.codec,
                                                        scene_threshold=args.scene_threshold, depth=depth)
    middle = to_pixels(middles[0], depth).cpu()
    save_middle(middle, before, after, args.output)
    print(f"wrote {shown(args.output)} ({middle.shape[1]}x{middle.shape[0]}, payload {payload_bytes} bytes, codec {args.codec}, seed {args.seed})")
    return 0


def _split_checkpoint(args) -> int:
    config = preset(args.config)
    check_output_directory(args.out, "--out")
    if args.checkpoint is None:
        warnings.warn(synthetic.WEIGHTS_WARNING.format(seed=args.seed))
        state = synthetic.state_dict(config, args.seed)
    else:
        state = load_official(args.checkpoint, config)
    for side, path in write_halves(state, args.out, config).items():
        print(f"{side}: {shown(path)} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def _bench(args) -> int:
    cloud_device, edge_device = devices(args.device)
    precision = args.precision or default_precision(torch.device(edge_device))
    run_bench(Bench(preset(args.config), args.size, args.codec, precision, (cloud_device, edge_device), args.checkpoint,
                    args.repeat, reference=not args.no_reference))
    return 0


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``eden-serve client``; :func:`run_client` takes the parsed namespace."""
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="two frames, or one clip: a directory of frames, an animated GIF/APNG/WebP, or a video; or "
                             "cloud:NAME, a video under the cloud's media root (docs/cloud-sources.md)")
    parser.add_argument("-o", "--output", required=True,
                        help="the middle frame for two frames; for a clip, a clip of the same kind (2N-1 frames)")
    add_deployment_arguments(parser)
    parser.add_argument("--seed", type=int, default=0,
                        help="noise seed of the first pair; pair i uses SEED + i (default 0)")
    parser.add_argument("--wire-codec", "--codec", dest="codec",
                        help="wire codec asked of the encoder, or auto (with --cloud/--edge: chosen per chunk from the measured "
                             "link and edge rates; docs/wire-codecs.md; bitstream for a cloud: source) (default: the server's)")
    parser.add_argument("--scene-threshold", type=threshold_text,
                        help="scene-cut test asked of the encoder: a number, or off (default: the server's)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                        help=f"pairs per request: K + 1 frames, each sent once (default {DEFAULT_CHUNK})")
    parser.add_argument("--ramp", action=argparse.BooleanOptionalAction, default=True,
                        help="start with chunks of 1, 1, 2, 4, ... pairs up to --chunk, for a sooner first middle (default on)")
    parser.add_argument("--inflight", type=int, default=DEFAULT_INFLIGHT,
                        help=f"requests (chunks) in flight at each server (default {DEFAULT_INFLIGHT}); with --cloud/--edge "
                             "as many again are fetched from the cloud (two at a time) while the edge works")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar on stderr (default: when stderr is a terminal)")
    add_clip_arguments(parser)


def run_client(args: argparse.Namespace) -> int:
    """``eden-serve client``: raises :class:`EdenError` for anything the user can fix."""
    if len(args.inputs) > 2:
        raise BadInputError(f"give two frames or one clip, got {len(args.inputs)} inputs")
    if len(args.inputs) == 2:
        _refuse_an_input_as_output(args.output, args.inputs)
    with client_from(args) as client:
        if len(args.inputs) == 2:
            refuse_clip_options(args)
            started = time.perf_counter()
            before, after = (Frame(i, path, path=Path(path)) for i, path in enumerate(args.inputs))
            middle = client.interpolate(before.path, after.path, seed=args.seed)
            save_middle(middle, before, after, args.output)
            print(f"wrote {shown(args.output)} ({'x'.join(map(str, picture_size(middle)))}, seed {args.seed}) "
                  f"in {time.perf_counter() - started:.2f} s")
            return 0
        summary = clip_through(client, args, args.inputs[0], args.output)
        report(summary, args.output, args.verbose)
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
    prepared = archive.Prepared(tuple(args.prepare), args.prepare_device) if args.prepare else None
    paths = archive.build(args.model_store, checkpoint=args.checkpoint, config=args.config, options=options, prepared=prepared)
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
                 archive=options, ts_config=args.ts_config, properties=args.properties, startup_timeout=args.startup_timeout,
                 tls_cert=args.tls_cert, tls_key=args.tls_key, wire_key_file=args.wire_key_file)


def _download(args) -> int:
    path = download(args.repo, args.file, args.revision)
    load_official(path, preset(args.config))
    print(shown(path))
    return 0


def main(argv: list[str] | None = None) -> int:
    # A plain kill then unwinds like Ctrl-C, so temporary outputs are removed on the way out. Called
    # from within another program (``argv`` given: a test's, a script's), the program's own way with
    # SIGTERM is given back on return: sys.exit from a handler the command left behind would be
    # swallowed by whatever the program is doing then, its interpreter's exit included.
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if argv is None:
        _outputs_say_any_name()
    if argv is None and not faulthandler.is_enabled() and sys.stderr is not None:  # None: started with it closed
        # A crash in native code (a decoder, an encoder, a kernel) names where each thread stood,
        # rather than ending the command by the signal without a word.
        faulthandler.enable()
    try:
        return _run(argv)
    finally:
        if argv is not None:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def _outputs_say_any_name() -> None:
    """Standard output writes any name the command prints (``wrote NAME``): where its encoding is
    strict (``PYTHONIOENCODING=utf-8``, or ascii), a name it cannot encode (an accent, a byte that is
    not UTF-8) is written escaped, rather than failing the run once its output is written. Standard
    error escapes already; the locale's surrogateescape (a name's own bytes) is kept."""
    if sys.stdout is not None and getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


def _run(argv: list[str] | None) -> int:
    warnings.formatwarning = lambda message, *_args, **_kw: f"{PROG}: warning: {message}\n"
    args = _build_parser().parse_args(attached_secrets(sys.argv[1:] if argv is None else argv))
    try:
        commands = {"interpolate": _interpolate, "client": run_client, "split-checkpoint": _split_checkpoint,
                    "bench": _bench, "download": _download, "archive": _archive, "serve": _serve, "page": run_page}
        code = commands[args.command](args)
        if argv is None:
            _settled()
        return code
    except KeyboardInterrupt:
        return _leave(130, argv, "interrupted")
    except SystemExit as exc:  # SIGTERM: said in one line, as Ctrl-C is
        return _leave(exc.code, argv, "terminated" if exc.code == 143 else None)
    except Exception as exc:  # a bug too: still one line, and no abort from threads left in a forward
        return _leave(2, argv, failure(exc))


def _settled() -> None:
    """The command has done its work and settled its output: all that is left is the interpreter's
    exit (atexit callbacks, finalizers), which a signal would only cut short, to end the run by
    the signal itself (-2 for SIGINT, once Python has given it back to the system) without a word,
    or with a traceback from a callback. So the command itself ignores SIGINT and SIGTERM from here
    on, and its exit code stays what its work gave. (A handler already tripped is not run either.)
    Not os._exit: the interpreter's exit still flushes and closes what the command left open."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _leave(code: int, argv: list[str] | None, line: str | None = None) -> int:
    """The exit code of a run that failed or was stopped, its reason printed in one line. The
    command itself (``argv`` None) leaves at once: a worker thread may still be inside a torch
    forward, and finalising the interpreter under it aborts the process ("terminate called without
    an active exception"). Outputs are settled by then, and a second signal would cut the line short."""
    if argv is None:
        _settled()
    if line is not None:
        print(f"{PROG}: {line}", file=sys.stderr)
    if argv is not None:
        return code
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None where the command was started with it closed (>&-)
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

"""What the commands do with their parsed options, shared by the command line (:mod:`.cli`) and the
web page (:mod:`.page`), so that neither writes it twice: the model and deployment options, the
device, the models and the client they name, a clip in process or through the servers, and the one
line a failure is told in.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import unicodedata
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch

from .. import wire
from ..client import DEFAULT_TIMEOUT, Client
from ..client.tls import ClientTLS
from ..client.transports import TOKEN_ENV, TRANSPORTS, read_token
from ..clips import pipeline
from ..clips.arguments import clip_options
from ..clips.streaming import ClipOptions, Summary
from ..cloud.encoder import CloudEncoder
from ..config import PRESETS, preset
from ..edge import PRECISIONS, Acceleration, EdgeModel, artefacts, default_precision
from ..errors import BadInputError, EdenError, is_out_of_memory
from ..media import PIPE, open_clip
from ..media.sequence import refuse_input_fps
from ..model.checkpoint import load_pair

PROG = "eden-serve"
CHECKPOINT_REFERENCE = "hf://ORG/NAME/FILE[@REV]"


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


def devices(text: str) -> tuple[str, str]:
    """``--device``: one device for both halves, or ``CLOUD,EDGE``. Two GPUs asked for where fewer
    are visible run both halves on the first one, with a warning."""
    cloud, edge, fell_back = _devices(text)
    if fell_back:
        warnings.warn(f"--device {text}: only {torch.cuda.device_count()} GPU(s) visible; the cloud and the edge "
                      "both run on cuda:0", DeviceFallbackWarning, stacklevel=2)
    return cloud, edge


def _devices(text: str) -> tuple[str, str, bool]:
    """:func:`devices`, and whether it fell back to one GPU, without the warning."""
    names = text.split(",")
    if len(names) == 1:
        return _device(names[0]), _device(names[0]), False
    if len(names) != 2:
        raise BadInputError(f"--device takes one device or two (CLOUD,EDGE), got {text!r}")
    gpus = [int(name.partition(":")[2] or 0) for name in names if name.startswith("cuda")]
    if gpus and torch.cuda.is_available() and max(gpus) >= torch.cuda.device_count():
        return "cuda:0", "cuda:0", True
    cloud, edge = (_device(name) for name in names)
    return cloud, edge, False


def threshold(text: str) -> float | None:
    """``--scene-threshold`` in process: a number in [0, 3], or off (None)."""
    if text == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 3:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 3] or off, got {text!r}")
    return value


def threshold_text(text: str) -> str:
    """``--scene-threshold`` asked of a server: checked, then sent as it is."""
    threshold(text)
    return text


def add_model_options(parser: argparse.ArgumentParser, codec: str = wire.DEFAULT_CODEC) -> None:
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


def acceleration_of(args: argparse.Namespace, edge_device: torch.device) -> Acceleration:
    """How the command's switches run the edge's forward on ``edge_device``: ``--compiled``
    artefacts make ``--compile auto`` compile from them."""
    acceleration = Acceleration.from_arguments(args)
    return acceleration.with_prepared(edge_device) if getattr(args, "compiled", None) is not None else acceleration


def load_models(args: argparse.Namespace) -> tuple[CloudEncoder, EdgeModel]:
    """The two halves that ``--checkpoint``, ``--config``, ``--device`` and ``--precision`` name, the
    edge's forward run as ``--cuda-graphs`` and ``--compile`` say where the command has them."""
    cloud_device, edge_device = devices(args.device)
    acceleration = acceleration_of(args, torch.device(edge_device))
    acceleration.graphs_on(torch.device(edge_device))  # a contradiction fails before the weights load
    precision = args.precision or default_precision(torch.device(edge_device))
    compiled = getattr(args, "compiled", None)
    if compiled is not None:
        artefacts.read_header(compiled)  # not such a file: refused before the weights load
    cloud, edge = load_pair(args.checkpoint, preset(args.config), cloud_device, precision, edge_device=edge_device)
    edge.accelerate(acceleration)
    if compiled is not None:
        artefacts.load_into(edge, compiled)
    return cloud, edge


# Options whose value is a secret: TorchServe's keys are drawn from an alphabet with "-", and
# argparse takes a value that starts with one for an option ("expected one argument").
SECRET_OPTIONS = ("--token", "--edge-token")


def attached_secrets(argv: list[str]) -> list[str]:
    """``argv`` with each secret option's value attached (``--token -x1`` -> ``--token=-x1``), so that
    a key that starts with "-" is read as the value it is."""
    out, rest = [], iter(argv)
    for arg in rest:
        value = next(rest, None) if arg in SECRET_OPTIONS else None
        out.append(arg if value is None else f"{arg}={value}")
    return out


def add_deployment_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the servers are, how to reach them and how long to keep trying: the client's options."""
    where = parser.add_argument_group("deployment: --server, or --cloud and --edge")
    where.add_argument("--server", metavar="URL", help="TorchServe running the eden workflow, e.g. http://127.0.0.1:8080")
    where.add_argument("--cloud", metavar="URL", help="TorchServe running eden_encoder")
    where.add_argument("--edge", metavar="URL", help="TorchServe running eden_ditdec")
    where.add_argument("--transport", choices=TRANSPORTS.names,
                       help="http, or grpc with grpc:// or grpcs:// URLs of the gRPC inference ports; over gRPC "
                            "--server names a server with eden_encoder and eden_ditdec (default: the URLs' scheme says)")
    auth = parser.add_argument_group(f"token (else ${TOKEN_ENV}; none if unset)")
    auth.add_argument("--token", help="inference token")
    auth.add_argument("--token-file", metavar="PATH", help="TorchServe key_file.json: its inference key is used")
    auth.add_argument("--edge-token", metavar="TOKEN", help="the edge server's token, where it differs from the cloud's")
    auth.add_argument("--edge-token-file", metavar="PATH", help="the edge server's key_file.json")
    parser.add_argument("--cacert", metavar="PEM", help="the CA that signed the servers' TLS certificates (default: the system's)")
    parser.add_argument("--tries", type=int, default=5,
                        help="attempts per request on connection errors and 5xx (default 5)")
    parser.add_argument("--backoff", type=float, default=1.0,
                        help="seconds before the first retry, doubling after (default 1)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds to wait for an answer, and over HTTP for each MiB or middle of it (default {DEFAULT_TIMEOUT:g})")


def client_from(args: argparse.Namespace) -> Client:
    """The :class:`Client` of the deployment options (``args.codec`` and ``args.scene_threshold``
    are asked of the encoder)."""
    token = read_token(args.token, args.token_file)
    edge_token = read_token(args.edge_token, args.edge_token_file) if args.edge_token or args.edge_token_file else None
    return Client(args.server, cloud=args.cloud, edge=args.edge, codec=args.codec, scene_threshold=args.scene_threshold,
                  token=token, edge_token=edge_token, tls=ClientTLS.from_file(args.cacert), timeout=args.timeout,
                  tries=args.tries, backoff=args.backoff, transport=args.transport)


def clip_in_process(args: argparse.Namespace, src: str | Path, dst: str | Path,
                    models: Callable[[], tuple[CloudEncoder, EdgeModel]], **hooks) -> Summary:
    """``eden-serve interpolate CLIP``: the clip options of ``args`` and the clip itself (opened and
    closed: a missing or unreadable input, or frames too large, refused before a weight is read)
    checked first; then the video's decoder is chosen on a thread of its own
    (:func:`~eden_serve.clips.pipeline.decoded_by`: beside a GPU, trials of about 0.6 s in a fresh
    process) while ``models()`` gives the halves here, as before (an edge accelerated on another
    thread was once seen several times slower on a CPU, not reproduced). An error while they overlap waits for the choice to
    end, so no thread outlives the call. The chunks, their ramp, the chunks in flight and the encoder's speed the
    edge's device suits where ``args`` leaves them (:func:`~eden_serve.clips.pipeline.clip_defaults`);
    ``hooks``: :func:`~eden_serve.clips.streaming.interpolate_clip`'s ``watch``."""
    wire.kind(args.codec, in_process=True)
    options = clip_options(args)
    opening = ClipOptions(max_pixels=args.max_pixels, process_size=args.process_size, raw=options["raw"], input_fps=options["input_fps"])
    _check_source(src, dst, opening)
    with ThreadPoolExecutor(1, thread_name_prefix="eden-decoder") as choosing:
        chosen = choosing.submit(pipeline.decoded_by, src, getattr(args, "decoder", "host"), torch.device(_devices(args.device)[1]),
                                 opening)
        cloud, edge = models()
        source = chosen.result()
    defaults = pipeline.clip_defaults(edge.device)
    chunk = defaults.chunk if args.chunk is None else args.chunk
    inflight = defaults.inflight if args.inflight is None else args.inflight
    ramp = defaults.ramp if getattr(args, "ramp", None) is None else args.ramp
    options["encoding"] = dataclasses.replace(options["encoding"], gpu=edge.device.type == "cuda", gpu_index=edge.device.index or 0)
    return pipeline.interpolate_clip_in_process(
        source, dst, cloud, edge, codec=args.codec, seed=args.seed, chunk=chunk, inflight=inflight, ramp=ramp,
        progress=getattr(args, "progress", None), max_pixels=args.max_pixels, scene_threshold=args.scene_threshold, resume=args.resume,
        middles_as=getattr(args, "middles_as", "auto"), **options, **hooks,
    )


def _check_source(src: str | Path, dst: str | Path, options: ClipOptions) -> None:
    """``src`` opened and closed as the clip engine opens it (:func:`~eden_serve.clips.streaming.interpolate_clip`):
    an input it would refuse is refused now, not after the weights' load, and ``--input-fps`` where
    it has no use. A pipe is read once, by the engine."""
    if str(src) != PIPE:
        with open_clip(src, options.max_pixels if options.process_size is None else None, options.raw) as clip:
            refuse_input_fps(clip, dst, options.input_fps)


def clip_through(client: Client, args: argparse.Namespace, src: str | Path, dst: str | Path, **hooks) -> Summary:
    """``eden-serve client CLIP``: the clip options of ``args`` through ``client``'s servers."""
    return client.interpolate_clip(src, dst, seed=args.seed, chunk=args.chunk, ramp=args.ramp, inflight=args.inflight,
                                   progress=args.progress, resume=args.resume, **clip_options(args), **hooks)


def failure(exc: Exception) -> str:
    """The one line a failed command prints after ``eden-serve: `` (the page shows the same)."""
    if isinstance(exc, EdenError):
        return f"error: {exc}"
    if isinstance(exc, OSError):  # the disk, not the input: full, read-only, a file vanished under the run
        where = " -> ".join(repr(str(name)) for name in (exc.filename, exc.filename2) if name is not None)
        reason = exc.strerror or " ".join(str(exc).split())[:200] or type(exc).__name__
        return "error: " + reason + (f": {where}" if where else "")
    if is_out_of_memory(exc):  # a GPU's too (torch.OutOfMemoryError is a RuntimeError): a 16 GB card meets it first
        return "error: out of memory; try smaller frames, a smaller --chunk or fewer --inflight"
    return f"error: internal error ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); please report it"


def shown(name) -> str:
    """A file's name as a line prints it: as it is, unless it holds a character that would end the
    line or move the terminal's cursor (a newline, a tab, an escape), then quoted with those escaped,
    as the error lines quote names. A name's own undecodable bytes are kept as they are."""
    text = str(name)
    if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in text):
        return repr(text)
    return text

"""``eden-serve page``: a web page on this machine to drop a clip, watch it being interpolated and
compare the result with the original (docs/page.md).

The page computes in this process (the models on this machine's device) or through running servers
(``--server``, or ``--cloud`` and ``--edge``), with the same functions as ``eden-serve interpolate``
and ``eden-serve client`` (:mod:`eden_serve.commands.shared`). The server side (:mod:`.asgi`, the ``page``
extra: Starlette and uvicorn) is imported only when the page starts; the page itself is plain
HTML, CSS and JavaScript (``static/``, package data): no build step.

Modules: ``guard.py`` (the token, the address and the origin of every request), ``uploads.py``
(clips written under the work directory within the size limit; ``cloud:`` sources), ``media.py``
(what a clip is, and previews a browser plays), ``options.py`` (a run's fields read as the commands'
options), ``runs.py`` (runs one at a time, watched, cancelled), ``asgi.py`` (the routes and the
live connection).
"""

from __future__ import annotations

import argparse
import ipaddress
import shutil
import socket
import secrets
import tempfile
from pathlib import Path

from .. import wire
from ..client import transport_for
from ..clips.streaming import DEFAULT_CHUNK
from ..commands.shared import PROG, add_deployment_arguments, add_model_options, client_from, load_models
from ..errors import BadInputError
from ..media.frames import DEFAULT_MAX_PIXELS
from .guard import allowed_hosts

DEFAULT_MAX_UPLOAD_MB = 2048
PAGE_DESCRIPTION = ("Serve a web page on this machine: drop a clip on it, watch it being interpolated (in this process, "
                    "or through a server, or a cloud and an edge) and compare the result with the original, side by side "
                    "or with a wipe, frame by frame. Open the address it prints (docs/page.md).")


def add_page_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to bind, an IP address of this machine (default 127.0.0.1: this machine only)")
    parser.add_argument("--allow-cleartext", action="store_true",
                        help="serve on an address other than loopback over plain HTTP, the token readable on the network "
                             "(docs/page.md)")
    parser.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    parser.add_argument("--max-upload", type=int, default=DEFAULT_MAX_UPLOAD_MB, metavar="MB",
                        help=f"the largest clip a page may upload, in MiB (default {DEFAULT_MAX_UPLOAD_MB})")
    parser.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, help="refuse larger frames (default: 4K UHD)")
    parser.add_argument("--media-root", metavar="DIR",
                        help="the cloud's media root as this machine sees it: its videos are offered as cloud:NAME sources "
                             "(with --cloud and --edge)")
    parser.add_argument("--work-dir", metavar="DIR",
                        help="where uploads, results and previews go (default: a temporary directory, removed on exit)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help=f"pairs per chunk (default {DEFAULT_CHUNK})")
    parser.add_argument("--inflight", type=int,
                        help="chunks in flight (default: as eden-serve interpolate in process, as eden-serve client otherwise)")
    parser.add_argument("--ramp", action=argparse.BooleanOptionalAction, default=True,
                        help="through servers: first chunks of 1, 1, 2, 4, ... pairs (default on)")
    add_model_options(parser, wire.NO_WIRE)
    add_deployment_arguments(parser)
    parser.set_defaults(codec=None)  # in process, eden-serve interpolate's (none); through servers, the server's


def _address(host: str, cleartext: bool) -> None:
    """Refuses a ``--host`` the page cannot serve safely."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise BadInputError(f"--host takes an IP address of this machine, got {host!r}") from None
    if address.is_unspecified:
        raise BadInputError(f"--host {host} answers on every address, which a page cannot check requests against; "
                            "give the one address to serve on")
    if not address.is_loopback and not cleartext:
        raise BadInputError(f"--host {host} is reachable from other machines, and the page speaks plain HTTP: its token "
                            "would cross the network readable; add --allow-cleartext to serve it so (a trusted network)")


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BadInputError(f"cannot listen on {host} port {port}: {exc.strerror}") from None
    sock.listen(128)
    return sock


def run_page(args: argparse.Namespace) -> int:
    """Serve the page until Ctrl-C or SIGTERM; raises :class:`EdenError` for what the user can fix."""
    servers = bool(args.server or args.cloud or args.edge)
    if args.media_root is not None and not (args.cloud or (args.server and not transport_for(args.server, args.transport).workflow_api)):
        raise BadInputError("--media-root offers cloud: sources, which are read through --cloud and --edge "
                            "(or --server over --transport grpc)")
    if args.max_upload < 1:
        raise BadInputError(f"--max-upload must be at least 1 MiB, got {args.max_upload}")
    _address(args.host, args.allow_cleartext)
    try:
        from .asgi import Settings, serve  # the page extra, needed only here
    except ImportError as exc:
        raise BadInputError(f"the page needs the page extra ({exc.name} is missing): pip install 'eden-serve[page]'") from None
    args.max_upload *= 1024**2
    args.inflight = args.inflight or (4 if servers else None)  # in process: the device's (pipeline.clip_defaults)
    if servers:
        args.scene_threshold = None
        client_from(args).close()  # the deployment options checked before the page opens
        models = None
    else:
        args.codec = args.codec or wire.NO_WIRE
        wire.kind(args.codec, in_process=True)
        models = load_models(args)
    sock = _bound(args.host, args.port)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(32)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="eden-page-"))
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"{PROG} page: open http://{host}:{port}/?token={token}", flush=True)
    try:
        serve(Settings(args, token, allowed_hosts(args.host, port), work, models), sock)
    finally:
        sock.close()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0

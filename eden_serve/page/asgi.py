"""The page's web application (Starlette on uvicorn), behind :class:`~.guard.Guard`.

Routes: ``/`` and ``/static/`` (the page, package data), ``POST /uploads`` (a clip, the raw body),
``/sources`` and ``/sources/info`` (``cloud:NAME`` sources), ``/clips/ID/play`` and
``/sources/play`` (an original as the browser plays it), ``/runs`` (every run's state),
``/runs/ID/preview.png`` (the live preview), ``/runs/ID/play`` and ``/runs/ID/result`` (the result,
to play and to download), ``/sign`` (a signed URL of one of those media, for an element that sends
no header), and the WebSocket ``/live``: the page starts and cancels its run there and is sent its
state; closing it cancels the run. Messages name no path of this machine (:meth:`Page.scrub`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import anyio
import anyio.to_thread
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from .. import wire
from ..client.pace import AUTO
from ..cloud.sources import SourceVideo
from ..commands.shared import PROG, clip_in_process, clip_through, client_from, failure
from ..errors import BadInputError, EdenError
from .guard import SUBPROTOCOL, Guard, Signer
from .media import describe, describe_source, preview
from .options import expected_pairs, output_extension, run_arguments
from .runs import Run, Runner
from .uploads import Uploads, list_sources, open_source

STATIC = Path(__file__).with_name("static")
SNAPSHOT_EVERY = 0.25  # seconds between two looks at a page's run
GRACEFUL_SHUTDOWN = 5  # seconds the server gives open connections when it stops
MAX_MESSAGE = 64 * 1024  # characters of a /live message the page reads
MAX_FRAME = 1024**2  # bytes of a WebSocket message uvicorn takes at all (beyond: the connection is closed)
# What /sign signs: the media a page loads by URL alone (a video's source, a download).
SIGNABLE = re.compile(r"/clips/[0-9a-f]{32}/play|/runs/[0-9a-f]{16}/(play|result)|/sources/play\?name=[^&#]{1,3000}")


@dataclass
class Settings:
    """What ``eden-serve page`` was started with."""

    args: argparse.Namespace  # its command line
    token: str
    hosts: set[str]
    work: Path  # uploads, results and previews, nowhere else
    models: tuple | None  # the halves, in process; None: through the servers


class Page:
    """The application's state: the clips it was given and the runs, one at a time."""

    def __init__(self, settings: Settings, signer: Signer):
        self.settings, self.args, self.signer = settings, settings.args, signer
        self.servers = settings.models is None
        self.media_root = Path(self.args.media_root) if self.args.media_root else None
        self.previews = settings.work / "previews"
        self.uploads = Uploads(settings.work / "uploads", self.args.max_upload, self.args.max_pixels, self.in_use,
                               lambda path: _preview_of(path, self.previews).unlink(missing_ok=True))
        self.runner = Runner(self.execute)
        # The folders whose paths no message may show (the longest first: a link's target may be
        # longer), and what follows one up to a space, a quote, a colon or a comma: a file under it.
        roots = {str(settings.work), os.path.realpath(settings.work)}
        if self.media_root is not None:
            roots |= {str(self.media_root), os.path.realpath(self.media_root)}
        self.paths = re.compile("(?:" + "|".join(re.escape(root) for root in sorted(roots, key=len, reverse=True)) + r")(/[^\s'\":,]*)?")

    def in_use(self, path: Path) -> bool:
        return any(run.source == str(path) and run.state in ("queued", "running") for run in list(self.runner.runs.values()))

    def scrub(self, text: str) -> str:
        """``text`` naming the page's files by their names (an upload's: the name it was dropped
        by), never by their paths on this machine."""
        labels = {str(item.path): item.label for item in list(self.uploads.items.values())}

        def named(match: re.Match) -> str:
            return labels.get(match.group(0)) or Path(match.group(1) or "…").name

        return self.paths.sub(named, text)

    def source(self, name) -> SourceVideo:
        """A ``cloud:`` source, opened as the cloud opens it."""
        if self.media_root is None:
            raise BadInputError("this page lists no cloud: sources (eden-serve page --media-root)")
        return open_source(self.media_root, name, self.args.max_pixels)

    def execute(self, run: Run):
        if self.servers:
            with client_from(run.args) as client:
                return clip_through(client, run.args, run.source, run.output, watch=run.watch)
        return clip_in_process(run.args, run.source, run.output, lambda: self.settings.models, watch=run.watch)

    async def start(self, message: dict) -> Run:
        """A run of the clip a page names, with its options; refused as the command would refuse it."""
        clip, fields = message.get("clip") or {}, message.get("options") or {}
        if not isinstance(clip, dict) or not isinstance(fields, dict):
            raise BadInputError("start takes a clip and options")
        args = run_arguments(self.args, fields, self.servers)
        if clip.get("source") is not None:
            name = str(clip["source"])
            info = await anyio.to_thread.run_sync(lambda: describe_source(self.source(name)))
            source, title = f"cloud:{name}", name
        else:
            upload = self.uploads.get(clip.get("upload"))
            if upload is None:
                raise BadInputError("no such clip on this page: drop or choose it again")
            info, source, title = upload.clip, str(upload.path), upload.label
        extension = output_extension(info.kind, info.extension, message.get("container") or None)
        key = secrets.token_hex(8)
        folder = self.settings.work / "runs" / key
        folder.mkdir(parents=True)
        name = f"{Path(title).stem}-{args.fps or args.factor}x{extension}".replace("/", "_")
        run = Run(key, args, source, folder / f"result{extension}", expected_pairs(args, info.frames), name, info.colour)
        self.runner.submit(run)
        return run

    def snapshot(self, run: Run) -> dict:
        state = run.snapshot(self.runner.position(run))
        return {**state, "reason": self.scrub(state["reason"])}


def _run_of(page: Page, request: Request) -> Run:
    run = page.runner.runs.get(request.path_params["key"])
    if run is None:
        raise EdenNotFound("no such run")
    return run


class EdenNotFound(EdenError):
    status = 404
    kind = "not_found"


def _preview_of(known_as, previews: Path) -> Path:
    """Where the preview of the file ``known_as`` (its path, or a source's device and inode) is made."""
    return previews / f"{hashlib.sha256(str(known_as).encode()).hexdigest()[:32]}.mp4"


async def _playable(path: Path, previews: Path) -> Path:
    """``path`` where a browser plays it as it is, else its preview (made once, in ``previews``)."""
    info = await anyio.to_thread.run_sync(describe, path)
    if info.playable:
        return path
    previews.mkdir(parents=True, exist_ok=True)
    return await anyio.to_thread.run_sync(preview, path, _preview_of(path, previews), info.rate)


async def _play_source(page: Page, name) -> FileResponse:
    """A ``cloud:`` source as the browser plays it: the file opened (read by its descriptor, however
    it is renamed meanwhile), else a preview of its frames within the page's pixel limit."""
    video = await anyio.to_thread.run_sync(page.source, name)
    info = await anyio.to_thread.run_sync(describe_source, video)
    if info.playable:
        return FileResponse(video.source.through, media_type="video/mp4", stat_result=os.fstat(video.source.fd),
                            background=BackgroundTask(lambda: video))  # the descriptor open until it is sent
    page.previews.mkdir(parents=True, exist_ok=True)
    made = _preview_of(video.source.key, page.previews)
    return FileResponse(await anyio.to_thread.run_sync(preview, lambda: video.clip(page.args.max_pixels), made, info.rate))


def routes(page: Page) -> list:
    previews = page.previews

    async def index(request):
        return FileResponse(STATIC / "index.html")

    async def upload(request):
        length = request.headers.get("content-length")
        name = unquote(request.headers.get("x-clip-name", "clip"))
        item = await page.uploads.receive(request.stream(), int(length) if length and length.isdigit() else None, name)
        return JSONResponse({**item.to_json(), "play": f"/clips/{item.id}/play"})

    async def sign(request):
        target = request.query_params.get("path", "")
        if not SIGNABLE.fullmatch(target):
            raise BadInputError("sign takes the path of a clip's, a source's or a run's video or download")
        return JSONResponse({"url": page.signer.sign(target)})

    async def sources(request):
        return JSONResponse({"sources": await anyio.to_thread.run_sync(list_sources, page.media_root)})

    async def play_clip(request):
        item = page.uploads.get(request.path_params["key"])
        if item is None:
            raise EdenNotFound("no such clip")
        return FileResponse(await _playable(item.path, previews))

    async def source_info(request):
        name = request.query_params.get("name", "")
        info = await anyio.to_thread.run_sync(lambda: describe_source(page.source(name)))
        return JSONResponse({**info.to_json(), "play": f"/sources/play?name={quote(name, safe='')}"})

    async def play_source(request):
        return await _play_source(page, request.query_params.get("name", ""))

    async def runs(request):
        return JSONResponse({"runs": [page.snapshot(run) for run in page.runner.runs.values()]})

    async def preview_png(request):
        run = _run_of(page, request)
        if run.preview is None:
            raise EdenNotFound("no middle yet")
        return Response(run.preview, media_type="image/png")

    async def result(request):
        run = _run_of(page, request)
        if run.state != "done":
            raise EdenNotFound(f"the run is {run.state}")
        if request.url.path.endswith("/play"):
            return FileResponse(await _playable(run.output, run.output.parent))
        return FileResponse(run.output, filename=run.title)

    return [
        Route("/", index), Route("/uploads", upload, methods=["POST"]), Route("/sources", sources),
        Route("/clips/{key:str}/play", play_clip), Route("/sources/play", play_source),
        Route("/sources/info", source_info), Route("/runs", runs), Route("/sign", sign),
        Route("/runs/{key:str}/preview.png", preview_png), Route("/runs/{key:str}/play", result),
        Route("/runs/{key:str}/result", result), WebSocketRoute("/live", lambda ws: live(page, ws)),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]


async def live(page: Page, ws: WebSocket) -> None:
    """A page's connection: its run is started and cancelled here, and ends with it."""
    await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in ws.scope.get("subprotocols", []) else None)
    codecs = [*wire.CODECS, *([AUTO] if page.args.cloud else []), *([] if page.servers else [wire.NO_WIRE])]
    await ws.send_json({"type": "hello", "servers": page.servers, "split": bool(page.args.cloud), "codecs": codecs,
                        "sources": page.media_root is not None, "max_upload": page.args.max_upload})
    mine: list[Run] = []

    async def report():
        sent = None
        while True:
            if mine:
                state = json.dumps({"type": "run", **page.snapshot(mine[-1])})
                if state != sent:
                    try:
                        await ws.send_text(state)
                    except (WebSocketDisconnect, RuntimeError):  # closed under us: the receiver ends it
                        return
                    sent = state
            await anyio.sleep(SNAPSHOT_EVERY)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(report)
        try:
            while True:
                await _answer(page, ws, await ws.receive_text(), mine)
        except WebSocketDisconnect:
            pass
        finally:
            for run in mine:
                run.cancel.set()
                run.page_open = False
            tasks.cancel_scope.cancel()


def _message(text: str) -> dict:
    """A message of the page's, as JSON; raises BadInputError for what no page sends."""
    if len(text) > MAX_MESSAGE:
        raise BadInputError(f"a message of {len(text)} characters; the page reads at most {MAX_MESSAGE}")
    try:
        message = json.loads(text)
    except RecursionError:
        raise BadInputError("a message nested too deep to read") from None
    except ValueError:
        raise BadInputError("a message that is not JSON") from None
    if not isinstance(message, dict) or message.get("type") not in ("start", "cancel"):
        raise BadInputError("a message is a JSON object of type start or cancel")
    return message


async def _answer(page: Page, ws: WebSocket, text: str, mine: list[Run]) -> None:
    try:
        message = _message(text)
        if message["type"] == "cancel":
            for run in mine:
                run.cancel.set()
        elif mine and mine[-1].state in ("queued", "running"):
            raise BadInputError("this page's run is not over: cancel it first")
        else:
            mine.append(await page.start(message))
    except (EdenError, OSError) as exc:
        await ws.send_json({"type": "refused", "reason": page.scrub(f"{PROG}: {failure(exc)}")})


def application(settings: Settings) -> Guard:
    signer = Signer()
    page = Page(settings, signer)

    async def refusal(request, exc: EdenError):
        return JSONResponse({**exc.to_json(), "message": page.scrub(str(exc))}, status_code=exc.status)

    app = Starlette(routes=routes(page), exception_handlers={EdenError: refusal})
    app.state.page = page
    return Guard(app, settings.token, settings.hosts, signer)


def serve(settings: Settings, sock: socket.socket) -> None:
    """Serve the page on ``sock`` until Ctrl-C or SIGTERM; then every run is cancelled."""
    guarded = application(settings)
    config = uvicorn.Config(guarded, log_level="warning", lifespan="off", ws="websockets-sansio", ws_max_size=MAX_FRAME,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        guarded.app.state.page.runner.stop()

"""The page's web application (Starlette on uvicorn), behind :class:`~.guard.Guard`.

Routes: ``/`` and ``/static/`` (the page, package data), ``POST /uploads`` (a clip, the raw body),
``/sources`` and ``/sources/info`` (``cloud:NAME`` sources), ``/clips/ID/play`` and
``/sources/play`` (an original as the browser plays it), ``/runs`` (every run's state),
``/runs/ID/preview.png`` (the live preview), ``/runs/ID/play`` and ``/runs/ID/result`` (the result,
to play and to download), and the WebSocket ``/live``: the page starts and cancels its run there
and is sent its state; closing it cancels the run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import anyio
import anyio.to_thread
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from .. import wire
from ..client.pace import AUTO
from ..commands.shared import PROG, clip_in_process, clip_through, client_from, failure
from ..errors import BadInputError, EdenError
from .guard import Guard
from .media import describe, preview
from .options import expected_pairs, output_extension, run_arguments
from .runs import Run, Runner
from .uploads import Uploads, list_sources, source_path

STATIC = Path(__file__).with_name("static")
SNAPSHOT_EVERY = 0.25  # seconds between two looks at a page's run
GRACEFUL_SHUTDOWN = 5  # seconds the server gives open connections when it stops


@dataclass
class Settings:
    """What ``eden-serve page`` was started with."""

    args: argparse.Namespace  # its command line
    token: str
    hosts: set[str]
    port: int
    work: Path  # uploads, results and previews, nowhere else
    models: tuple | None  # the halves, in process; None: through the servers


class Page:
    """The application's state: the clips it was given and the runs, one at a time."""

    def __init__(self, settings: Settings):
        self.settings, self.args = settings, settings.args
        self.servers = settings.models is None
        self.media_root = Path(self.args.media_root) if self.args.media_root else None
        self.uploads = Uploads(settings.work / "uploads", self.args.max_upload, self.args.max_pixels)
        self.runner = Runner(self.execute)
        self.labels: dict[str, str] = {}

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
            if self.media_root is None:
                raise BadInputError("this page lists no cloud: sources (eden-serve page --media-root)")
            name = str(clip["source"])
            info = await anyio.to_thread.run_sync(describe, source_path(self.media_root, name), args.max_pixels)
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
        run = Run(key, args, source, folder / f"result{extension}", expected_pairs(args, info.frames), name)
        self.runner.submit(run)
        return run

    def snapshot(self, run: Run) -> dict:
        return run.snapshot(self.runner.position(run))


def _run_of(page: Page, request: Request) -> Run:
    run = page.runner.runs.get(request.path_params["key"])
    if run is None:
        raise EdenNotFound("no such run")
    return run


class EdenNotFound(EdenError):
    status = 404
    kind = "not_found"


async def _playable(path: Path, previews: Path) -> Path:
    """``path`` where a browser plays it as it is, else its preview (made once, in ``previews``)."""
    info = await anyio.to_thread.run_sync(describe, path)
    if info.playable:
        return path
    previews.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(str(path).encode()).hexdigest()[:32]
    return await anyio.to_thread.run_sync(preview, path, previews / f"{name}.mp4", info.rate)


def routes(page: Page) -> list:
    previews = page.settings.work / "previews"

    async def index(request):
        return FileResponse(STATIC / "index.html")

    async def upload(request):
        length = request.headers.get("content-length")
        name = unquote(request.headers.get("x-clip-name", "clip"))
        item = await page.uploads.receive(request.stream(), int(length) if length and length.isdigit() else None, name)
        return JSONResponse(item.to_json())

    async def sources(request):
        return JSONResponse({"sources": await anyio.to_thread.run_sync(list_sources, page.media_root)})

    async def play_clip(request):
        item = page.uploads.get(request.path_params["key"])
        if item is None:
            raise EdenNotFound("no such clip")
        return FileResponse(await _playable(item.path, previews))

    async def source_info(request):
        path = source_path(page.media_root, request.query_params.get("name", ""))
        return JSONResponse((await anyio.to_thread.run_sync(describe, path, page.args.max_pixels)).to_json())

    async def play_source(request):
        path = source_path(page.media_root, request.query_params.get("name", ""))
        return FileResponse(await _playable(path, previews))

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
            return FileResponse(await _playable(run.output, previews))
        return FileResponse(run.output, filename=run.title)

    return [
        Route("/", index), Route("/uploads", upload, methods=["POST"]), Route("/sources", sources),
        Route("/clips/{key:str}/play", play_clip), Route("/sources/play", play_source),
        Route("/sources/info", source_info), Route("/runs", runs),
        Route("/runs/{key:str}/preview.png", preview_png), Route("/runs/{key:str}/play", result),
        Route("/runs/{key:str}/result", result), WebSocketRoute("/live", lambda ws: live(page, ws)),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]


async def live(page: Page, ws: WebSocket) -> None:
    """A page's connection: its run is started and cancelled here, and ends with it."""
    await ws.accept()
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
                await _answer(page, ws, _message(await ws.receive_text()), mine)
        except WebSocketDisconnect:
            pass
        finally:
            for run in mine:
                run.cancel.set()
            tasks.cancel_scope.cancel()


def _message(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


async def _answer(page: Page, ws: WebSocket, message, mine: list[Run]) -> None:
    kind = message.get("type") if isinstance(message, dict) else None
    if kind == "cancel":
        for run in mine:
            run.cancel.set()
    elif kind == "start":
        if mine and mine[-1].state in ("queued", "running"):
            return await ws.send_json({"type": "refused", "reason": f"{PROG}: error: this page's run is not over: cancel it first"})
        try:
            mine.append(await page.start(message))
        except (EdenError, OSError) as exc:
            await ws.send_json({"type": "refused", "reason": f"{PROG}: {failure(exc)}"})


async def _refusal(request, exc: EdenError):
    return JSONResponse(exc.to_json(), status_code=exc.status)


def application(settings: Settings) -> Guard:
    page = Page(settings)
    app = Starlette(routes=routes(page), exception_handlers={EdenError: _refusal})
    app.state.page = page
    return Guard(app, settings.token, settings.hosts, settings.port)


def serve(settings: Settings, sock: socket.socket) -> None:
    """Serve the page on ``sock`` until Ctrl-C or SIGTERM; then every run is cancelled."""
    guarded = application(settings)
    config = uvicorn.Config(guarded, log_level="warning", lifespan="off", ws="websockets-sansio",
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        guarded.app.state.page.runner.stop()

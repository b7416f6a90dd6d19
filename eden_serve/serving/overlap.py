"""The edge's batching and overlap (docs/serving.md, "The edge's pace"): an edge worker call's
requests taken in their clips' order (:func:`earliest_first`, by the seeds their headers state),
opened on a thread of their own while the batch before computes, their pairs cut into forwards as
they come, and each forward run, in halves where it runs out of memory (:func:`forwards`).

Opening a request is the host's heavy part of it: the wire decode, the token codecs' decompression,
a bitstream payload's packets decoded, the frames' E_cond. :class:`Preparation` does it on its
preparation thread, one request ahead of the computing thread (``ahead``; 0: on the caller's thread,
the same steps in turn), in the order given, each failure kept as that request's refusal; on a GPU
on a stream of its own (:mod:`eden_serve.edge.streams`). :class:`Forwards` groups the pairs by frame
size and hands out a forward as soon as one is full, the rest once every request is opened: so
requests that share a batch still share forwards, and a full forward does not wait for the
requests behind it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import torch

from ..config import MAX_SEED
from ..edge import EdgeModel, StageClock
from ..edge.sizing import Sizing
from ..edge.streams import SideStream, StreamAPI, Ticket, streams_for
from ..edge.yuv import to_planes
from ..media.frames import as_pixels
from ..media.planes import PlaneFormat
from ..wire import Chunk, keyed
from ..wire.envelope import peek_header
from .refusals import Refusal, refusal, release_cached_memory

logger = logging.getLogger(__name__)

# Requests opened ahead of the one the computing thread takes: the next one, while this one computes.
PREPARE_AHEAD = 1
# On a GPU, requests opened at once, on as many threads: there opening a request is the host's work
# alone (a bitstream payload's packets decoded from their key frame, which no slice thread shares
# where the stream has one slice a frame, and its frames' digests; the token codecs' decompression),
# PyAV, hashlib and zstd let go of the GIL, and the forward waits for it (docs/gpu.md, "The served
# edge"). TorchServe's batchSize 4: a worker call's requests all at once. On a CPU the forward needs
# the cores, and one is opened ahead as before.
GPU_PREPARE_THREADS = 4


class HeaderSeeds(NamedTuple):
    """What a payload's header says of its pairs' seeds, before it is judged: an order, no more."""

    seeds: list[int]


def header_seeds(payload: bytes) -> HeaderSeeds | None:
    """The seeds ``payload``'s header states (a keyed tag skipped unchecked), or None: a forged
    header can reorder the pairs of one worker call, which changes no answer."""
    header = peek_header(keyed.verify(payload, None))
    seeds = header.get("seeds") if header else None
    if isinstance(seeds, list) and seeds and all(type(s) is int and 0 <= s <= MAX_SEED for s in seeds):
        return HeaderSeeds(seeds)
    return None


def earliest_first(chunks: Sequence, firsts: Sequence[int]) -> list[int]:
    """The requests of one worker call (indices into ``chunks``: each a wire Chunk or what else
    states its pairs' ``seeds``, such as :class:`HeaderSeeds`, or the refusal that failed it) in the
    order to compute their pairs: by the seed of the first pair each asks for (``firsts``). A client
    gives pair i of a clip the seed base + i, so a clip's chunks queued behind a busy worker run in
    the clip's order, not in the order their payloads happened to arrive: otherwise a first chunk
    that arrives last waits for the pairs of all the others (docs/streaming.md, "Where the first
    middle's time went"). Refusals come first (they cost nothing)."""

    def key(idx: int) -> int:
        seeds = getattr(chunks[idx], "seeds", None)
        # A request from first = pairs asks for the end record alone (docs/streaming.md): its last seed will do.
        return seeds[min(firsts[idx], len(seeds) - 1)] if seeds else -1

    return sorted(range(len(chunks)), key=key)


def device_tensors(chunk: Chunk) -> list[torch.Tensor]:
    """The tensors of ``chunk``'s conditions, which its opening made on the edge's device."""
    return [t for tokens in (chunk.cond_dit, chunk.cond_dec) for t in tokens if t is not None]


class Preparation:
    """Opens an edge call's requests ``ahead`` of the computing thread (see the module's docstring)."""

    def __init__(self, streams: StreamAPI, ahead: int = PREPARE_AHEAD, threads: int = 1):
        """``threads``: how many of the requests opened ahead are opened at once (at most ``ahead`` + 1)."""
        self.ahead = ahead
        self.side = SideStream(streams)
        self.thread = ThreadPoolExecutor(min(threads, ahead + 1), thread_name_prefix="eden-prepare") if ahead else None

    @classmethod
    def for_device(cls, device: torch.device) -> "Preparation":
        """The served edge's: on a GPU :data:`GPU_PREPARE_THREADS` requests opened at once, on a CPU the next one."""
        if device.type == "cpu":
            return cls(streams_for(device))
        return cls(streams_for(device), GPU_PREPARE_THREADS - 1, GPU_PREPARE_THREADS)

    def opened(self, open_: Callable[[int, Any], Chunk], jobs: Sequence, order: Sequence[int]) -> Iterator[tuple[int, Any]]:
        """``(idx, open_(idx, jobs[idx]))`` in ``order``, a refusal in place of what failed (a job
        that is a refusal already passes as it is); ready on the computing stream."""
        if self.thread is None:
            for idx in order:
                yield self._taken(idx, self._prepare(open_, idx, jobs[idx]))
            return
        pending: deque[tuple[int, Future]] = deque()
        try:
            for idx in order:
                pending.append((idx, self.thread.submit(self._prepare, open_, idx, jobs[idx])))
                if len(pending) > self.ahead:
                    yield self._taken(*self._result(pending.popleft()))
            while pending:
                yield self._taken(*self._result(pending.popleft()))
        finally:  # the caller stopped early: what has not started never will
            for _, future in pending:
                future.cancel()

    @staticmethod
    def _result(entry: tuple[int, Future]) -> tuple[int, tuple[Any, Ticket | None]]:
        idx, future = entry
        return idx, future.result()

    def _prepare(self, open_: Callable[[int, Any], Chunk], idx: int, job: Any) -> tuple[Any, Ticket | None]:
        if isinstance(job, Refusal):
            return job, None
        with self.side.making():
            try:
                outcome = open_(idx, job)
            except Exception as exc:  # this request's answer; the others go on
                return refusal(exc), None
            return outcome, self.side.hand_over()

    def _taken(self, idx: int, prepared: tuple[Any, Ticket | None]) -> tuple[int, Any]:
        outcome, ticket = prepared
        if ticket is not None:
            self.side.take(ticket, device_tensors(outcome) if isinstance(outcome, Chunk) else [])
        return idx, outcome

    def close(self) -> None:
        if self.thread is not None:
            self.thread.shutdown(wait=True)


class Forwards:
    """An edge call's (request, pair)s grouped by frame size, cut into forwards as ``sizing`` says."""

    def __init__(self, sizing: Sizing):
        self.sizing = sizing
        self.groups: dict[tuple, list[tuple[int, int]]] = {}

    def add(self, chunk: Chunk, pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        """Adds ``pairs`` of ``chunk``'s frame size; the forwards that are full now."""
        group = self.groups.setdefault((chunk.grid, chunk.size), [])
        group.extend(pairs)
        size = self.sizing.pairs(chunk.grid)
        full = []
        while len(group) >= size:
            full.append(group[:size])
            del group[:size]
        return full

    def rest(self) -> Iterator[list[tuple[int, int]]]:
        """The pairs not yet handed out, in forwards (each group's last, part full)."""
        for (grid, _), group in self.groups.items():
            if group:
                yield from self.sizing.batches(group, grid)


def forwards(model: EdgeModel, batch: list[tuple[int, int]], chunks: list,
             planes: PlaneFormat | None = None) -> Iterator[tuple[list, torch.Tensor | Refusal, dict]]:
    """(pairs, their middles [B, H, W, 3] uint8 on the host, or with ``planes`` on a GPU those planes
    [B, H 3/2, W], or the Refusal of them all, each stage's seconds) for the (request, pair)s of
    ``batch``, the requests' ``chunks`` opened. A batch that runs out of memory is tried again in
    halves, down to single pairs, before its pairs are refused with 507."""
    if not batch:
        return
    start = time.time()
    outcome = _attempt(model, [(chunks[idx], j) for idx, j in batch], planes)
    logger.info("edge forward of seeds %s from %.3f to %.3f", [chunks[idx].seeds[j] for idx, j in batch], start, time.time())
    # Out of _attempt(): the failure's traceback, and the batch's tensors it held, are gone.
    if isinstance(outcome, Refusal) and outcome.status == 507:
        release_cached_memory()
        if len(batch) > 1:
            half = len(batch) // 2
            logger.warning("a batch of %d pairs ran out of memory; trying %d and %d", len(batch), half, len(batch) - half)
            yield from forwards(model, batch[:half], chunks, planes)
            yield from forwards(model, batch[half:], chunks, planes)
            return
    if isinstance(outcome, Refusal):
        yield batch, outcome, {}
    else:
        yield (batch, *outcome)


def _attempt(model: EdgeModel, pairs: list[tuple[Chunk, int]], planes: PlaneFormat | None) -> tuple[torch.Tensor | list[torch.Tensor], dict] | Refusal:
    """One batched forward of pair j of each chunk, its stages timed by the forward's own clock; the
    middles as pixels on the host, each at its chunk's depth: 8 bits rounded on the device (a
    quarter of the bytes back; with ``planes`` on a GPU, converted to them there: half again); a
    batch with 16-bit chunks in it comes back in float32 and is rounded here, each pair as the
    in-process pipeline rounds it."""
    try:
        clock = StageClock(model.device)
        depths = [chunk.depth for chunk, _ in pairs]
        eight = all(depth == 8 for depth in depths)
        made = model.forward(model.prepare([chunk.pair(j) for chunk, j in pairs]), uint8=eight, clock=clock)
        # 4:2:0 planes need even sides ([B, H, W, 3]): an odd-sided chunk's middles come back as RGB, which planes_answer keeps.
        if eight and planes is not None and model.device.type == "cuda" and made.shape[1] % 2 == 0 == made.shape[2] % 2:
            made = to_planes(made, planes).reshape(len(made), -1, made.shape[2])
        middles = model.to_host(made)
        if not eight:
            middles = [as_pixels(frame[None], depth)[0] for frame, depth in zip(middles, depths)]
        return middles, clock.seconds()
    except Exception as exc:  # the batch's requests fail (or are tried in halves); the others go on
        return refusal(exc)

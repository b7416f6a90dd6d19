"""The edge's answers out: each request's middles encoded in its answer format (:mod:`.answer_formats`)
on threads of their own while the next forward computes, streamed in order as soon as each is
ready (:mod:`eden_serve.wire.answers`' records; docs/streaming.md), and at the end of the call its
answer: the middles whole, or the end record (or the refusal) of a streamed one."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, NamedTuple

import numpy as np
import torch

from ..wire import Chunk
from ..wire.answers import END, FAILED, MIDDLE, STREAMED, record
from .answer_formats import PNG_ANSWER, AnswerFormat
from .refusals import Refusal, refusal

# Threads that encode an edge batch's middles (and stream them) while the next batch computes: zlib releases the GIL.
PNG_THREADS = 2


class Reply(NamedTuple):
    body: bytes
    content_type: str


class EdgeJob(NamedTuple):
    payload: bytes
    stream: str | None  # None (a whole answer), or the transport that carries a streamed one: http, grpc
    first: int  # the chunk's first pair to answer: a client asking again for what did not arrive
    answer: AnswerFormat = PNG_ANSWER  # PNGs, or raw frames (:mod:`.answer_formats`)


class Answer:
    """What one request of an edge call has so far: its middles (encoded, or None until then; a
    cut pair's is in the payload) and the encodings under way, or the refusal of them all; the
    seconds its pairs took in each stage of the forward; and for a streamed answer the pair it sends
    next."""

    def __init__(self, chunk: Chunk, job: EdgeJob):
        self.refusal: Refusal | None = None
        try:
            self.middles: list = [job.answer.copy(chunk.copies[j]) if j in chunk.copies else None for j in range(chunk.pairs)]
        except Exception as exc:  # as an encoding's failure (Replies.encoded): this request's alone
            self.middles, self.refusal = [None] * chunk.pairs, refusal(exc)
        self.encodings: list[Future] = []
        self.seconds: dict[str, float] = {}
        self.first = job.first
        self.next: int | None = job.first if job.stream else None
        self.format = job.answer


class Replies:
    """The answers of an edge worker's calls, parts of them sent by ``send_part(idx, body,
    content type)`` before the call ends (TorchServe's intermediate responses; the handler sets it)."""

    def __init__(self, send_part: Callable[[int, bytes, str], None] | None = None):
        self.send_part = send_part
        self.pngs = ThreadPoolExecutor(PNG_THREADS, thread_name_prefix="eden-png")
        self.sending = threading.Lock()  # parts of answers go out one at a time, from the encoding threads too

    def begin(self, idx: int, chunk: Chunk, job: EdgeJob) -> Answer:
        """Request ``idx``'s answer, its cut pairs' middles streamed at once where they come first."""
        answer = Answer(chunk, job)
        with self.sending:
            self.send_ready(idx, answer)
        return answer

    def computed(self, part: list[tuple[int, int]], outcome: torch.Tensor | Refusal, seconds: dict[str, float],
                 answers: dict[int, Answer]) -> None:
        """A forward's outcome for its (request, pair)s: each middle handed to an encoding thread
        (:meth:`encoded`), or the refusal of their requests; the stages' seconds shared among them."""
        for n, (idx, j) in enumerate(part):
            answer = answers[idx]
            with self.sending:
                if isinstance(outcome, Refusal):
                    answer.refusal = outcome
                elif answer.refusal is None:
                    answer.encodings.append(self.pngs.submit(self.encoded, idx, answer, j, outcome[n].numpy()))
                    for stage, spent in seconds.items():
                        answer.seconds[stage] = answer.seconds.get(stage, 0.0) + spent / len(part)

    def encoded(self, idx: int, answer: Answer, j: int, pixels: np.ndarray) -> bytes | None:
        """On an encoding thread: pair ``j``'s middle in the request's answer format, streamed as
        soon as it is next in order."""
        try:
            data = answer.format.encode(pixels)
        except Exception as exc:  # this request fails alone: raised at the reply, it failed its whole batch (503)
            with self.sending:
                answer.refusal = answer.refusal or refusal(exc)
            return None
        with self.sending:
            answer.middles[j] = data
            if answer.refusal is None:
                self.send_ready(idx, answer)
        return data

    def send_ready(self, idx: int, answer: Answer) -> None:
        """Streams request ``idx``'s middles that are encoded and next in order (under ``sending``)."""
        while answer.next is not None and answer.next < len(answer.middles) and isinstance(answer.middles[answer.next], bytes):
            self.send_part(idx, record(MIDDLE, answer.next, answer.middles[answer.next]), STREAMED)
            answer.next += 1

    def reply(self, idx: int, answer: Answer, closing: set[int]) -> Reply | Refusal:
        """Request ``idx``'s answer: its middles whole, or the end of those it streamed (a stream
        with parts sent is TorchServe's to end: ``idx`` leaves ``closing``)."""
        if answer.refusal is None:
            # Each encoding's end, its part streamed included: a middle set but not yet sent must not
            # be answered whole behind the part (nor the end record sent before it).
            for encoding in answer.encodings:
                encoding.result()
        outcome = answer.middles if answer.refusal is None else answer.refusal
        if answer.next is not None and (answer.next > answer.first or answer.next == len(answer.middles)):  # streamed: this ends it
            if answer.next > answer.first:
                closing.discard(idx)
            if isinstance(outcome, Refusal):
                return Reply(record(FAILED, 0, json.dumps(outcome.document).encode()), STREAMED)
            return Reply(record(END, 0), STREAMED)
        if isinstance(outcome, Refusal):
            return outcome
        return Reply(*answer.format.whole(outcome[answer.first:]))

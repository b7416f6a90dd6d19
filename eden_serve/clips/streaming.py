"""The ordered, windowed streaming engine shared by the HTTP client and the in-process mode.

A clip of N frames is N - 1 pairs, cut into chunks of ``chunk`` = K pairs: K + 1 consecutive frames,
neighbouring chunks sharing their boundary frame (the last chunk may be shorter). Each chunk is
handed to a *processor*, a callable ``(i, frames, seed) -> Middles | [PIL.Image]`` giving the K
middle frames, where ``i`` is the chunk's first pair and pair i + j uses seed ``base_seed + i + j``,
on one of ``inflight`` worker threads (:mod:`.processors`). The main thread reads frames lazily, keeps at most
``inflight`` chunks outstanding and writes the output strictly in order (original i, middle i,
original i + 1, ...), so memory holds about ``inflight * (K + 1)`` input frames and as many
middles, whatever the clip length. ``ramp`` starts a level with chunks of 1, 1, 2, 4, ... pairs
(:func:`~eden_serve.clips.levels.chunk_end`), so that its first middle needs one pair's work. A
processor that streams hands over each middle of its chunk as soon as it has it; they are written
as they come, in order, and its final result must hold the same images. ``arrived.order`` numbers
the chunks 0, 1, 2, ... as they are submitted (all levels together), and the processor hears each
number (:meth:`~.processors.Processor.queued`) on the main thread before any worker runs it.
A factor of 4 or 8 chains two or three such passes, each over the frames of the one before
(:mod:`eden_serve.clips.levels`); any other factor, or a frame rate, computes only the middles its
frames show (:mod:`eden_serve.clips.retimed`). Both ask the run only what :mod:`.dispatch` declares:
how it chunks, and where its chunks go (:class:`~.dispatch.Dispatch`, to the processors' workers).
``resume`` keeps and continues a stopped run's output (:mod:`eden_serve.media.resume`).

Failures: a processor raising an :class:`EdenError` (or a :class:`TransientError` it did not retry)
stops the run with a :class:`PairError` naming the chunk's pairs (and, where it refused a file of
the input for good, :func:`~eden_serve.media.atomic.refused`, that file); anything else (a bug,
KeyboardInterrupt) propagates unchanged. Either way the output does not appear (see
:mod:`eden_serve.media.atomic`), chunks not yet started are dropped and the ``cancel`` event is set so
that processors waiting to retry give up; the processor is told (:meth:`~.processors.Processor.stopped`:
a client cuts its requests in flight) and the chunks in flight are waited for, before the output is
settled, so that no thread of the run is left, or writes, once the call has returned (:mod:`.workers`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from ..errors import BadInputError
from ..media import PIPE, Clip, Encoding, Frame, RawVideo, Retiming, open_clip, time_sequence, write_clip
from ..media.sequence import check_rate
from ..media.resume import Journal
from ..media.timing import DEFAULT_TIME_ERROR, MAX_DEPTH
from .dispatch import Chunking, Chunks, Dispatch
from .levels import Item, Level, Sink
from .processors import Cached, Middles, Processor, as_processor
from .resize import AtSize
from .retimed import retime
from .schedule import Schedule
from .workers import Workers

DEFAULT_INFLIGHT = 4
# Pairs per request: the wire carries each frame once per chunk (docs/performance.md "Clip chunks").
DEFAULT_CHUNK = 8
# A clip's per-chunk events at DEBUG, each record's time when it happened; args (first pair, pairs,
# event). The split client's: "cloud asked", "payload in", "edge asked", "middle J", "done"
# (benchmarks/two_hosts.py --timeline); an in-process run's: "cloud asked", "encoded", "payload in",
# "edge asked", "done" (the web page draws both).
TIMELINE = logging.getLogger("eden_serve.timeline")


@dataclass(frozen=True)
class ClipOptions:
    """How :func:`interpolate_clip` runs a clip (its docstring says what each option does)."""

    chunk: int = 1
    ramp: bool = False
    seed: int = 0
    factor: int | Fraction = 2
    inflight: int = DEFAULT_INFLIGHT
    progress: bool | None = None
    max_pixels: int | None = None
    resume: bool = False
    fps: Fraction | None = None
    time_error: Fraction = DEFAULT_TIME_ERROR
    encoding: Encoding | None = None
    process_size: tuple[int, int] | None = None
    raw: RawVideo | None = None
    input_fps: Fraction | None = None  # a directory of images written as a video: their rate (None: 25, said)
    # Of the run rather than the clip: set by whoever runs it.
    cancel: threading.Event | None = None
    fingerprint: dict | None = None
    watch: Callable[[Processor], Processor] | None = None
    first_middle: Callable[[], None] | None = None

    def __post_init__(self):
        if self.inflight < 1:
            raise BadInputError(f"inflight must be at least 1, got {self.inflight}")
        if self.chunk < 1:
            raise BadInputError(f"chunk must be at least 1 pair, got {self.chunk}")
        Retiming(Fraction(self.factor), self.fps, self.time_error)  # refused here, before any frame is read
        if self.input_fps is not None:
            check_rate(self.input_fps)

    @property
    def retiming(self) -> Retiming:
        return Retiming(Fraction(self.factor), self.fps, self.time_error)


def _size(count: float) -> str:
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


@dataclass
class Summary:
    pairs: int
    frames: int  # written
    seconds: float
    sent_bytes: int = 0
    received_bytes: int = 0
    payload_bytes: int | None = None  # total over the pairs, None where the payload is not seen
    retries: int = 0
    resumed: int = 0  # pairs an earlier run had done (not in ``pairs``)
    retiming: str = ""  # a retimed run's time error and cost
    chunks: int = 0
    encoder: str | None = None  # what encoded the output, where a writer on a thread of its own did
    encoder_seconds: float = 0.0  # the seconds its thread was busy converting and encoding

    def add(self, middles: Middles) -> None:
        """Counts a chunk's middles and what moving them cost."""
        self.pairs += len(middles.images)
        self.chunks += 1
        self.sent_bytes += middles.sent_bytes
        self.received_bytes += middles.received_bytes
        self.retries += middles.retries
        if middles.payload_bytes is not None:
            self.payload_bytes = (self.payload_bytes or 0) + middles.payload_bytes

    @property
    def pairs_per_second(self) -> float:
        return self.pairs / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        line = f"{self.pairs} pairs, {self.frames} frames written in {self.seconds:.2f} s: "
        line += f"{self.pairs_per_second:.2f} pairs/s"
        per_pair = []
        if self.pairs and self.sent_bytes:
            per_pair.append(f"{_size(self.sent_bytes / self.pairs)} sent")
            per_pair.append(f"{_size(self.received_bytes / self.pairs)} received")
        if self.pairs and self.payload_bytes is not None:
            per_pair.append(f"{_size(self.payload_bytes / self.pairs)} wire payload")
        line += f"; per pair: {', '.join(per_pair)}" if per_pair else ""
        line += f"; {self.retries} requests retried" if self.retries else ""
        line += f"; resumed after {self.resumed} pairs done before" if self.resumed else ""
        return line + (f"\n{self.retiming}" if self.retiming else "")

    def encoder_line(self) -> str | None:
        """The encoder's share of the run and of a chunk (``-v``): where it nears 1, the encoder is the bound."""
        if self.encoder is None or not self.seconds or not self.chunks:
            return None
        share, each = self.encoder_seconds / self.seconds, 1000 / self.chunks
        return (f"encoder {self.encoder}: busy {self.encoder_seconds:.2f} s of {self.seconds:.2f} s ({share:.0%}); "
                f"{self.encoder_seconds * each:.0f} ms of a chunk's {self.seconds * each:.0f} ms")


def progress_bar(total: int | None, enabled: bool | None) -> tqdm:
    """pairs/s on stderr; ``enabled=None`` shows it only when stderr is a terminal; never where the
    command was started with stderr closed (``2>&-``: None)."""
    disable = sys.stderr is None or (not sys.stderr.isatty() if enabled is None else not enabled)
    return tqdm(total=total, unit="pair", desc="interpolating", file=sys.stderr, disable=disable, dynamic_ncols=True)


class _Output:
    """The end of a run's stream: the writer, the summary's count of frames written and, for a
    resumable output, the checkpoints at which a resumed run can start; ``first_middle`` is called
    once the first middle has been handed to the writer."""

    def __init__(self, writer, journal: Journal | None, summary: Summary, chunk: int, closing: Fraction,
                 first_middle: Callable[[], None] | None = None):
        self.writer, self.journal, self.summary, self.chunk = writer, journal, summary, chunk
        self.closing = closing  # the position of the last middle before an original
        self.first_middle = first_middle

    def _handed(self) -> None:
        if self.first_middle is not None:
            first_middle, self.first_middle = self.first_middle, None
            first_middle()

    def push(self, item: Item) -> None:
        """The last level's stream."""
        if item.after is None:
            self.writer.add(item.before)
        else:
            self.writer.add_middle(item.image, item.before, item.after, item.position)
            self._handed()
        self.summary.frames += 1
        # Once all that comes before an original is written where every level has a chunk boundary,
        # a resumed run can start there and chunk (and batch) as this one.
        if (self.journal is not None and self.writer.continues and item.position == self.closing
                and item.after.index % self.chunk == 0):
            self.journal.save({"position": item.after.index, "writer": self.writer.checkpoint()})

    def place(self, picture, before: Frame, after: Frame | None, position: Fraction) -> None:
        """A retimed run's frames."""
        self.writer.place(picture, before, after, position)
        if after is not None:
            self._handed()
        self.summary.frames += 1

    def close(self) -> None:
        pass


def _write(clip: Clip, src, options: ClipOptions, processor: Processor, workers: Workers, writer, journal: Journal | None) -> Summary:
    """The clip's output: its levels, or its retimed frames, each level's chunks to ``processor``
    (through the journal's cache of middles where the output resumes level by level)."""
    depth = options.retiming.levels  # None: retimed
    levels = MAX_DEPTH if depth is None else depth
    processors = [processor] * levels
    if journal is not None and (depth is None or not writer.continues):
        processors = [Cached(processor, journal, level) for level in range(1, levels + 1)]
    # A resumed output holds the frames before original ``start``.
    start = journal.checkpoint["position"] if depth and journal is not None and journal.checkpoint else 0
    summary, factor = Summary(pairs=0, frames=0, seconds=0.0), 2**levels
    summary.resumed, summary.frames = (factor - 1) * start, factor * start
    total = (factor - 1) * (clip.length - 1) if clip.length and depth is not None else None
    schedule, chunking = Schedule(options.retiming), Chunking(options.chunk, options.ramp, options.inflight)
    output = _Output(writer, journal, summary, options.chunk, 1 - Fraction(1, factor), options.first_middle)
    with progress_bar(total, options.progress) as bar:
        bar.update(summary.resumed)
        chunks = Dispatch(processors, workers, options.seed, summary.add, bar)
        read = retime(clip, schedule, chunking, chunks, output) if depth is None else _leveled(clip, depth, start, chunking, chunks, output)
        if not read:
            raise BadInputError(f"{str(src)!r} holds no frames")
    summary.retiming = schedule.report() if depth is None else ""
    if journal is not None:
        summary.pairs -= journal.hits
        summary.resumed += journal.hits
    return summary


def _identity(clip: Clip, options: ClipOptions) -> dict:
    """What a resumed run must share with the run it continues (the newer keys only where set, so
    a plain run's journal reads as before)."""
    if str(clip.path) == PIPE:
        raise BadInputError("--resume needs an input file, not -: a pipe cannot be read again")
    retiming, encoding = options.retiming, options.encoding
    identity = {"input": clip.identity(), "frames": clip.length, "chunk": options.chunk, "seed": options.seed,
                **({"raw": str(options.raw)} if options.raw else {}), "processor": options.fingerprint or {},
                "factor": int(retiming.factor) if retiming.levels else str(retiming.factor)}
    extra = {"fps": retiming.fps and str(retiming.fps), "time_error": not retiming.levels and str(retiming.time_error),
             "encoding": encoding and encoding.given and encoding.identity(), "process_size": options.process_size,
             "input_fps": clip.kind == "directory" and getattr(clip, "rate", None) and str(clip.rate)}
    return identity | {key: value for key, value in extra.items() if value}


def _leveled(clip, depth: int, start: int, chunking: Chunking, chunks: Chunks, output: _Output) -> int:
    """A factor 2^depth output from original ``start`` on (a resumed run's output holds the frames
    before); returns the frames read."""
    sink: Sink = output
    for level in range(depth, 0, -1):
        sink = Level(level, start << (level - 1), sink, chunking, chunks)
    read = 0
    for frame in clip:
        read += 1
        if frame.index >= start:
            sink.push(Item(frame))
    if read:
        sink.close()
    return read


def interpolate_clip(src: str | Path | Clip, dst: str | Path, processor: Processor | Callable, options: ClipOptions | None = None,
                     **given) -> Summary:
    """Interpolate every pair of the clip ``src`` with ``processor`` (:mod:`.processors`; a plain
    function ``(index, frames, seed)`` too), ``chunk`` pairs per call, and write ``dst``: F(N - 1) + 1
    frames for a ``factor`` F of 2, 4 or 8. The options are ``options``' (:class:`ClipOptions`),
    or those ``given`` by name. ``ramp``: each level's first chunks are 1, 1, 2, 4, ... pairs (the
    first middle sooner; see the module's note).

    Factor 2^L runs L levels, each a 2x pass over the frames of the one before (its middles in
    their neighbours' pixel format), chunked and seeded as a pass of its own: pair k of a level
    uses ``seed + k``. So factor 4 equals two 2x runs with the same seed, chunk and processor.

    ``progress``: a progress bar on stderr (None: when stderr is a terminal). ``cancel`` is set when
    the run stops early, for processors to notice (the client's retries do). ``max_pixels`` limits
    the frame size (None: no limit here; a server applies its own). ``resume``: keep the partial
    output and a journal if the run stops, and continue from one left by an earlier run with the
    same input and options (:mod:`eden_serve.media.resume`); ``fingerprint`` is what else the middles
    depend on (the model, the servers, the codec), recorded in the journal.

    Any other ``factor`` (such as 5/2), or ``fps`` frames a second (video), is retimed within
    ``time_error`` (:mod:`eden_serve.clips.schedule`). ``encoding``: a video's encoder options.
    ``process_size`` (H, W): the model's frame size (:mod:`eden_serve.clips.resize`). ``raw``: the
    input is headerless video of that size, pixel format and rate. ``input_fps``: the rate of a
    directory of images written to a video's name (None: 25, said; :mod:`eden_serve.media.sequence`). ``src`` may also be a clip
    already opened (a server-side source, :mod:`eden_serve.client.remote`). ``watch`` wraps the
    processor (outside ``process_size``'s scaling), for a caller that shows each chunk as it is done
    or stops the run by raising (the web page, :mod:`eden_serve.page.runs`). ``first_middle`` is
    called once, on the reading thread, right after the run's first middle has been handed to the
    writer (the in-process edge starts its compilations ahead there: :mod:`eden_serve.edge.artefacts`).
    """
    options = replace(options, **given) if options is not None else ClipOptions(**given)
    options = replace(options, cancel=options.cancel if options.cancel is not None else threading.Event())
    processor = as_processor(processor).for_run(options.cancel)  # its state this run's: another run may share it
    if options.process_size is not None:
        processor = AtSize(processor, options.process_size, options.max_pixels)
    if options.watch is not None:
        processor = options.watch(processor)
    started = time.perf_counter()
    opened = src if isinstance(src, Clip) else open_clip(src, options.max_pixels if options.process_size is None else None,
                                                         options.raw)
    with opened as clip:
        time_sequence(clip, dst, options.input_fps)
        if options.fps is not None and clip.kind != "video" and getattr(clip, "rate", None) is None:
            why = ("an animation's frames keep delays of their own" if clip.kind == "animation"
                   else "a directory's frames have no times, unless written as a video (-o out.mp4 --input-fps RATE)")
            raise BadInputError(f"--fps needs a video; {why}: give --factor FPS/RATE (24 to 60: --factor 5/2)")
        journal = Journal(dst, _identity(clip, options)) if options.resume else None
        with write_clip(clip, dst, options.retiming, journal, options.encoding) as writer, \
                Workers(options.inflight, options.cancel, processor.stopped) as workers:
            # Middles that go to the writer alone (a 2x output, not kept for a resume) may come as its planes.
            if (getattr(writer, "planes", None) is not None and hasattr(processor, "planes") and options.retiming.levels == 1
                    and journal is None):
                processor.planes(writer.planes)
            summary = _write(clip, src, options, processor, workers, writer, journal)
    summary.seconds = time.perf_counter() - started
    summary.encoder, summary.encoder_seconds = getattr(writer, "encoder", None), getattr(writer, "busy", 0.0)
    return summary

"""The first middle of a clip's run taken apart (benchmarks/gpu_clip.py's rows, ``first_middle_parts``):
the wall-clock time at which the run reached each step on its way, read from the hooks the command
already has (the clip engine's ``watch``, the timeline events) and, for the steps that have none,
from the functions that end them, wrapped for the run alone (nothing is wrapped outside it):

- ``models ready``: the models' callable (``commands.clip_in_process``'s ``models``) returned;
- ``source checked``: the clip opened and closed before the models' load (commands/shared.py);
- ``decoder chosen``: ``clips.pipeline.decoded_by`` returned (beside a GPU: its trials, else at once);
- ``source opened``: the clip engine's ``open_clip`` returned;
- ``output opened``: the engine's ``write_clip`` gave its writer (the encoder opens on the writer's
  thread, at the first frame);
- ``frames decoded``: the first chunk's frames in, its processor called (the ``watch`` hook);
- ``E_cond done``: the first chunk's "payload in" event (its conditions made on the edge's device,
  as the host asked for them: a GPU's queued work lands in the next step);
- ``middle on the host``: its "done" event (the edge's forward, the copy back, waited for);
- ``handed to the writer``: the engine handed the first middle to the writer: the first middle's end.

The steps in the order they ended, each the seconds since the one before: those after the models
were ready (or after the run's start, where they were loaded before it) are ``first_middle_parts``
and sum to the first middle; those that ended while the models loaded are ``beside_weights``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from typing import Callable

from eden_serve.clips.processors import Wrapper
from eden_serve.clips.streaming import TIMELINE

READY, HANDED = "models ready", "handed to the writer"
# (step, module, attribute) of the steps read from the function that ends them.
ENDED_BY = (("source checked", "eden_serve.commands.shared", "_check_source"),
            ("decoder chosen", "eden_serve.clips.pipeline", "decoded_by"),
            ("source opened", "eden_serve.clips.streaming", "open_clip"))
EVENTS = {"payload in": "E_cond done", "done": "middle on the host"}  # the first chunk's timeline events


class _Events(logging.Handler):
    def __init__(self, marks: "FirstMiddle"):
        super().__init__(logging.DEBUG)
        self.marks = marks

    def emit(self, record):
        index, _, event = record.args
        if index == 0 and event in EVENTS:
            self.marks.mark(EVENTS[event], record.created)


class _Watched(Wrapper):
    """The processor, its first call marked; its middles as the output's planes where it gives them."""

    def __init__(self, inner, marks: "FirstMiddle"):
        super().__init__(inner)
        self.marks = marks

    def __call__(self, index, frames, seed, arrived=None):
        self.marks.mark("frames decoded")
        return self.inner(index, frames, seed, arrived)

    def planes(self, format) -> None:
        if hasattr(self.inner, "planes"):
            self.inner.planes(format)


class FirstMiddle:
    """The marks of one run: :meth:`watching` around it, :meth:`loaded` around its models' callable,
    :meth:`watch` as its ``watch`` hook."""

    def __init__(self):
        self.at: dict[str, float] = {}

    def mark(self, step: str, at: float | None = None) -> None:
        self.at.setdefault(step, time.time() if at is None else at)

    def loaded(self, models: Callable) -> Callable:
        def load():
            halves = models()
            self.mark(READY)
            return halves

        return load

    def watch(self, processor):
        return _Watched(processor, self)

    def _ending(self, step: str, function: Callable) -> Callable:
        def ended(*args, **kwargs):
            result = function(*args, **kwargs)
            self.mark(step)
            return result

        return ended

    @contextlib.contextmanager
    def watching(self):
        """The functions of :data:`ENDED_BY` wrapped, the timeline heard and the writer's first
        middle marked, for the block."""
        streaming = importlib.import_module("eden_serve.clips.streaming")
        events, push, write_clip = _Events(self), streaming._Output.push, streaming.write_clip

        def pushed(output, item):
            push(output, item)
            if item.after is not None:
                self.mark(HANDED)

        @contextlib.contextmanager
        def opened(*args, **kwargs):
            with write_clip(*args, **kwargs) as writer:
                self.mark("output opened")
                yield writer

        with contextlib.ExitStack() as stack:
            for step, module, attribute in ENDED_BY:
                owner = importlib.import_module(module)
                if hasattr(owner, attribute):  # a checkout before the source's check has none
                    stack.enter_context(_patched(owner, attribute, self._ending(step, getattr(owner, attribute))))
            stack.enter_context(_patched(streaming._Output, "push", pushed))
            stack.enter_context(_patched(streaming, "write_clip", opened))
            level = TIMELINE.level
            TIMELINE.addHandler(events)
            TIMELINE.setLevel(logging.DEBUG)
            stack.callback(TIMELINE.setLevel, level)
            stack.callback(TIMELINE.removeHandler, events)
            yield self

    def parts(self, started: float) -> tuple[dict[str, float], dict[str, float]]:
        """(``first_middle_parts``, ``beside_weights``): each step's seconds since the one before,
        those that ended while the models loaded counted from ``started`` (the run's start), the
        others from the models ready (where the run loaded them; else from ``started``)."""
        ready = self.at.get(READY, started)
        order = sorted((at, step) for step, at in self.at.items() if step != READY and at <= self.at[HANDED])
        first, beside, previous = {}, {}, started
        for at, step in order:
            if at >= ready:
                first[step], previous = at - max(previous, ready), at
            else:
                beside[step], previous = at - previous, at
        return first, beside


@contextlib.contextmanager
def _patched(owner, attribute: str, value):
    original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
    setattr(owner, attribute, value)
    try:
        yield
    finally:
        setattr(owner, attribute, original)

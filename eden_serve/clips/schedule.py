"""Where a retimed clip's output frames fall (``--fps``, or a ``--factor`` that is not a power of
two), and which middle frame each one shows.

EDEN makes only middles (t = 1/2), so the frames it can give between two originals are the dyadic
positions m / 2^d, each computed from its two parents one level up the 2x tree. An output frame
due at position p of its source interval shows the dyadic position nearest p among the shallowest
depths that come within the time error ``tolerance`` (by default a quarter of an output frame):
depth 0 is an original, depth 1 the middle, depth 2 the quarters, and so on. A depth d always
exists once interval / 2^(d + 1) is within the tolerance; past :data:`MAX_DEPTH` the nearest at
that depth is taken. Only the positions shown and their ancestors are computed.

Two clocks (:class:`~eden_serve.media.timing.Retiming`): ``--factor F`` counts in source frames
(output k at frame index k / F, up to the last original), ``--fps R`` in seconds (output k at
t0 + k / R while before the video's end, the frames after the last original showing it).
Positions are exact fractions throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import BadInputError
from ..media.timing import MAX_DEPTH, Retiming


@dataclass(frozen=True)
class Target:
    """An output frame: due at exact ``position`` of its interval, showing dyadic ``shown``."""

    position: Fraction
    shown: Fraction


def nearest_dyadic(position: Fraction, tolerance: Fraction) -> Fraction:
    """The dyadic fraction nearest ``position`` (in [0, 1]) at the shallowest depth within
    ``tolerance`` (both in units of the interval); at :data:`MAX_DEPTH` if none is."""
    for depth in range(MAX_DEPTH + 1):
        scale = 1 << depth
        shown = Fraction(math.floor(position * scale + Fraction(1, 2)), scale)
        if abs(shown - position) <= tolerance:
            return shown
    return shown


def ancestors(shown: Fraction) -> set[Fraction]:
    """The middles computed to show dyadic ``shown``: itself and its parents', up to the interval's
    ends (not included: they are originals)."""
    needed = set()
    stack = [shown]
    while stack:
        node = stack.pop()
        if node in needed or node.denominator == 1:
            continue
        needed.add(node)
        step = Fraction(1, node.denominator)
        stack += [node - step, node + step]
    return needed


@dataclass
class Schedule:
    """The targets of each source interval in turn, as the clip is read: ``interval(start, stop)``
    for consecutive originals (their times, or their indices under a factor), then ``tail`` for the
    last original. Keeps the statistics the summary reports."""

    retiming: Retiming
    origin: Fraction | None = None  # the first original's time
    next_output: int = 0
    intervals: int = 0
    middles: int = 0  # computed, ancestors included
    worst: Fraction = Fraction(0)  # time error, in output frames
    errors_in_seconds: bool = field(init=False)

    def __post_init__(self):
        self.errors_in_seconds = self.retiming.fps is not None
        self.step = 1 / self.retiming.fps if self.retiming.fps is not None else 1 / self.retiming.factor

    def _due(self) -> Fraction:
        return self.origin + self.next_output * self.step

    def interval(self, start: Fraction, stop: Fraction) -> list[Target]:
        """Outputs due in [start, stop)."""
        self.origin = start if self.origin is None else self.origin
        if stop <= start:
            raise BadInputError(f"source frames at {start} and {stop} are not in time order")
        length = stop - start
        tolerance = self.retiming.time_error * self.step / length
        targets = []
        while self._due() < stop:
            position = (self._due() - start) / length
            shown = nearest_dyadic(position, tolerance)
            self.worst = max(self.worst, abs(shown - position) * length / self.step)
            targets.append(Target(position, shown))
            self.next_output += 1
        self.intervals += 1
        self.middles += len(set().union(*(ancestors(t.shown) for t in targets))) if targets else 0
        return targets

    def tail(self, start: Fraction, end: Fraction | None) -> list[Target]:
        """Outputs from the last original on: under a factor just that original if one is due
        there; under ``--fps`` each frame due before the video's ``end``, all showing it."""
        self.origin = start if self.origin is None else self.origin
        targets = []
        stop = start if end is None or self.retiming.fps is None else end
        while self._due() < stop or self._due() == start:
            length = stop - start
            position = (self._due() - start) / length if length else Fraction(0)
            targets.append(Target(position, Fraction(0)))
            self.next_output += 1
        return targets

    def report(self) -> str:
        """The time error met and the cost, for the summary line."""
        worst = f"{float(self.worst):.2f} of an output frame"
        if self.errors_in_seconds:
            worst += f" ({float(self.worst * self.step * 1000):.1f} ms)"
        passes = self.middles / self.intervals if self.intervals else 0
        return (f"{self.retiming.describe()}: each frame within {worst} of its time "
                f"(bound {self.retiming.time_error}); {passes:.2f} EDEN passes per source interval")

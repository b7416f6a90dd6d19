"""``--codec auto``: the wire codec that lets a split deployment go fastest, from what the client measures.

With requests in flight, payloads cross the link while the edge computes earlier ones, so the slower
of the two sets the pace: pairs/s = min(link bytes/s / payload bytes per pair, the edge's pairs/s).
The frames codec sends a twentieth of bf16+zstd's bytes but adds E_cond and the frames' decoding to
the edge's work, so it wins where the link is the bottleneck, and bf16+zstd (the split as designed)
where the edge is (docs/wire-codecs.md).
"""

from __future__ import annotations

import threading

from .. import wire
from ..errors import BadInputError
from ..wire import DEFAULT_CODEC, FRAMES_CODEC

AUTO = "auto"
CANDIDATES = (FRAMES_CODEC, DEFAULT_CODEC)
# Paces this close count as equal, and go to the default codec, which costs the edge less work.
TIE = 0.02


def choose_codec(payload_bytes_per_pair: dict[str, float], link_bytes_per_second: float, edge_pairs_per_second: float,
                 default: str = DEFAULT_CODEC) -> str:
    """The codec of the highest pace min(link / payload, edge); within :data:`TIE` of it, ``default``."""
    paces = {codec: min(link_bytes_per_second / size, edge_pairs_per_second) for codec, size in payload_bytes_per_pair.items()}
    best = max(paces.values())
    if default in paces and paces[default] >= (1 - TIE) * best:
        return default
    return max(paces, key=paces.get)


class BusyTime:
    """How long a resource was busy with overlapping requests: the union of their intervals, and
    what they moved. Only the last ``window`` intervals count, so the rate follows a changing link."""

    def __init__(self, window: int = 16):
        self.window = window
        self._spans: list[tuple[float, float, float]] = []

    def add(self, start: float, end: float, amount: float) -> None:
        self._spans = (self._spans + [(start, end, amount)])[-self.window :]

    def rate(self) -> float | None:
        """``amount`` per busy second, or None before anything was measured."""
        busy, reach = 0.0, float("-inf")
        for start, end, _ in sorted(self._spans):
            busy += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        return sum(amount for *_, amount in self._spans) / busy if busy > 0 else None


class FixedCodec:
    """The codec ``codec`` for every chunk (None: the cloud's default), except that a chunk of a
    server-side source goes as the source's own packets where ``codec`` is that kind's name."""

    def __init__(self, codec: str | None):
        self.codec, kind = codec, wire.KINDS.get(codec)
        self.sources = kind is not None and kind.from_source

    def next(self) -> str | None:
        return self.codec

    def downloaded(self, codec: str, pairs: int, payload_bytes: int, start: float, end: float) -> None:
        pass

    def answered(self, pairs: int, start: float, end: float) -> None:
        pass


def codec_policy(codec: str | None, split: bool) -> "FixedCodec | AutoCodec":
    """The split client's codec per chunk: ``codec`` itself, or the policy it names (:data:`POLICIES`:
    ``auto``, in the split only, picks a codec for the link between cloud and edge)."""
    policy = POLICIES.get(codec)
    if policy is None:
        return FixedCodec(codec)
    if not split:
        raise BadInputError(f"codec {codec} picks a codec for the link between cloud and edge: give cloud and edge, not server")
    return policy()


class AutoCodec:
    """The split client's codec per chunk, from the latest measurements: payload bytes per pair per
    codec, the link's rate from the payloads' downloads, and the edge's pairs per busy second.

    It starts with the frames codec, the smallest payload, and keeps to it while it has no
    measurement or while the link is what holds it back (any other codec's larger payloads would be
    held back more). Where the edge is the bottleneck, each other codec is tried once (its payload
    size is known only once sent), and from then on every chunk takes :func:`choose_codec`'s pick.
    Thread-safe: chunks start and end on several threads."""

    sources = True  # a server-side source's chunks go as its own packets, the fewest bytes there are

    def __init__(self, candidates: tuple[str, ...] = CANDIDATES):
        self.candidates = candidates
        self.link = BusyTime()
        self.edge = BusyTime()
        self.payload_bytes_per_pair: dict[str, float] = {}
        self._started: set[str] = set()
        self._lock = threading.Lock()

    def next(self) -> str:
        first = self.candidates[0]
        with self._lock:
            self._started.add(first)
            link, edge, sizes = self.link.rate(), self.edge.rate(), self.payload_bytes_per_pair
            if link is None or edge is None or first not in sizes:
                return first
            untried = [codec for codec in self.candidates if codec not in self._started]
            if untried and link / sizes[first] > edge:  # the edge holds the first codec back: another may do as well
                self._started.add(untried[0])
                return untried[0]
            return choose_codec(sizes, link, edge)

    def downloaded(self, codec: str, pairs: int, payload_bytes: int, start: float, end: float) -> None:
        """A payload of ``pairs`` pairs came down from the cloud between ``start`` (its first byte) and ``end``."""
        with self._lock:
            self.payload_bytes_per_pair[codec] = payload_bytes / pairs
            self.link.add(start, end, payload_bytes)

    def answered(self, pairs: int, start: float, end: float) -> None:
        """The edge answered ``pairs`` pairs, asked at ``start``, at ``end``."""
        with self._lock:
            self.edge.add(start, end, pairs)


# The codec names that name a policy of the client's rather than a payload kind.
POLICIES: dict[str, type[AutoCodec]] = {AUTO: AutoCodec}

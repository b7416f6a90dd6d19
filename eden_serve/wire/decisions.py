"""What the cloud decided about a chunk's pairs, whatever kind carries the chunk: one record,
:class:`Decisions`, and the one header builder and checker that every wire format shares.

Every payload's header starts with the model it was made for (``fingerprint``, ``hidden_dim``) and
its ``codec``; the frames and bitstream formats add ``cloud``, the digest of the cloud weights the
edge re-derives the conditions with; every format carries the decisions: ``differences`` and
``seeds`` (one per pair) and ``cuts``, and ``depth`` (16) where the frames are deeper than 8 bits,
so that the edge answers middles of 16 bits (absent: 8; docs/video.md, "Depth and colour"). The token
format writes each cut with the bytes of its middle (``[pair, bytes]``), the others the pair alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEPTHS = (8, 16)  # the bits a channel of a chunk's frames holds

from ..config import MAX_SEED, EdenConfig
from ..errors import CodecError
from .envelope import REENCODE, check_model, cloud_digest, cut_pairs, float32_list, integer, invalid, seed_list, to_float32


@dataclass
class Decisions:
    """What the cloud decided about a chunk's K pairs: the same for every kind that carries it."""

    differences: list[float]  # K: each pair's standardised frame-difference scalar
    seeds: list[int]  # K: each pair's noise seed
    cuts: list[int] = field(default_factory=list)  # the pairs across a scene cut, increasing
    cloud: str | None = None  # digest of the cloud weights, where the edge re-derives the conditions
    depth: int = 8  # bits a channel of the frames and of their middles: 8, or 16 for frames deeper than 8

    @property
    def pairs(self) -> int:
        return len(self.seeds)


class Decided:
    """A chunk of any kind, its decisions read through (``chunk.seeds`` is ``chunk.decisions.seeds``)."""

    decisions: Decisions

    @property
    def differences(self) -> list[float]:
        return self.decisions.differences

    @property
    def seeds(self) -> list[int]:
        return self.decisions.seeds

    @property
    def cuts(self) -> list[int]:
        return self.decisions.cuts

    @property
    def cloud(self) -> str | None:
        return self.decisions.cloud

    @property
    def pairs(self) -> int:
        return self.decisions.pairs

    @property
    def depth(self) -> int:
        return self.decisions.depth


def header(config: EdenConfig, codec: str, decisions: Decisions, frames: int, fields: dict, *, cloud: bool = True) -> dict:
    """A header: the model, the codec, the cloud's digest where the format carries one (``cloud``),
    the format's own ``fields``, then the decisions about a chunk of ``frames`` frames. Each value
    is checked as the sender's (``chunk.NAME ...``)."""
    if len(decisions.differences) != frames - 1 or len(decisions.seeds) != frames - 1:
        raise invalid("differences", f"and seeds must number {frames - 1}, one per pair", payload=False)
    head = {"fingerprint": config.fingerprint(), "hidden_dim": config.hidden_dim, "codec": codec}
    if cloud:
        head["cloud"] = cloud_digest(decisions.cloud, payload=False)
    if decisions.depth not in DEPTHS:
        raise invalid("depth", f"must be one of {DEPTHS}, got {decisions.depth!r:.20}", payload=False)
    return {
        **head,
        **fields,
        "differences": [to_float32(v, "differences") for v in decisions.differences],
        "seeds": [integer(s, "seeds", MAX_SEED, payload=False) for s in decisions.seeds],
        "cuts": [integer(j, "cuts", frames - 2, payload=False) for j in sorted(set(decisions.cuts))],
        **({} if decisions.depth == 8 else {"depth": decisions.depth}),  # 8-bit payloads as they were before it
    }


def check_header(header: dict, keys: set[str], codecs: tuple[str, ...], version: int, config: EdenConfig) -> str:
    """A header's keys (exactly ``keys``), model and codec (one of ``codecs``, those of format
    ``version``), checked in that order; the codec."""
    if set(header) - {"depth"} != keys:
        kind = "" if len(codecs) > 1 else f" of the {codecs[0]} codec"
        raise CodecError(f"malformed payload: header has {str(sorted(header)):.200}, not the keys {sorted(keys)}{kind}; {REENCODE}")
    check_model(header, config)
    codec = header["codec"]
    if codec not in codecs:
        carried = ", ".join(codecs) if len(codecs) > 1 else repr(codecs[0])
        raise invalid("codec", f"is {codec!r:.40}, but format {version} carries only {carried}")
    return codec


def read_decisions(header: dict, frames: int, cloud: str | None = None, cuts: list[int] | None = None) -> Decisions:
    """The decisions a header states for ``frames`` frames (``cuts``: already read, where the format
    writes them its own way)."""
    differences = float32_list(header["differences"], "differences", frames - 1)
    seeds = seed_list(header["seeds"], frames - 1)
    return Decisions(differences, seeds, cut_pairs(header["cuts"], frames - 1) if cuts is None else cuts, cloud, read_depth(header))


def read_depth(header: dict) -> int:
    """The bits a channel of the chunk's frames holds: 16 where the header says so, else 8."""
    depth = header.get("depth", 8)
    if "depth" in header and (type(depth) is not int or depth != 16):
        raise invalid("depth", f"must be 16 where it is given (8 goes without it), got {depth!r:.20}")
    return depth

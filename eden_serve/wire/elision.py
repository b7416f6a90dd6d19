"""A bitstream payload (format 4) without its packets' bytes, for a client that holds them already.

For a server-side source the client reads the video's packets from the cloud once, to write the
originals (:mod:`eden_serve.client.remote`); the cloud then answers a bitstream chunk with the
payload it made, tag and digest included, less the packets' bytes (:func:`elide`), and the client
puts its own copies back (:func:`restore`) before handing the payload to the edge. The edge gets
the very bytes the cloud sealed and signed: each packet crosses the link once, keyed payloads keep
working, and a packet the client got wrong fails the payload's digest (400) like any corruption.
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import CodecError
from .bitstream import NO_TIME, RECORD
from .envelope import DIGEST_SIZE, PREFIX
from .keyed import TAGGED_PREFIX, is_tagged


def _table(data: bytes) -> tuple[np.ndarray, int]:
    """The packet table of a (possibly tagged, possibly elided) bitstream payload, and where the
    packets' bytes start."""
    start = TAGGED_PREFIX if is_tagged(data) else 0
    if len(data) < start + PREFIX.size + DIGEST_SIZE:
        raise CodecError("bitstream answer: too short for a payload")
    _, _, _, header_len = PREFIX.unpack_from(data, start)
    body = start + PREFIX.size + header_len
    try:
        count = json.loads(bytes(data[start + PREFIX.size:body]))["packets"]
    except (ValueError, KeyError, TypeError):
        raise CodecError("bitstream answer: its header is not a bitstream payload's") from None
    if type(count) is not int or not 0 < count or body + count * RECORD.itemsize > len(data) - DIGEST_SIZE:
        raise CodecError("bitstream answer: its packet table does not fit")
    table = np.frombuffer(data, RECORD, count, body)
    return table, body + count * RECORD.itemsize


def elide(payload: bytes) -> bytes:
    """``payload`` less its packets' bytes (which end where its digest starts)."""
    table, start = _table(payload)
    total = int(table["length"].sum())
    return payload[:start] + payload[start + total:]


def wanted(elided: bytes) -> list[tuple[int, int | None, int]]:
    """(pts, dts, length) of each packet an elided payload lacks, in order."""
    table, _ = _table(elided)
    return [(int(r["pts"]), None if r["dts"] == NO_TIME else int(r["dts"]), int(r["length"])) for r in table]


def restore(elided: bytes, packets: list[bytes]) -> bytes:
    """The whole payload: ``elided`` with the packets' bytes back in place."""
    table, start = _table(elided)
    if start != len(elided) - DIGEST_SIZE:
        raise CodecError("bitstream answer: bytes where its packets belong; it is not an elided payload")
    if [len(p) for p in packets] != [int(n) for n in table["length"]]:
        raise CodecError("bitstream answer: the packets held here differ in size from those it names")
    return b"".join([elided[:start], *packets, elided[start:]])

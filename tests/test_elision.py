"""Bitstream payloads without their packets' bytes (eden_serve/wire/bitstream.py: elide, fill): what
the cloud leaves out, the client puts back, byte for byte, tag included; and nothing else fits."""

from __future__ import annotations

from fractions import Fraction

import pytest

from eden_serve import wire
from eden_serve.config import preset
from eden_serve.errors import CodecError
from eden_serve.media.packets import PacketReader
from eden_serve.wire import Decisions, keyed
from eden_serve.wire import bitstream as elision
from eden_serve.wire.bitstream import BITSTREAM_CODEC, BitstreamChunk
from test_video import real_video

pytest.importorskip("av")
CONFIG = preset("tiny")


@pytest.fixture(scope="module")
def payload_and_packets(tmp_path_factory):
    path = real_video(tmp_path_factory.mktemp("v") / "gops.mp4", 20, Fraction(25), source="bikes.mp4", size=(96, 64), audio=None,
                      options={"g": "6", "bf": "2", "sc_threshold": "0"})
    reader = PacketReader(path)
    span = reader.needed(8, 11)  # between key frames
    packets = [p for p in reader if span.key <= p.index <= span.end]
    chunk = BitstreamChunk(reader.parameters, packets, span.skip, 4, ["0" * 32] * 4, Decisions([0.5] * 3, [1, 2, 3], [], "ab" * 32))
    return wire.encode(chunk, CONFIG, BITSTREAM_CODEC), packets


@pytest.mark.parametrize("key", [None, b"k" * 32])
def test_what_is_left_out_is_put_back_byte_for_byte(payload_and_packets, key):
    payload, packets = payload_and_packets
    payload = payload if key is None else keyed.sign(payload, key)
    elided = elision.elide(payload)
    assert len(payload) - len(elided) == sum(len(p.data) for p in packets) > 0
    assert elision.wanted(elided) == [(p.pts, p.dts, len(p.data)) for p in packets]
    assert elision.fill(elided, [p.data for p in packets]) == payload
    decoded = wire.decode(keyed.verify(elision.fill(elided, [p.data for p in packets]), key), CONFIG)
    assert [(p.data, p.pts, p.dts, p.key) for p in decoded.packets] == [(p.data, p.pts, p.dts, p.key) for p in packets]


def test_packets_of_other_sizes_or_an_unelided_payload_are_refused(payload_and_packets):
    payload, packets = payload_and_packets
    elided = elision.elide(payload)
    with pytest.raises(CodecError, match="differ in size"):
        elision.fill(elided, [p.data for p in packets][1:])
    with pytest.raises(CodecError, match="differ in size"):
        elision.fill(elided, [p.data + b"x" for p in packets])
    with pytest.raises(CodecError, match="not an elided payload"):
        elision.fill(payload, [p.data for p in packets])
    with pytest.raises(CodecError):
        elision.wanted(elided[:40])

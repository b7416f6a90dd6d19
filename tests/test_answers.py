"""The edge's answers as the client reads them: whole, or streamed as records that a transport may
cut anywhere."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from eden_serve.wire.answers import END, FAILED, MIDDLE, StreamedAnswer, record, whole_answer, zip_of
from eden_serve.errors import ServerError, TransientError
from eden_serve.media.frames import png_bytes

SIZE = (40, 24)  # width, height


def png(value: int, size=SIZE, mode="RGB") -> bytes:
    return png_bytes(Image.new(mode, size, (value,) * len(mode)))


def stream(first: int, pairs: int) -> bytes:
    return b"".join(record(MIDDLE, j, png(j)) for j in range(first, pairs)) + record(END, 0)


def colours(middles) -> list[tuple[int, int]]:
    return [(j, image.getpixel((0, 0))[0]) for j, image in middles]


@pytest.mark.parametrize("cut", [1, 7, 9, 100, 10_000])
def test_a_stream_cut_anywhere_reads_the_same(cut):
    data = stream(0, 4)
    answer = StreamedAnswer(0, 4, SIZE, "(test)")
    got = []
    for start in range(0, len(data), cut):
        got += answer.feed(data[start:start + cut])
    assert colours(got) == [(j, j) for j in range(4)]
    assert answer.finish()


def test_a_stream_from_a_later_pair():
    answer = StreamedAnswer(2, 5, SIZE, "(test)")
    assert colours(answer.feed(stream(2, 5))) == [(2, 2), (3, 3), (4, 4)]
    assert answer.finish()


def test_a_stream_cut_short_is_not_finished():
    data = stream(0, 3)
    answer = StreamedAnswer(0, 3, SIZE, "(test)")
    got = answer.feed(data[: len(data) - 20])
    assert colours(got) == [(0, 0), (1, 1)] and not answer.finish()


@pytest.mark.parametrize("data, message", [
    (record(MIDDLE, 1, png(1)), "pair 1 where pair 0 was due"),
    (record(MIDDLE, 0, png(0)) + record(END, 0), "ended after pair 0 of a chunk of 2"),
    (record(b"X", 0, b""), "should not"),
    (record(MIDDLE, 0, b"\0" * 200_000), "should not"),  # longer than any PNG of a 40x24 frame
    (record(MIDDLE, 0, png(0, (41, 24))), "41x24 PNG, for frames of 40x24"),
    (record(MIDDLE, 0, png(0, mode="L")), "not in 8- or 16-bit RGB"),
    (record(FAILED, 0, b"not a document"), "without an error document"),
    # Before: taken, and handed on as pair 2 of a 2-pair chunk (an IndexError in a clip run), or
    # without end from a server that kept sending them.
    (record(MIDDLE, 0, png(0)) + record(MIDDLE, 1, png(1)) + record(MIDDLE, 2, png(2)), "pair 2 where the chunk's pairs end at 1"),
])
def test_a_hostile_stream_is_refused(data, message):
    with pytest.raises(ServerError, match=message):
        StreamedAnswer(0, 2, SIZE, "(test)").feed(data)


def test_an_error_record_is_the_servers_error():
    refusal = json.dumps({"code": 400, "type": "bad_payload", "message": "broken"}).encode()
    with pytest.raises(ServerError, match="broken") as info:
        StreamedAnswer(0, 2, SIZE, "(test)").feed(record(MIDDLE, 0, png(0)) + record(FAILED, 0, refusal))
    assert (info.value.status, info.value.kind) == (400, "bad_payload")
    failure = json.dumps({"code": 507, "type": "out_of_memory", "message": "no memory"}).encode()
    with pytest.raises(TransientError, match="no memory"):  # worth asking again, as a 5xx
        StreamedAnswer(0, 2, SIZE, "(test)").feed(record(FAILED, 0, failure))


def test_nothing_may_follow_the_end():
    answer = StreamedAnswer(0, 1, SIZE, "(test)")
    answer.feed(stream(0, 1))
    with pytest.raises(ServerError, match="should not"):
        answer.feed(record(MIDDLE, 1, png(1)))


def test_a_whole_answer_is_a_png_or_a_zip_of_them():
    assert whole_answer(png(3), 1, SIZE, "")[0].getpixel((0, 0)) == (3, 3, 3)
    images = whole_answer(zip_of([png(j) for j in range(3)]), 3, SIZE, "")
    assert [image.getpixel((0, 0))[0] for image in images] == [0, 1, 2]
    with pytest.raises(ServerError, match="not a zip of 2"):
        whole_answer(zip_of([png(j) for j in range(3)]), 2, SIZE, "")


def test_a_zip_of_a_version_zipfile_lacks_is_a_bad_answer():
    """Found by the fuzzer (harness/fuzz.py): zipfile raised NotImplementedError through the client."""
    archive = bytearray(zip_of([png_bytes(Image.new("RGB", SIZE))] * 2))
    central = archive.index(b"PK\x01\x02")
    archive[central + 6:central + 8] = (84).to_bytes(2, "little")  # version needed to extract: 8.4
    with pytest.raises(ServerError, match="not a zip of 2 PNGs"):
        whole_answer(bytes(archive), 2, SIZE, "(test)")

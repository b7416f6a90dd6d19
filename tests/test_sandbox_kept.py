"""The sandbox's kept children (eden_serve/media/sandboxed.py, eden_serve/sandbox/kept.py): a child
that decoded a stream's chunk goes on with the next chunk's packets it was not sent, where those it
had are that payload's first; the frames are the in-process decode's in any order of the chunks,
and where a packet differs; a kept child past its deadline is killed; no child outlives the
sandbox's close, nor its eviction; and frames answered never change after, whatever their child
does."""

from __future__ import annotations

import dataclasses
import os
import select
import time

import numpy as np
import pytest

from eden_serve.errors import CodecError, TooMuchWorkError
from eden_serve.media import packets as in_process
from eden_serve.media import sandboxed
from eden_serve.media.packets import PacketReader
from harness.videos import local_frames, make_clip
from test_continued import CHUNK, COUNT, MADE, SIZE, chunks


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, tuple[PacketReader, list, list[np.ndarray]]]:
    made = {}
    for name, (codec, options) in MADE.items():
        path = make_clip(tmp_path_factory.mktemp("kept") / name, codec, options, SIZE, COUNT)
        reader = PacketReader(path)
        made[name] = reader, list(reader), local_frames(path)
    return made


@pytest.fixture
def box():
    sandbox = sandboxed.Sandbox()
    yield sandbox
    sandbox.close()


def frames_of(box: sandboxed.Sandbox, reader: PacketReader, payload: tuple[int, list, int], total: int, deadline=sandboxed.DEADLINE_S):
    first, packets, skip = payload
    return box.decode(reader.parameters, packets, skip, min(CHUNK + 1, total - first), deadline=deadline)


def ended(pidfd: int) -> bool:
    """Whether the process has exited (its pidfd reads as ready), waiting 5 s at most."""
    return bool(select.select([pidfd], [], [], 5.0)[0])


def kept_pids(box: sandboxed.Sandbox) -> list[int]:
    return [kept.decoder.pid for kept in box.kept.kept.values()]


@pytest.mark.parametrize("name", sorted(MADE))
def test_chunks_in_order_go_on_in_one_child_to_the_clips_frames(clips, box, name):
    reader, packets, expected = clips[name]
    payloads = chunks(reader, packets)
    for payload in payloads:
        got = frames_of(box, reader, payload, len(expected))
        assert all(np.array_equal(got[i], expected[payload[0] + i]) for i in range(len(got))), payload[0]
    goes_on = sum(before[1][0] == after[1][0] for before, after in zip(payloads, payloads[1:]))
    assert box.continued == goes_on > 0
    assert box.children == len(payloads) - goes_on
    # Each packet of a GOP crosses once: the chunks sent whole would send far more.
    assert box.sent == sum(len(p[1]) for p in payloads) - sum(
        len(before[1]) for before, after in zip(payloads, payloads[1:]) if before[1][0] == after[1][0])
    assert box.sent < sum(len(p[1]) for p in payloads)


def test_chunks_out_of_order_or_asked_again_are_the_clips_frames(clips, box):
    reader, packets, expected = clips["long_gop.mp4"]
    payloads = chunks(reader, packets)
    for index in [0, 1, 3, 2, 2, 4, 0, 5, 6, 6]:
        payload = payloads[index % len(payloads)]
        got = frames_of(box, reader, payload, len(expected))
        assert all(np.array_equal(got[i], expected[payload[0] + i]) for i in range(len(got))), index
    assert box.continued >= 2  # 0 to 1, 2 to 4 (3 then 2 again: backwards, a new child)


def test_a_changed_packet_is_decoded_from_its_key_frame_as_in_process(clips, box):
    """A payload whose packets differ by a byte from those a kept child had is never decoded by that
    child: a new child decodes it whole, to what this process decodes of it."""
    reader, packets, expected = clips["long_gop.mp4"]
    payloads = chunks(reader, packets)
    frames_of(box, reader, payloads[0], len(expected))
    first, later, skip = payloads[1]
    changed = [later[0], dataclasses.replace(later[1], data=later[1].data[:-1] + bytes([later[1].data[-1] ^ 1])), *later[2:]]
    count = min(CHUNK + 1, len(expected) - first)
    try:
        want = in_process.decode(reader.parameters, changed, skip, count)
    except CodecError as exc:
        with pytest.raises(type(exc)):
            box.decode(reader.parameters, changed, skip, count)
    else:
        assert np.array_equal(box.decode(reader.parameters, changed, skip, count), want)
    assert box.continued == 0 and box.children == 2


def test_a_kept_child_past_its_deadline_is_killed_and_the_next_chunk_gets_a_new_one(clips):
    reader, packets, expected = clips["long_gop.mp4"]
    payloads = chunks(reader, packets)
    box = sandboxed.Sandbox("harness.standins:hang_going_on")
    try:
        frames_of(box, reader, payloads[0], len(expected))
        (pid,) = kept_pids(box)
        pidfd = os.pidfd_open(pid)
        with pytest.raises(TooMuchWorkError, match="deadline of 1 s"):
            frames_of(box, reader, payloads[1], len(expected), deadline=1.0)
        assert ended(pidfd) and box.continued == 0 and not box.kept.kept
        os.close(pidfd)
        got = frames_of(box, reader, payloads[1], len(expected))  # a new child, from the key frame
        assert all(np.array_equal(got[i], expected[payloads[1][0] + i]) for i in range(len(got)))
    finally:
        box.close()


def test_no_kept_child_outlives_the_sandbox_nor_its_eviction(clips):
    box = sandboxed.Sandbox(keep=1)
    try:
        (name, (reader, packets, expected)), (other, (reader_b, packets_b, expected_b)) = clips.items()
        frames_of(box, reader, chunks(reader, packets)[0], len(expected))
        (evicted,) = kept_pids(box)
        pidfd = os.pidfd_open(evicted)
        frames_of(box, reader_b, chunks(reader_b, packets_b)[0], len(expected_b))
        assert ended(pidfd), "the least recently used child was let go but lives on"
        os.close(pidfd)
        (last,) = kept_pids(box)
        pidfd = os.pidfd_open(last)
    finally:
        box.close()
    assert ended(pidfd), "a kept child outlived the sandbox's close"
    os.close(pidfd)


def test_an_idle_kept_child_is_ended(clips, box):
    reader, packets, expected = clips["long_gop.mp4"]
    payloads = chunks(reader, packets)
    frames_of(box, reader, payloads[0], len(expected))
    (pid,) = kept_pids(box)
    pidfd = os.pidfd_open(pid)
    box.kept.idle_s = 0.0
    other_reader, other_packets, other_expected = clips["hevc.mp4"]
    frames_of(box, other_reader, chunks(other_reader, other_packets)[0], len(other_expected))
    assert ended(pidfd)
    os.close(pidfd)


def test_frames_answered_stay_as_answered_though_their_child_stays_to_write_over_them(clips):
    """A child that keeps its frames mapped and writes over them after answering (a compromised
    decoder, which also keeps itself from ending) is ended before the frames are read, which are
    sealed against writing: they never change once decoded, and that child is not kept."""
    reader, packets, expected = clips["long_gop.mp4"]
    box = sandboxed.Sandbox("harness.standins:scribble")
    try:
        got = frames_of(box, reader, chunks(reader, packets)[0], len(expected))
        first = got.copy()
        time.sleep(0.3)
        assert np.array_equal(got, first), "a child wrote over frames already answered"
        assert not box.kept.kept and box.children == 1
    finally:
        box.close()

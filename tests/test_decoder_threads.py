"""The threads of the edge's decoder of bitstream payloads (eden_serve/sandbox/decoder.py): its frames
are the same, bit for bit, with slice threads, frame threads or one thread; and a decoder let go of
with packets in hand (mid-stream, after refusing a frame over its limit, after a stream changed its
frame size mid-chunk) ends without hanging, whichever threads it has. Each such case runs in a
process of its own under a timeout, so that a hang fails the test rather than stalling the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from eden_serve.media.packets import PacketReader
from eden_serve.sandbox import decoder
from harness.videos import make_clip

ROOT = Path(__file__).resolve().parents[1]
THREADS = (("SLICE", 4), ("FRAME", 4), ("SLICE", 1))


def slices(packet: bytes) -> int:
    """The coded slices (NAL units 1 and 5) of an H.264 packet in MP4's length-prefixed form."""
    count, at = 0, 0
    while at < len(packet):
        size = int.from_bytes(packet[at : at + 4], "big")
        count += packet[at + 4] & 31 in (1, 5)
        at += 4 + size
    return count


@pytest.mark.parametrize("options", [{"x264-params": "sliced-threads=0"}, {"threads": "4"}], ids=["one slice", "slices"])
def test_the_frames_are_the_same_bit_for_bit_whatever_the_decoders_threads(tmp_path, monkeypatch, options):
    reader = PacketReader(make_clip(tmp_path / "clip.mp4", "libx264", {"crf": "18", **options}, (144, 256), 24))
    packets = list(reader)
    assert (min(slices(packet.data) for packet in packets) > 1) == ("threads" in options)  # slice threads have work or none
    decoded = []
    for kind, count in THREADS:
        monkeypatch.setattr(decoder, "DECODER_THREAD_TYPE", kind)
        monkeypatch.setattr(decoder, "DECODER_THREADS", count)
        decoded.append(decoder.decode(reader.parameters, packets, 0, len(packets)))
    assert all(np.array_equal(decoded[0], pixels) for pixels in decoded[1:])


# Each round: a header declaring less than the stream's own parameter sets (refused as the decoder
# parses them); a stream whose second key frame carries parameter sets for frames four times larger
# (refused at that frame); a decoder fed part of a stream and let go of; then a payload decoded whole.
LET_GO = """
import gc, sys
from dataclasses import replace
from eden_serve.errors import CodecError
from eden_serve.media.packets import PacketReader
from eden_serve.sandbox import decoder
from harness.videos import in_band, make_clip

decoder.DECODER_THREAD_TYPE, folder = sys.argv[1], sys.argv[2]

small = PacketReader(make_clip(f"{folder}/small.mp4", "libx264", {"x264-params": "sliced-threads=0"}, (72, 128), 12))
large = PacketReader(make_clip(f"{folder}/large.mp4", "libx264", {"x264-params": "sliced-threads=0"}, (144, 256), 12))
ahead, behind = list(small), list(large)
key = replace(behind[0], data=in_band(large.parameters.extradata) + behind[0].data)
shift = 2 * max(p.pts for p in ahead)  # after every time of the first stream
grown = ahead + [replace(p, pts=p.pts + shift, dts=p.dts + shift) for p in [key, *behind[1:]]]
refused = 0
for _ in range(20):
    for parameters, packets, count in ((replace(large.parameters, width=64, height=32), behind, 12),
                                       (small.parameters, grown, 24)):
        try:
            decoder.decode(parameters, packets, 0, count)
        except CodecError:
            refused += 1
    stream = decoder.Stream(large.parameters, behind)
    next(stream.frames(behind, drain=False))
    del stream
    gc.collect()
    assert decoder.decode(large.parameters, behind, 0, 12).shape == (12, 144, 256, 3)
print(refused)
"""


@pytest.mark.parametrize("kind", ["SLICE", "FRAME"])
def test_a_decoder_let_go_of_with_packets_in_hand_ends_without_hanging(tmp_path, kind):
    """Frame threads with the packets lent from Python's bytes hung here (PyAV frees a codec context
    holding the GIL, which the decoder's threads need to let go of those packets)."""
    script = textwrap.dedent(LET_GO)
    try:
        done = subprocess.run([sys.executable, "-c", script, kind, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a {kind}-threaded decoder let go of with packets in hand hung the process")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["40"]  # both refusals, every round

"""Audio an output's container takes but cannot hold as it is, re-encoded in the container's own
codec as FFmpeg's command line does, not failed with or lost: PCM from Matroska into MP4 (ISO's
ipcm, which failed as the file ended) or MPEG-TS (written as private data, read back as no audio),
FLAC or Opus into MOV (refused as the header was written); a Blu-ray's LPCM is kept in a .m2ts,
whose muxer types it there alone."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip

av = pytest.importorskip("av")

from harness.videos import mux_grey_frames  # noqa: E402  (PyAV, which the skip above asks for)

RATE = 48000


def average(index, frame0, frame1, seed):
    """A stand-in model: the mean of the two frames."""
    mean = (np.asarray(frame0.image, np.float32) + np.asarray(frame1.image, np.float32)) / 2
    return Image.fromarray(mean.round().astype(np.uint8))


def with_audio(path, audio: str, frames: int = 3):
    """A file of ``frames`` 64x48 frames at 25 a second and a 440 Hz stereo tone in ``audio``."""
    if audio not in av.codecs_available:
        pytest.skip(f"this PyAV build has no {audio} encoder")
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=25)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        sound = container.add_stream(audio, rate=RATE, layout="stereo")
        mux_grey_frames(container, video, frames)
        samples = RATE * frames // 25
        wave = (0.3 * np.sin(2 * np.pi * 440 * np.arange(samples) / RATE)).astype(np.float32)
        for start in range(0, samples, 960):
            chunk = np.ascontiguousarray(np.repeat(wave[None, start:start + 960], 2, axis=0))
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
            frame.sample_rate, frame.pts, frame.time_base = RATE, start, Fraction(1, RATE)
            for packet in sound.encode(frame):
                container.mux(packet)
        for packet in sound.encode():
            container.mux(packet)
    return path


@pytest.mark.parametrize("audio, suffix, made", [("pcm_s16le", ".mp4", "aac"), ("pcm_s16le", ".ts", "mp2"),
                                                 ("flac", ".mov", "aac"), ("flac", ".ts", "mp2"),
                                                 ("pcm_s16le", ".mov", None), ("flac", ".mp4", None), ("ac3", ".ts", None),
                                                 ("pcm_bluray", ".m2ts", None), ("pcm_bluray", ".ts", "mp2")])
def test_audio_the_output_cannot_hold_as_it_is_is_re_encoded_not_lost(tmp_path, audio, suffix, made):
    src = with_audio(tmp_path / ("in.m2ts" if audio == "pcm_bluray" else "in.mkv"), audio)  # a Blu-ray's LPCM
    dst = tmp_path / f"out{suffix}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, dst, pairwise(average), progress=False)
    said = [str(w.message) for w in caught if "re-encoded" in str(w.message)]
    with av.open(str(dst)) as container:
        assert [s.type for s in container.streams] == ["video", "audio"]
        given = container.streams.audio[0].codec_context.codec.canonical_name
        heard = sum(frame.samples for frame in container.decode(audio=0))
    assert given == (made or av.Codec(audio, "w").canonical_name)
    assert len(said) == (made is not None)
    assert heard >= RATE * 3 // 25 * 0.9  # the sound is all there, within an encoder's frame

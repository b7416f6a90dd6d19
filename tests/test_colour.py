"""eden_serve.media.colour: a video's colour tags (primaries, transfer, matrix, range), its chroma
location and HDR10's metadata (mastering display, content light level) go from the input's stream
to the output's, through every encoder this PyAV has for them; the chroma location is read from
H.264's and HEVC's parameter sets as FFmpeg's own parser reads them; a change of depth is said in
one line; the encoders' own logs stay off stderr unless -v. Clips are made here with the installed
PyAV's encoders."""

from __future__ import annotations

import dataclasses
import io
import struct
import subprocess
import sys
import warnings
import zlib
from fractions import Fraction

import av
import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.media import Encoding
from eden_serve.media.chroma import chroma_location
from eden_serve.media.colour import FULL, LIMITED, Colour, Mastering
from eden_serve.media.frames import png_bytes, to_pixels
from eden_serve.wire.png import rgb16_png
from harness.videos import bar_means, bars, gradient, local_frames, make_graded_clip, traced

av = pytest.importorskip("av")

SIZE = (48, 64)
# A P3-D65 mastering display of 1000 cd/m², as HDR10 masters state it.
P3 = Mastering((Fraction(34000, 50000), Fraction(16000, 50000)), (Fraction(13250, 50000), Fraction(34500, 50000)),
               (Fraction(7500, 50000), Fraction(3000, 50000)), (Fraction(15635, 50000), Fraction(16450, 50000)),
               (Fraction(50, 10000), Fraction(1000)))
COLOURS = {
    # BT.2020, PQ, BT.2020 NCL, chroma sited top left (as UHD masters site it)
    "hdr10": (Colour(9, 16, 9, LIMITED, P3, (1000, 400), chroma=3), "yuv420p10le"),
    "hlg": (Colour(9, 18, 9, LIMITED), "yuv420p10le"),
    "bt709": (Colour(1, 1, 1, LIMITED), "yuv420p"),
    "bt601": (Colour(6, 6, 6, LIMITED), "yuv420p"),  # SMPTE 170M
    "bt709-full": (Colour(1, 1, 1, FULL), "yuv420p"),
}
AV1 = next((name for name in ("libsvtav1", "libaom-av1") if name in av.codecs_available), None)
ENCODERS = ["libx264", "libx265", *([AV1] if AV1 else []), "ffv1"]
# The encoders that hold HDR10's metadata neither in their stream nor, through the container, in Matroska.
LOSE_METADATA = {"libaom-av1"}


def blend(index, frame0, frame1, seed):
    """A stand-in model: the mean of the two frames, at their depth."""
    return to_pixels((frame0.tensor + frame1.tensor) / 2, frame0.depth)


def stated(path) -> tuple[Colour, str]:
    """The colour an output states (its stream's tags and its first frame's HDR metadata), and its pixel format."""
    with av.open(str(path)) as container:
        context = container.streams.video[0].codec_context
        first = next(container.decode(video=0))
        return Colour.of_stream(context).with_side_data(first), context.pix_fmt


def same_metadata(got: Colour, sent: Colour) -> bool:
    """Within the units the encoders write (0.00002 and 0.0001 cd/m²)."""
    if got.light != sent.light or (got.mastering is None) != (sent.mastering is None):
        return False
    if sent.mastering is None:
        return True
    pairs = zip((got.mastering.red, got.mastering.green, got.mastering.blue, got.mastering.white, got.mastering.luminance),
                (sent.mastering.red, sent.mastering.green, sent.mastering.blue, sent.mastering.white, sent.mastering.luminance))
    return all(abs(a - b) <= Fraction(1, 10000) for x, y in pairs for a, b in zip(x, y))


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("name", list(COLOURS))
def test_colour_tags_and_hdr_metadata_are_kept(tmp_path, name, encoder):
    colour, pix_fmt = COLOURS[name]
    src = make_graded_clip(tmp_path / "in.mkv", "libx265" if colour.mastering else "ffv1", pix_fmt, SIZE, 3, colour,
                           {"crf": "12"} if colour.mastering else None)
    source, _ = stated(src)
    assert source == colour  # the clip states what it was made with
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, tmp_path / "out.mkv", pairwise(blend), progress=False, encoding=Encoding(encoder))
    got, out_fmt = stated(tmp_path / "out.mkv")
    assert out_fmt.replace("yuvj", "yuv") == pix_fmt  # FFmpeg's H.264 decoder calls full-range 4:2:0 yuvj420p
    assert (got.primaries, got.transfer, got.matrix, got.range) == (colour.primaries, colour.transfer, colour.matrix, colour.range)
    said = [str(w.message) for w in caught]
    if colour.mastering and encoder in LOSE_METADATA:
        assert got.mastering is None and len(said) == 1 and f"{encoder} has no place for the input's HDR metadata" in said[0]
    else:
        assert same_metadata(got, colour) and not said


@pytest.mark.parametrize("encoder, suffix", [("ffv1", ".mkv"), ("libvpx-vp9", ".webm"), ("libvpx-vp9", ".mp4"), ("ffv1", ".avi"),
                                             ("prores", ".mov"), ("prores", ".mkv"), ("prores_ks", ".mov")])
def test_hdr10_metadata_goes_into_the_container_where_the_encoder_has_no_place_for_it(tmp_path, encoder, suffix):
    """Matroska, MP4 and MOV state it for FFV1, VP9 and ProRes (the bundled libvpx encodes 8 bits: its
    output is rounded to them, said in one line); AVI cannot, nor can another encoder of ProRes
    than FFmpeg's first (the container's template makes that one), which one line says."""
    colour, pix_fmt = COLOURS["hdr10"]
    src = make_graded_clip(tmp_path / "in.mkv", "libx265", pix_fmt, SIZE, 3, colour, {"crf": "12"})
    out = tmp_path / f"out{suffix}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, out, pairwise(blend), progress=False, encoding=Encoding(encoder))
    said = [str(w.message) for w in caught if "HDR metadata" in str(w.message)]
    got, _ = stated(out)
    if suffix == ".avi" or encoder == "prores_ks":
        assert got.mastering is None and got.light is None and len(said) == 1 and "nor has this output's container" in said[0]
    else:
        assert same_metadata(got, colour) and not said
        assert (got.primaries, got.transfer, got.matrix, got.range) == (9, 16, 9, LIMITED)


# (encoder, pixel format, options): profiles, scaling lists, reference sets predicted from one another,
# long-term references, sample aspect ratios and other VUI fields before the chroma location.
STREAMS = [("libx264", "yuv420p", {"x264-params": "cqm=jvt:sar=16/11:overscan=show:colorprim=bt2020"}),
           ("libx264", "yuv420p", {"profile": "baseline"}), ("libx264", "yuv420p10le", {}),
           ("libx265", "yuv420p10le", {"x265-params": "scaling-list=default:bframes=8:b-pyramid=1:ref=5"}),
           ("libx265", "yuv420p", {"x265-params": "sar=16:1:keyint=5:rc-lookahead=5:bframes=3"}),
           ("libx265", "yuv444p12le", {})]


@pytest.mark.parametrize("suffix", [".mkv", ".mp4", ".ts"])  # avcC/hvcC, and Annex B extradata
@pytest.mark.parametrize("encoder, pix_fmt, options", STREAMS)
def test_the_chroma_location_reads_as_ffmpegs_own_parser_reads_it(tmp_path, suffix, encoder, pix_fmt, options):
    for chroma in (0, 1, 3, 6):  # unstated, left, top left, bottom; 8 frames: MPEG-TS needs bytes to probe
        path = make_graded_clip(tmp_path / f"{chroma}{suffix}", encoder, pix_fmt, SIZE, 8, Colour(chroma=chroma), options)
        with av.open(str(path)) as container:
            context = container.streams.video[0].codec_context
            read = chroma_location(context.name, context.extradata)
        top = traced(path, "chroma_sample_loc_type_top_field")  # x264 and x265 state none outside 4:2:0, nor left
        default = 1 if pix_fmt.startswith("yuv420") else 0  # an SPS stating none: left, for 4:2:0 alone (unknown else)
        assert read == (default if top is None else top + 1) and read in (chroma or default, 0), (read, top)


@pytest.mark.skipif(AV1 != "libsvtav1", reason="SVT-AV1 writes the chroma sample position it is told")
def test_an_av1_streams_chroma_location_reads_as_ffmpegs_own_parser_reads_it(tmp_path):
    for chroma in (0, 1, 3):  # unknown, left (vertical), top left (colocated)
        path = make_graded_clip(tmp_path / f"{chroma}.mkv", AV1, "yuv420p", SIZE, 2, Colour(chroma=chroma))
        with av.open(str(path)) as container:
            read = Colour.of_stream(container.streams.video[0].codec_context).chroma
        assert read == {0: 0, 1: 1, 2: 3}[traced(path, "chroma_sample_position")] == chroma


# A codec's stream that states no chroma location: as a player of it takes it (H.264, MPEG-2,
# MPEG-4 Part 2: left; JPEG: centre), and unknown outside 4:2:0.
DEFAULT_SITING = [("libx264", ".mp4", "yuv420p", 1), ("mpeg2video", ".mkv", "yuv420p", 1), ("mpeg4", ".avi", "yuv420p", 1),
                  ("mjpeg", ".mkv", "yuvj420p", 2), ("libx265", ".mkv", "yuv444p", 0)]


@pytest.mark.parametrize("codec, suffix, pix_fmt, sited", DEFAULT_SITING)
def test_an_unstated_chroma_location_is_the_codecs_default(tmp_path, codec, suffix, pix_fmt, sited):
    src = make_graded_clip(tmp_path / f"in{suffix}", codec, pix_fmt, SIZE, 3)
    with av.open(str(src)) as container:
        assert Colour.of_stream(container.streams.video[0].codec_context).chroma == sited


@pytest.mark.parametrize("encoder", ["y4m", "ffv1", *([AV1] if AV1 else [])])
def test_an_ordinary_h264_clips_output_states_its_left_chroma(tmp_path, encoder):
    """x264 states no chroma location by default: its 4:2:0 chroma is sited left, and so is the
    output's (Y4M's C420mpeg2, where it stated C420jpeg: centre; Matroska's ChromaSiting for FFV1,
    SVT-AV1's chroma_sample_position, where they stated none)."""
    src = make_graded_clip(tmp_path / "in.mp4", "libx264", "yuv420p", SIZE, 3)
    out = tmp_path / ("out.y4m" if encoder == "y4m" else "out.mkv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Y4M leaves no tags out here, but says what it would
        interpolate_clip(src, out, pairwise(blend), progress=False, encoding=Encoding(None if encoder == "y4m" else encoder))
    if encoder == "y4m":
        assert b" C420mpeg2 " in out.read_bytes()[:80]
    else:
        assert chroma_sited(out, encoder) == "left"


def chroma_sited(path, encoder: str) -> str | None:
    """Where ``path``'s chroma location says its chroma samples sit, as its encoder's stream or its
    container states it."""
    if encoder == "ffv1":  # Matroska's ChromaSitingHorz and ChromaSitingVert (1: co-sited)
        data = path.read_bytes()
        sited = [data[data.find(key) + 3] if data.find(key) >= 0 else None for key in (b"\x55\xb7\x81", b"\x55\xb8\x81")]
        return {(1, 1): "top left", (1, 2): "left"}.get(tuple(sited))
    if encoder.startswith("libx26"):
        return {0: "left", 2: "top left"}.get(traced(path, "chroma_sample_loc_type_top_field"))
    return {1: "left", 2: "top left"}.get(traced(path, "chroma_sample_position"))  # AV1: vertical, colocated


@pytest.mark.parametrize("encoder", ENCODERS)
def test_the_chroma_location_is_carried(tmp_path, encoder):
    colour, pix_fmt = COLOURS["hdr10"]
    src = make_graded_clip(tmp_path / "in.mkv", "libx265", pix_fmt, SIZE, 3, colour, {"crf": "12"})
    assert chroma_sited(src, "libx265") == "top left"
    interpolate_clip(src, tmp_path / "out.mkv", pairwise(blend), progress=False, encoding=Encoding(encoder))
    assert chroma_sited(tmp_path / "out.mkv", encoder) == "top left"


@pytest.mark.parametrize("suffix, encoder, lost", [(".mp4", "libvpx-vp9", True), (".avi", "ffv1", True), (".mov", "mpeg4", True),
                                                   (".mkv", "ffv1", False), (".mov", "libx265", False), (".mp4", "libx264", False)])
def test_a_chroma_location_the_output_cannot_state_is_said_in_one_line(tmp_path, suffix, encoder, lost):
    """Top left (as HDR10 masters site it), where a reader takes left unless told: MP4, MOV and AVI
    hold no chroma location, nor do VP9's, FFV1's and MPEG-4's streams; Matroska and x264's and
    x265's streams do."""
    src = make_graded_clip(tmp_path / "in.mkv", "libx264", "yuv420p", SIZE, 3, Colour(1, 1, 1, LIMITED, chroma=3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, tmp_path / f"out{suffix}", pairwise(blend), progress=False, encoding=Encoding(encoder))
    said = [str(w.message) for w in caught if "chroma location" in str(w.message)]
    assert len(said) == (1 if lost else 0), said


@pytest.mark.parametrize("colour, subsampled, lost, defaults", [
    (Colour(1, 1, 0, FULL), False, "primaries and transfer", "(no primaries or transfer)"),  # RGB: no range to lose
    (Colour(1, 1, 1, FULL, chroma=3), True, "chroma location and matrix and primaries and range and transfer",
     "(no primaries or transfer, BT.601's matrix, limited range, chroma sited left)"),
    (Colour(2, 2, 1, LIMITED), False, "matrix", "(BT.601's matrix)"),
])
def test_a_tag_left_out_names_what_a_reader_takes_instead_of_it_alone(colour, subsampled, lost, defaults):
    """The line names the defaults a reader takes for what the output lost, not every default: an
    RGB output into AVI loses its primaries and transfer, and a range or matrix it never had is no
    news."""
    from eden_serve.media.pixel_formats import say_lost
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        say_lost("avi", "rawvideo", colour, subsampled)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and f"the input's {lost}:" in said[0] and said[0].endswith(f"takes its defaults {defaults}"), said


def test_originals_pass_through_ffv1_bit_exact_at_10_bits_with_their_tags(tmp_path):
    colour = COLOURS["hdr10"][0]
    src = make_graded_clip(tmp_path / "in.mkv", "ffv1", "yuv420p10le", SIZE, 4, colour)
    interpolate_clip(src, tmp_path / "out.mkv", pairwise(blend), progress=False)

    def planes(path):
        with av.open(str(path)) as container:
            return [[bytes(plane) for plane in frame.planes] for frame in container.decode(video=0)]

    assert planes(tmp_path / "out.mkv")[::2] == planes(src)
    got, pix_fmt = stated(tmp_path / "out.mkv")
    assert pix_fmt == "yuv420p10le" and (got.primaries, got.transfer, got.matrix, got.range) == (9, 16, 9, LIMITED)


def test_a_change_of_depth_is_said_in_one_line(tmp_path):
    src = make_graded_clip(tmp_path / "in.mkv", "ffv1", "yuv420p10le", SIZE, 3, COLOURS["hlg"][0])
    with pytest.warns(UserWarning) as caught:
        interpolate_clip(src, tmp_path / "out.mkv", pairwise(blend), progress=False, encoding=Encoding("libx264", pix_fmt="yuv420p"))
    assert [str(w.message) for w in caught] == [
        "the output's pixel format yuv420p holds 8 bits: the input's 10-bit yuv420p10le frames are rounded to it"]
    assert stated(tmp_path / "out.mkv")[1] == "yuv420p"


def test_an_explicit_10_bit_pix_fmt_is_taken_from_an_8_bit_input(tmp_path):
    src = make_graded_clip(tmp_path / "in.mkv", "ffv1", "yuv420p", SIZE, 3, COLOURS["bt709"][0])
    with pytest.warns(UserWarning, match="holds 10 bits: the input's 8-bit yuv420p frames are widened to it"):
        interpolate_clip(src, tmp_path / "out.mkv", pairwise(blend), progress=False,
                         encoding=Encoding("libx265", pix_fmt="yuv420p10le"))
    got, pix_fmt = stated(tmp_path / "out.mkv")
    assert pix_fmt == "yuv420p10le" and (got.primaries, got.transfer, got.matrix) == (1, 1, 1)


def command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "interpolate", *args, "--config", "tiny"],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # two encoders run: the whole suite's, not the inner loop's
@pytest.mark.parametrize("options", [["--vcodec", "libx265", "--encoder-opt", "x265-params=keyint=12"],
                                     *([["--vcodec", AV1]] if AV1 else [])])
def test_encoder_logs_stay_off_stderr_unless_verbose(tmp_path, options):
    src = make_graded_clip(tmp_path / "in.mkv", "ffv1", "yuv420p10le", SIZE, 3, COLOURS["hlg"][0])
    quiet = command(str(src), "-o", str(tmp_path / "quiet.mkv"), *options)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.splitlines() == [
        "eden-serve: warning: no checkpoint given: using synthetic weights (seed 0); the output is NOT a real interpolation"]
    loud = command(str(src), "-o", str(tmp_path / "loud.mkv"), *options, "-v")
    assert loud.returncode == 0, loud.stderr
    assert len(loud.stderr.splitlines()) > 3  # the encoder's banner and statistics
    with av.open(str(tmp_path / "quiet.mkv")) as a, av.open(str(tmp_path / "loud.mkv")) as b:
        assert np.array_equal(next(a.decode(video=0)).to_ndarray(format="rgb48le"), next(b.decode(video=0)).to_ndarray(format="rgb48le"))


def test_a_sources_colour_is_read_through_its_descriptor_never_by_its_name_here(tmp_path, monkeypatch):
    """A server-side source is named by its path under the media root, which is no path in the worker's
    directory: its HDR metadata comes from the file opened, not from a file of that name here."""
    from eden_serve.cloud.sources import SourceFile

    root = tmp_path / "media"
    root.mkdir()
    hdr10, pix_fmt = COLOURS["hdr10"]
    make_graded_clip(root / "clip.mkv", "libx265", pix_fmt, SIZE, 2, hdr10, {"crf": "12"})
    other = Colour(9, 16, 9, LIMITED, dataclasses.replace(P3, luminance=(Fraction(1, 10000), Fraction(4000))), (4000, 1000))
    here = tmp_path / "worker"
    here.mkdir()
    make_graded_clip(here / "clip.mkv", "libx265", pix_fmt, SIZE, 2, other, {"crf": "12"})
    monkeypatch.chdir(here)
    with SourceFile(root, "clip.mkv").clip(None) as clip:
        assert clip.colour.light == (1000, 400) and clip.colour.mastering.luminance == P3.luminance


def stated_by_frames(path) -> set[tuple[int, int, int, int]]:
    """The tags (primaries, transfer, matrix, range) each decoded frame of ``path`` states, as a reader takes them."""
    with av.open(str(path)) as container:
        return {(f.color_primaries, f.color_trc, f.colorspace, f.color_range or LIMITED) for f in container.decode(video=0)}


# Inputs a reader shows in colours other than BT.601 at limited range, and outputs whose encoder's
# stream states a matrix or range of its own whatever it is told: JPEG's BT.601 at full range, VP8's
# BT.601 at limited range, MPEG-1/2's and ProRes' limited range (no flag for full).
SHOWN = {"bt709": ("yuv420p", Colour(1, 1, 1, LIMITED)), "bt709-full": ("yuv420p", Colour(1, 1, 1, FULL)),
         "bt601-full": ("yuv420p", Colour(6, 6, 6, FULL))}
IMPOSING = [("mjpeg", ".avi"), ("mjpeg", ".mkv"), ("libvpx", ".webm"), ("mpeg2video", ".mkv"), ("mpeg2video", ".mpg"),
            ("prores_ks", ".mov")]
# A round trip through 8-bit YUV of another matrix, range or depth, and a codec's loss at its defaults,
# move a bar's mean by a few levels (at most 5 measured, BT.709 into VP8's BT.601; swscale's SIMD and
# C paths round apart, by a level); a wrong matrix or range moves it by 15 to 50.
BAR_LEVELS = 8


@pytest.mark.parametrize("encoder, suffix", IMPOSING)
@pytest.mark.parametrize("name", list(SHOWN))
def test_an_output_shows_the_inputs_colours_where_its_codec_states_a_matrix_or_range_of_its_own(tmp_path, name, encoder, suffix):
    """Read as any reader reads it (by the tags its frames state), every frame of the output, the
    originals and the middles alike, shows the input's colours; and its frames state one set of tags.
    Before, the frames were converted by the input's matrix and range, which the output's stream
    then contradicted (a BT.709 input into MJPEG came back 34 levels off, a full-range one into
    MPEG-2 or ProRes 16), and ProRes' middles stated no primaries or transfer where its originals did."""
    pix_fmt, colour = SHOWN[name]
    src = make_graded_clip(tmp_path / "in.mkv", "ffv1", pix_fmt, (64, 128), 3, colour, picture=bars)
    want = bar_means(local_frames(src)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a change of depth or range is said; tested elsewhere
        interpolate_clip(src, tmp_path / f"out{suffix}", pairwise(blend), progress=False, encoding=Encoding(encoder))
    frames = local_frames(tmp_path / f"out{suffix}")
    assert len(frames) == 5 and len(stated_by_frames(tmp_path / f"out{suffix}")) == 1
    for k, frame in enumerate(frames):
        off = np.abs(bar_means(frame) - want).max()
        assert off <= BAR_LEVELS, f"frame {k} ({'a middle' if k % 2 else 'an original'}) is {off:.1f} levels off"


@pytest.mark.parametrize("pix_fmt, colour, encoder, said", [
    (*SHOWN["bt709"], "mjpeg", "mjpeg states the BT.601 matrix whatever it is told: the input's BT.709 frames are converted to it"),
    (*SHOWN["bt601-full"], "mpeg2video", "mpeg2video states limited range only: the input's full-range frames are converted to it"),
    ("yuv420p10le", Colour(), "mjpeg", "the output's pixel format yuvj420p holds 8 bits: the input's 10-bit yuv420p10le frames "
                                       "are rounded to it")])
def test_a_conversion_to_the_matrix_or_range_an_output_states_is_said_in_one_line(tmp_path, pix_fmt, colour, encoder, said):
    """Once: MJPEG opens on the full-range twin of the format it refused, and a change of depth was said
    of both (the input's 10-bit frames rounded to yuv420p, then to yuvj420p)."""
    src = make_graded_clip(tmp_path / "in.mkv", "ffv1", pix_fmt, SIZE, 2, colour)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, tmp_path / "out.mkv", pairwise(blend), progress=False, encoding=Encoding(encoder))
    messages = [str(w.message) for w in caught]
    assert said in messages and [m.split(": ")[-1] for m in messages].count(said.split(": ")[-1]) == 1, messages


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """A PNG's chunks (type, body), in order."""
    at, found = 8, []
    while at < len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        found.append((kind, data[at + 8:at + 8 + length]))
        at += 12 + length
    return found


def with_colour(png: bytes) -> bytes:
    """``png`` with chunks that say how its colours are shown put after its header: an ICC profile,
    gamma, chromaticities (Display P3's) and coding-independent code points (BT.709)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    said = (chunk(b"iCCP", b"a profile\0\0" + zlib.compress(b"not parsed by anyone here")) + chunk(b"gAMA", struct.pack(">I", 45455))
            + chunk(b"cHRM", struct.pack(">8I", 31270, 32900, 68000, 32000, 26500, 69000, 15000, 6000))
            + chunk(b"cICP", bytes([1, 1, 0, 1])))
    return png[:33] + said + png[33:]


COLOUR_CHUNKS = {b"iCCP", b"sRGB", b"gAMA", b"cHRM", b"cICP", b"mDCv", b"cLLi"}


@pytest.mark.parametrize("depth", [8, 16])
def test_a_pngs_colour_chunks_are_kept_in_its_middles(tmp_path, depth):
    """A middle is shown as its neighbours are: it carries the colour chunks of the PNG before it (was:
    none, so a viewer showed the originals by their profile and the middles as sRGB)."""
    src = tmp_path / "in"
    src.mkdir()
    for k in range(2):
        pixels = (gradient(k, SIZE) if depth == 16 else (gradient(k, SIZE) // 257).astype(np.uint8))
        png = rgb16_png(pixels) if depth == 16 else png_bytes(Image.fromarray(pixels))
        (src / f"f{k}.png").write_bytes(with_colour(png))
    said = [c for c in png_chunks((src / "f0.png").read_bytes()) if c[0] in COLOUR_CHUNKS]
    interpolate_clip(src, tmp_path / "out", pairwise(blend), progress=False)
    middle = (tmp_path / "out" / "000001.png").read_bytes()
    assert [c for c in png_chunks(middle) if c[0] in COLOUR_CHUNKS] == said
    with av.open(str(tmp_path / "out" / "000001.png")) as container:  # still a PNG that decodes
        assert next(container.decode(video=0)).width == SIZE[1]
    done = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "interpolate", str(src / "f0.png"), str(src / "f1.png"),
                           "-o", str(tmp_path / "pair.png"), "--config", "tiny"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [c for c in png_chunks((tmp_path / "pair.png").read_bytes()) if c[0] in COLOUR_CHUNKS] == said


# (input pixel format, its colour, encoder, output suffix, --pix-fmt): YUV into an RGB encoder, and
# RGB (matrix 0, GBR: a screen capture, libx264rgb's) into YUV encoders.
ACROSS = [("yuv444p", Colour(1, 1, 1, LIMITED), "libx264rgb", ".mkv", None),
          ("gbrp10le", Colour(1, 13, 0, 0), "libx264", ".mkv", None), ("gbrp10le", Colour(1, 13, 0, 0), "libvpx-vp9", ".webm", None),
          ("gbrp10le", Colour(1, 13, 0, 0), "ffv1", ".mkv", "yuv420p"), *([("gbrp10le", Colour(9, 16, 0, 0), AV1, ".mkv", None)] if AV1 else [])]


@pytest.mark.parametrize("pix_fmt, colour, encoder, suffix, asked", ACROSS)
def test_rgb_and_yuv_outputs_state_the_matrix_their_pixels_are_in(tmp_path, pix_fmt, colour, encoder, suffix, asked):
    """An RGB output states the RGB matrix (0), a YUV one a YUV matrix (BT.2020's for BT.2020
    primaries, else BT.709's), and either shows the input's colours. Before, the input's matrix was
    stated as it was: YUV frames into libx264rgb came back 255 levels off (its RGB read as YUV), RGB
    frames into YUV stated the RGB matrix, which libvpx-vp9 and SVT-AV1 refused (the run failed)."""
    src = make_graded_clip(tmp_path / "in.mkv", "ffv1", pix_fmt, (64, 128), 3, colour, picture=bars)
    out = tmp_path / f"out{suffix}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a change of depth is said; tested elsewhere
        interpolate_clip(src, out, pairwise(blend), progress=False, encoding=Encoding(encoder, pix_fmt=asked))
    with av.open(str(out)) as container:
        first = next(container.decode(video=0))
        rgb = av.VideoFormat(first.format.name).is_rgb
    assert {tags[2] for tags in stated_by_frames(out)} == ({0} if rgb else {9 if colour.primaries == 9 else 1})
    want = bar_means(local_frames(src)[0])
    for k, frame in enumerate(local_frames(out)):
        assert np.abs(bar_means(frame) - want).max() <= BAR_LEVELS, f"frame {k}"


# RGB outputs whose stream or container states a range (H.264's and HEVC's VUI; Matroska's and MP4's colour).
RGB_OUTPUTS = [("libx264rgb", ".mkv", None), ("libx264rgb", ".mp4", None), ("libx265", ".mp4", "gbrp"),
               ("ffv1", ".mkv", "bgr0"), ("ffv1", ".mkv", "gbrp10le")]


@pytest.mark.parametrize("encoder, suffix, asked", RGB_OUTPUTS)
def test_rgb_outputs_of_a_limited_range_input_state_full_range(tmp_path, encoder, suffix, asked):
    """RGB has no limited range: a BT.709 limited-range clip into libx264rgb, x265's or FFV1's RGB
    stated "tv" (PNG and APNG alone stated full), in the stream and on every decoded frame, which a
    reader may take to stretch the levels. Now full range, the pixels as they were."""
    src = make_graded_clip(tmp_path / "in.mp4", "libx264", "yuv420p", (64, 128), 2, Colour(1, 1, 1, LIMITED), picture=bars)
    out = tmp_path / f"out{suffix}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a change of depth is said; tested elsewhere
        interpolate_clip(src, out, pairwise(blend), progress=False, encoding=Encoding(encoder, pix_fmt=asked))
    with av.open(str(out)) as container:
        context = container.streams.video[0].codec_context
        assert av.VideoFormat(context.pix_fmt).is_rgb and context.color_range == FULL, (context.pix_fmt, context.color_range)
    assert {tags[2:] for tags in stated_by_frames(out)} == {(0, FULL)}
    want = bar_means(local_frames(src)[0])
    for k, frame in enumerate(local_frames(out)):
        assert np.abs(bar_means(frame) - want).max() <= BAR_LEVELS, f"frame {k}"


def with_alpha_plane(index: int, size: tuple[int, int]) -> np.ndarray:
    """:func:`bars` with an even alpha of (index + 1) quarters, 16-bit RGBA [H, W, 4]."""
    return np.concatenate([bars(index, size), np.full((*size, 1), 65535 * (index + 1) // 4, np.uint16)], axis=-1)


def make_alpha_clip(path, codec: str, pix_fmt: str, size: tuple[int, int], count: int):
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=25)
        stream.height, stream.width = size
        stream.pix_fmt = pix_fmt
        for k in range(count):
            frame = av.VideoFrame.from_ndarray(with_alpha_plane(k, size), format="rgba64le").reformat(format=pix_fmt)
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


@pytest.mark.parametrize("codec, pix_fmt, suffix", [("ffv1", "yuva420p", ".mkv"), ("prores_ks", "yuva444p10le", ".mov"),
                                                    ("ffv1", "gbrap16le", ".mkv"), ("png", "rgba", ".mov"),
                                                    ("qtrle", "argb", ".mov"), ("png", "rgba64be", ".mov")])
@pytest.mark.parametrize("factor", [2, 4])
def test_a_videos_middles_have_the_alpha_of_their_neighbours(tmp_path, codec, pix_fmt, suffix, factor):
    """The model sees colour alone: a middle's alpha is its neighbours', blended by its position,
    as an image's middle is the mean of its neighbours' (was: every middle opaque between
    translucent originals, ProRes 4444's and VP9's alpha alike; in a format that packs alpha beside
    the colours, PNG's and QuickTime RLE's, the blend was written over the colours' bytes)."""
    src = make_alpha_clip(tmp_path / f"in{suffix}", codec, pix_fmt, (32, 64), 3)
    out = tmp_path / f"out{suffix}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        interpolate_clip(src, out, pairwise(blend), progress=False, factor=factor)
    with av.open(str(out)) as container:
        alphas = [frame.to_ndarray(format="rgba64le")[..., 3].astype(np.float64) / 65535 for frame in container.decode(video=0)]
    assert len(alphas) == 2 * factor + 1
    for k, alpha in enumerate(alphas):
        want = (1 + k / factor) / 4  # the originals' quarters, and between them by position
        assert np.abs(alpha - want).max() < 0.01, f"frame {k}: alpha {alpha.mean():.3f}, not {want:.3f}"


@pytest.mark.parametrize("codec, pix_fmt", [("prores_ks", "yuva444p10le"), ("ffv1", "yuva420p")])
def test_a_middles_alpha_is_made_of_its_neighbours_as_written(tmp_path, codec, pix_fmt):
    """Each middle's alpha, in a lossless output (FFV1), is exactly its neighbours' as the output
    holds them, blended by its position and rounded: the bytes every run writes, whether each
    original's alpha is converted again for each middle or once (ProRes' 12 bits converted to 10)."""
    size, factor = (24, 40), 4
    src = tmp_path / "in.mkv"
    rng = np.random.default_rng(3)
    with av.open(str(src), "w") as container:
        stream = container.add_stream(codec, rate=25)
        stream.height, stream.width = size
        stream.pix_fmt = pix_fmt
        for k in range(3):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 65536, (*size, 4), dtype=np.uint16), format="rgba64le")
            frame = frame.reformat(format=pix_fmt)
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    out = tmp_path / "out.mkv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        interpolate_clip(src, out, pairwise(blend), progress=False, factor=factor,
                         encoding=Encoding(vcodec="ffv1", pix_fmt="yuva444p10le" if codec == "prores_ks" else pix_fmt))
    with av.open(str(out)) as container:
        dtype = np.uint16 if codec == "prores_ks" else np.uint8
        alphas = [np.frombuffer(f.planes[3], dtype).reshape(f.planes[3].height, -1)[:, :size[1]].astype(np.int64)
                  for f in container.decode(video=0)]
    assert len(alphas) == 2 * factor + 1 and len({a.tobytes() for a in alphas[::factor]}) == 3
    for k, alpha in enumerate(alphas):
        before, after = alphas[k - k % factor], alphas[min(k - k % factor + factor, 2 * factor)]
        want = np.round(before + (after - before).astype(np.float64) * (k % factor / factor))
        assert np.array_equal(alpha, want), k


def lost_tags(src, out) -> set[str]:
    """The tags of ``src``'s first frame that ``out``'s first frame, read back, no longer states as it
    did, of those a reader would take otherwise: primaries and transfer stated, a matrix other than
    BT.601's, full range."""
    def tags(path):
        with av.open(str(path)) as container:
            frame = next(container.decode(video=0))
            return frame.color_primaries, frame.color_trc, frame.colorspace, frame.color_range
    (primaries, transfer, matrix, range_), got = tags(src), tags(out)
    lost = {name for name, was, now in (("primaries", primaries, got[0]), ("transfer", transfer, got[1])) if was != 2 and now != was}
    if matrix not in (2, 5, 6) and got[2] != matrix:
        lost.add("matrix")
    if range_ == FULL and got[3] != FULL:
        lost.add("range")
    return lost


# (suffix, encoder): containers with and without a place for the tags, codecs that state them in their
# stream or not.
KEEPERS = [(".avi", "ffv1"), (".avi", "libx264"), (".avi", "mpeg4"), (".nut", "ffv1"), (".nut", "libx264"), (".nut", "rawvideo"),
           (".y4m", None), (".mov", "mpeg4"), (".mov", "libx264"), (".mkv", "ffv1"), (".mp4", "mpeg4"), (".flv", "flv"),
           (".ts", "mpeg2video"), (".ts", "libx264"), (".mpg", "mpeg1video"), (".webm", "libvpx-vp9"), (".mkv", "rawvideo")]


@pytest.mark.parametrize("suffix, encoder", KEEPERS)
@pytest.mark.parametrize("name", ["bt709", "bt709-full"])
def test_an_output_that_cannot_state_the_inputs_colour_says_so_in_one_line(tmp_path, name, suffix, encoder):
    """Where neither the container nor the codec's stream has a place for a tag the input states
    (AVI, NUT, FLV and MPEG-TS hold none; Y4M its range alone; MOV no range), one line says which
    are left out; nothing is said where every tag is kept (before: silently left out)."""
    pix_fmt, colour = SHOWN[name]
    src = make_graded_clip(tmp_path / "in.mkv", "ffv1", pix_fmt, SIZE, 8 if suffix == ".ts" else 2, colour)  # TS: bytes to probe
    out = tmp_path / f"out{suffix}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, out, pairwise(blend), progress=False, encoding=Encoding(encoder))
    said = [str(w.message) for w in caught if str(w.message).startswith("the output (")]
    converted = any("states limited range only" in str(w.message) for w in caught)  # said of its own (MPEG-1)
    lost = lost_tags(src, out) - ({"range"} if converted else set())
    assert len(said) == (1 if lost else 0), (said, lost)
    if lost:
        assert said[0].split(": ")[0].endswith(" and ".join(sorted(lost))), (said, lost)


@pytest.mark.parametrize("matrix, name", [(8, "YCgCo"), (10, "BT.2020 CL"), (14, "ICtCp")])
def test_a_matrix_ffmpeg_cannot_convert_is_refused_in_one_line_naming_it(tmp_path, matrix, name):
    """FFmpeg's swscale converts no YCgCo, constant-luminance BT.2020 or ICtCp to RGB: the clip is
    refused as it opens, saying so (was: 'cannot decode the video ([Errno 95] Operation not
    supported)' at its first frame)."""
    src = make_graded_clip(tmp_path / "in.mkv", "ffv1", "yuv420p10le", SIZE, 2, Colour(9, 14, 2), picture=bars)
    with av.open(str(src)) as container:  # the tag as an encoder of such video states it
        stream = container.streams.video[0]
        template = tmp_path / "tagged.mkv"
        with av.open(str(template), "w") as out:
            copy = out.add_stream_from_template(stream)
            copy.codec_context.colorspace = matrix
            for packet in container.demux(stream):
                if packet.size:
                    packet.stream = copy
                    out.mux(packet)
    done = command(str(template), "-o", str(tmp_path / "out.mkv"))
    assert done.returncode == 2 and not (tmp_path / "out.mkv").exists()
    assert done.stderr.splitlines()[-1] == (f"eden-serve: error: {template}: its colour matrix is {name} ({matrix}), which FFmpeg's "
                                            "swscale cannot convert to RGB; convert the video to another matrix first")


@pytest.mark.parametrize("suffix", [".png", ".webp"])
def test_an_animations_colour_profile_is_kept(tmp_path, suffix):
    """An APNG keeps its colour chunks (ICC profile, gamma, chromaticities, cICP), an animated WebP its
    ICC profile (was: both written without, every frame then shown as sRGB)."""
    frames = [Image.fromarray((gradient(k, SIZE) // 257).astype(np.uint8)) for k in range(3)]
    src = tmp_path / f"in{suffix}"
    if suffix == ".png":
        buffer = io.BytesIO()
        frames[0].save(buffer, format="PNG", save_all=True, append_images=frames[1:], duration=100, loop=0)
        src.write_bytes(with_colour(buffer.getvalue()))
    else:
        frames[0].save(src, format="WEBP", save_all=True, append_images=frames[1:], duration=100, loop=0, lossless=True,
                       icc_profile=b"a profile no one parses here")
    interpolate_clip(src, tmp_path / f"out{suffix}", pairwise(blend), progress=False)
    with Image.open(src) as given, Image.open(tmp_path / f"out{suffix}") as written:
        assert written.n_frames == 5 and written.info.get("icc_profile") == given.info.get("icc_profile") is not None
    if suffix == ".png":
        def said(path):
            return [c for c in png_chunks(path.read_bytes()) if c[0] in COLOUR_CHUNKS]
        assert said(tmp_path / "out.png") == said(src) and len(said(src)) == 4


@pytest.mark.parametrize("codec, pix_fmt, suffix, encoder", [("png", "rgba", ".apng", None), ("png", "rgba", ".mov", "qtrle"),
                                                             ("png", "rgb24", ".mov", None), ("png", "rgba", ".png.mov", "png")])
def test_an_rgb_output_of_an_rgb_input_says_no_range_is_lost(tmp_path, codec, pix_fmt, suffix, encoder):
    """An RGB input (PNG's frames state full range) into an RGB output (PNG, APNG, QuickTime RLE)
    loses nothing: it has no YUV range to keep (before: "no place for the input's range" each time).
    A YUV input's full range that an output cannot state is still said
    (:func:`test_an_output_that_cannot_state_the_inputs_colour_says_so_in_one_line`)."""
    src = tmp_path / "in.mov"
    with av.open(str(src), "w") as container:
        stream = container.add_stream(codec, rate=25)
        stream.height, stream.width, stream.pix_fmt = *SIZE, pix_fmt
        for k in range(2):
            frame = av.VideoFrame.from_ndarray(np.full((*SIZE, 4), 60 * k + 30, np.uint8), format="rgba").reformat(format=pix_fmt)
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with av.open(str(src)) as container:
        assert next(container.decode(video=0)).color_range == FULL  # what made the line be said
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, tmp_path / f"out{suffix}", pairwise(blend), progress=False, encoding=Encoding(encoder))
    assert [str(w.message) for w in caught if "no place for" in str(w.message)] == []


@pytest.mark.parametrize("codec, pix_fmt, suffix, size", [("h263", "yuv420p", ".3gp", (144, 176)), ("mjpeg", "yuvj420p", ".avi", SIZE),
                                                          ("mpeg1video", "yuv420p", ".mpg", SIZE)])
def test_a_codec_whose_standard_fixes_the_chroma_location_keeps_it_without_a_word(tmp_path, codec, pix_fmt, suffix, size):
    """H.263, JPEG and MPEG-1 have no field for the chroma location: their standard sites it in the
    centre, which a reader of the output takes. Written in the input's own codec, nothing is lost,
    yet one line said "no place for the input's chroma location ... chroma sited left"; into a
    codec whose standard sites it elsewhere (MPEG-4 Part 2, left) it is lost, and the line says so."""
    src = tmp_path / f"in{suffix}"
    with av.open(str(src), "w") as container:
        stream = container.add_stream(codec, rate=25)
        stream.height, stream.width, stream.pix_fmt = *size, pix_fmt
        for k in range(6):  # MPEG-PS's rate is guessed from its first frames
            frame = av.VideoFrame.from_ndarray(np.full((*size, 3), 30 * k + 30, np.uint8), format="rgb24").reformat(format=pix_fmt)
            frame.pts, frame.time_base = k, Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))

    def lines(dst, encoder=None):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            interpolate_clip(src, dst, pairwise(blend), progress=False, encoding=Encoding(encoder))
        return [str(w.message) for w in caught if "chroma location" in str(w.message)]

    assert lines(tmp_path / f"out{suffix}") == []
    said = lines(tmp_path / "out.avi", "mpeg4")
    assert len(said) == 1 and "no place for the input's chroma location" in said[0] and "chroma sited left" in said[0], said

"""eden_serve.media.png_colour: a PNG's colour chunks other than its ICC profile, as a video of its
images states them (``interpolate frames/ -o out.mkv``) and as a pair's middle saved in another
format says it loses them. HDR PNGs are tagged with cICP (BT.2020 primaries, PQ or HLG), with
HDR10's mastering display (mDCv) and content light level (cLLi); older ones with gAMA and cHRM.
The PNGs are built here, their chunks with their CRCs, and the outputs read back through PyAV."""

from __future__ import annotations

import struct
import subprocess
import sys
import warnings
import zlib
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.media import Encoding, save_middle
from eden_serve.media.base import Frame
from eden_serve.media.colour import LIMITED, Colour
from eden_serve.media.frames import png_bytes
from eden_serve.wire.png import rgb16_png, with_chunks
from harness.videos import gradient, make_graded_clip
from test_colour import P3, blend, png_chunks, same_metadata, stated
from test_icc import WIDE

av = pytest.importorskip("av")

SIZE = (16, 24)  # height, width


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def cicp(primaries: int, transfer: int, matrix: int = 0, full: int = 1) -> bytes:
    return chunk(b"cICP", bytes([primaries, transfer, matrix, full]))


# P3's display (:data:`test_colour.P3`) as mDCv states it: red, green, blue, white in 0.00002, then
# the greatest and least luminance in 0.0001 cd/m²; MaxCLL 1000 and MaxFALL 400 cd/m² in 0.0001.
MDCV = chunk(b"mDCv", struct.pack(">8H2I", 34000, 16000, 13250, 34500, 7500, 3000, 15635, 16450, 10_000_000, 50))
CLLI = chunk(b"cLLi", struct.pack(">2I", 10_000_000, 4_000_000))
HDR10 = cicp(9, 16) + MDCV + CLLI
SRGB_GAMA = chunk(b"gAMA", struct.pack(">I", 45455))
SRGB_CHRM = chunk(b"cHRM", struct.pack(">8I", 31270, 32900, 64000, 33000, 30000, 60000, 15000, 6000))
GAMMA_18 = chunk(b"gAMA", struct.pack(">I", 55556))  # 1/1.8: an old Mac's


def write_pngs(folder, chunks, depth: int = 16, count: int = 3):
    """``count`` frames of a moving gradient, 16- or 8-bit RGB PNGs carrying ``chunks`` (one for
    all, or a list: each frame's own)."""
    folder.mkdir()
    for k in range(count):
        pixels = gradient(k, SIZE)
        png = rgb16_png(pixels) if depth == 16 else png_bytes(Image.fromarray((pixels // 257).astype(np.uint8)))
        (folder / f"f{k}.png").write_bytes(with_chunks(png, chunks[k] if isinstance(chunks, list) else chunks))
    return folder


def written(src, out, encoder: str | None = None) -> list[str]:
    """The lines said while ``src`` is written as the video ``out``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, out, pairwise(blend), progress=False, encoding=Encoding(encoder))
    return [str(w.message) for w in caught if "--input-fps" not in str(w.message) and "pixel format" not in str(w.message)]


@pytest.mark.parametrize("encoder, matrix, deep", [(None, 9, "yuv420p10le"), ("ffv1", 0, "gbrp16le")])
def test_hdr10_pngs_become_an_hdr10_video(tmp_path, encoder, matrix, deep):
    """16-bit PNGs of BT.2020 primaries and PQ with mDCv and cLLi: the video was tagged sRGB (BT.709,
    IEC 61966-2-1); now it states BT.2020 and PQ, deeper than 8 bits (x264's YUV, made by BT.2020's
    matrix, in 10), and HDR10's metadata, by x264 in its stream (Matroska's default encoder) or by
    Matroska for FFV1 (in RGB), nothing said but the rounding to 10 bits."""
    src = write_pngs(tmp_path / "src", HDR10)
    said = written(src, tmp_path / "out.mkv", encoder)
    got, pix_fmt = stated(tmp_path / "out.mkv")
    assert (got.primaries, got.transfer, got.matrix) == (9, 16, matrix) and pix_fmt == deep
    assert same_metadata(got, Colour(mastering=P3, light=(1000, 400))) and said == []


def test_hlg_pngs_state_hlg_and_an_8_bit_sequence_stays_8_bits(tmp_path):
    src = write_pngs(tmp_path / "src", cicp(9, 18), depth=8)
    assert written(src, tmp_path / "out.mp4") == []
    got, pix_fmt = stated(tmp_path / "out.mp4")
    assert (got.primaries, got.transfer, got.matrix) == (9, 18, 9) and pix_fmt == "yuv420p"
    assert got.mastering is None and got.light is None


P3_CHRM = chunk(b"cHRM", struct.pack(">8I", 31270, 32900, 68000, 32000, 26500, 69000, 15000, 6000))
RANKED = {"srgb": (SRGB_GAMA + SRGB_CHRM, (1, 13, 1), 0), "srgb-gamma": (SRGB_GAMA, (1, 13, 1), 0),
          "gamma-1.8": (GAMMA_18, (2, 2, 1), 1), "p3-chromaticities": (SRGB_GAMA + P3_CHRM, (2, 2, 1), 1),
          "cicp-over-gama": (cicp(1, 13) + GAMMA_18, (1, 13, 1), 0), "cicp-not-rgb": (cicp(9, 16, matrix=9), (1, 13, 1), 1),
          "cicp-over-iccp": (cicp(9, 16) + chunk(b"iCCP", b"wide\0\0" + zlib.compress(WIDE)), (9, 16, 9), 0),
          "narrow-cicp": (cicp(9, 18, full=0), (9, 18, 9), 1)}


@pytest.mark.parametrize("chunks, tags, lines", list(RANKED.values()), ids=list(RANKED))
def test_gamma_and_chromaticities_are_srgb_only_where_they_say_so(tmp_path, chunks, tags, lines):
    """gAMA and cHRM of sRGB's values keep sRGB's tags; others (gamma 1.8, Display P3's primaries) were
    claimed as sRGB: now neither primaries nor transfer are stated, said once. A cICP outranks them,
    and an ICC profile (which is then not said to be left out); one of a matrix other than RGB's is
    no PNG's: passed over, said; one of narrow-range RGB is stated, and its range said."""
    src = write_pngs(tmp_path / "src", chunks, depth=8)
    said = written(src, tmp_path / "out.mkv")
    got, _ = stated(tmp_path / "out.mkv")
    assert (got.primaries, got.transfer, got.matrix) == tags
    assert len(said) == lines and all("sRGB's" in line or "cICP" in line for line in said), said


def test_images_that_disagree_are_written_as_the_first_says_and_the_others_named_once(tmp_path):
    """The video is tagged as the first image is (as for an ICC profile); the third and fourth images'
    cICP (BT.709, Display P3) differ from it: the first of them is named in one line."""
    src = write_pngs(tmp_path / "src", [HDR10, HDR10, cicp(1, 1), cicp(12, 13)], count=4)
    said = written(src, tmp_path / "out.mkv")
    got, _ = stated(tmp_path / "out.mkv")
    assert (got.primaries, got.transfer, got.matrix) == (9, 16, 9)
    assert len(said) == 1 and "f2.png" in said[0] and "first image" in said[0]


def test_an_output_with_no_place_for_the_cicps_tags_says_they_are_left_out(tmp_path):
    """AVI holds no colour tags, nor does MPEG-4 Part 2: sRGB's were left out silently, which a reader
    takes anyway; PQ's left out changes every colour, and one line says so."""
    src = write_pngs(tmp_path / "src", cicp(9, 16), depth=8)
    said = written(src, tmp_path / "out.avi")
    assert len(said) == 1 and "primaries and transfer" in said[0] and "left out" in said[0], said


LOST = {"hdr10-jpeg": (HDR10, ".jpg", "cICP, mDCv and cLLi"), "gamma-webp": (GAMMA_18, ".webp", "gAMA"),
        "hlg-tiff": (cicp(9, 18) + CLLI, ".tif", "cICP and cLLi"), "png": (HDR10, ".png", None),
        "srgb-cicp": (cicp(1, 13) + MDCV, ".jpg", None), "srgb-chunks": (chunk(b"sRGB", b"\0") + SRGB_GAMA + SRGB_CHRM, ".bmp", None),
        "metadata-alone": (MDCV + CLLI, ".jpg", None)}


@pytest.mark.parametrize("chunks, suffix, lost", list(LOST.values()), ids=list(LOST))
def test_a_pairs_middle_in_another_format_says_what_colour_chunks_it_loses(tmp_path, chunks, suffix, lost):
    """As ``eden-serve interpolate a.png b.png -o mid.jpg`` saves it: the cICP (with HDR10's metadata)
    or gAMA of the frame before were dropped without a word; now one line names them. Chunks that state
    sRGB, which a reader takes anyway, or HDR10's metadata without a cICP, are not said."""
    src = write_pngs(tmp_path / "src", chunks, depth=8, count=2)
    before, after = (Frame(i, f"frame{i}", path=src / f"f{i}.png") for i in range(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_middle(blend(0, before, after, 0), before, after, tmp_path / f"mid{suffix}")
    said = [str(w.message) for w in caught]
    assert (tmp_path / f"mid{suffix}").stat().st_size > 0
    if lost is None:
        assert said == []
    else:
        assert len(said) == 1 and f"colour chunks {lost} are left out" in said[0] and f"mid{suffix}" in said[0], said


def test_mdcv_and_clli_are_read_in_their_units():
    """Red, green, blue and white in 0.00002, luminance in 0.0001 cd/m² (greatest first), light levels in 0.0001 cd/m²."""
    from eden_serve.media.png_colour import shown
    colour = shown(HDR10).colour
    assert colour.mastering == P3 and colour.light == (1000, 400) and colour.mastering.luminance == (Fraction(1, 200), 1000)


def apng_chunks(path) -> dict[bytes, bytes]:
    """An APNG's chunks before its first frame, by type."""
    chunks = png_chunks(path.read_bytes())
    return dict(chunks[:[kind for kind, _ in chunks].index(b"IDAT")])


def test_an_apng_states_the_cicp_as_full_range_rgb(tmp_path):
    """FFmpeg's APNG writer states primaries and transfer as PNG chunks (a cICP, or sRGB's own), with
    the range it is told as the cICP's full-range flag. Images of PQ made an APNG of sRGB's default
    and a line that said they had no place; a BT.709 video made one whose cICP said narrow-range RGB
    of pixels that are full range. Now each states its colour as full-range RGB, nothing said of it."""
    src = write_pngs(tmp_path / "src", cicp(9, 16), depth=8)
    assert written(src, tmp_path / "hdr.apng") == []
    assert apng_chunks(tmp_path / "hdr.apng")[b"cICP"] == bytes([9, 16, 0, 1])
    plain = write_pngs(tmp_path / "plain", b"", depth=8)
    assert written(plain, tmp_path / "plain.apng") == []
    assert apng_chunks(tmp_path / "plain.apng")[b"sRGB"] and b"cICP" not in apng_chunks(tmp_path / "plain.apng")
    video = make_graded_clip(tmp_path / "in.mkv", "ffv1", "yuv420p", SIZE, 3, Colour(1, 1, 1, LIMITED))
    written(video, tmp_path / "video.apng")
    assert apng_chunks(tmp_path / "video.apng")[b"cICP"] == bytes([1, 1, 0, 1])


def test_the_command_says_it_of_a_pairs_jpeg_middle(tmp_path):
    """``eden-serve interpolate a.png b.png -o mid.jpg`` of HDR10 PNGs: one warning on stderr, exit 0."""
    src = write_pngs(tmp_path / "src", HDR10, depth=8, count=2)
    done = subprocess.run([sys.executable, "-m", "eden_serve.commands.cli", "interpolate", str(src / "f0.png"), str(src / "f1.png"),
                           "-o", str(tmp_path / "mid.jpg"), "--config", "tiny"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "warning:" in line and "no checkpoint given" not in line]
    assert len(lines) == 1 and "cICP, mDCv and cLLi are left out" in lines[0], done.stderr

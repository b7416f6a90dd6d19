"""eden_serve.media.icc: an image's own ICC profile is carried into every image output that has a
place for it (the originals written anew and the middles alike), and where the output has none (a
video, a BMP) or the profile does not describe the pixels written (a CMYK JPEG's), one warning says
it is left out, and a video of such images does not claim sRGB's colours. The profiles are built
here from the ICC specification's layout (version 2: a 128-byte header, a tag table, matrix and
curve tags), and checked to parse by littleCMS."""

from __future__ import annotations

import io
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.media import icc, save_middle
from eden_serve.media.base import Frame
from eden_serve.media.frames import to_pixels
from eden_serve.wire.png import rgb16_png

av = pytest.importorskip("av")

SIZE = (16, 24)  # height, width
D50 = (0.9642, 1.0, 0.8249)


def blend(index, frame0, frame1, seed):
    return to_pixels((frame0.tensor + frame1.tensor) / 2, frame0.depth)


def _xyz(x: float, y: float, z: float) -> bytes:
    """An XYZType tag: its signature, 4 reserved bytes, three s15Fixed16 numbers."""
    return b"XYZ " + bytes(4) + b"".join(struct.pack(">i", round(v * 65536)) for v in (x, y, z))


def _curve(gamma: float | None) -> bytes:
    """A curveType tag: one entry, a gamma (u8Fixed8); or, for None, sRGB's curve as a 1024-entry table."""
    if gamma is not None:
        return b"curv" + bytes(4) + struct.pack(">IH", 1, round(gamma * 256))
    linear = [x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in np.linspace(0, 1, 1024)]
    return b"curv" + bytes(4) + struct.pack(">I1024H", 1024, *(round(v * 65535) for v in linear))


def profile(space: bytes = b"RGB ", gamma: float | None = 1.8, colorants=((0.5151, 0.2412, -0.0011), (0.2920, 0.6922, 0.0419),
                                                                           (0.1571, 0.0666, 0.7841))) -> bytes:
    """A display profile of ``space`` (RGB: a matrix of ``colorants``, adapted to D50, and one curve of
    ``gamma`` for the three channels; GRAY and CMYK: a grey curve alone, enough for a header's
    colour space), as version 2 lays it out."""
    text = b"eden-serve test profile\0"
    tags = [(b"desc", b"desc" + bytes(4) + struct.pack(">I", len(text)) + text + bytes(4 + 4 + 2 + 1 + 67)),
            (b"cprt", b"text" + bytes(4) + b"no copyright\0"), (b"wtpt", _xyz(*D50))]
    if space == b"RGB ":
        tags += [(b"rXYZ", _xyz(*colorants[0])), (b"gXYZ", _xyz(*colorants[1])), (b"bXYZ", _xyz(*colorants[2]))]
        tags += [(name, _curve(gamma)) for name in (b"rTRC", b"gTRC", b"bTRC")]
    else:
        tags += [(b"kTRC", _curve(gamma))]
    start = 128 + 4 + 12 * len(tags)
    table, body = b"", b""
    for name, data in tags:
        table += name + struct.pack(">II", start + len(body), len(data))
        body += data + bytes(-len(data) % 4)  # each tag on a 4-byte boundary
    header = (struct.pack(">I", start + len(body)) + bytes(4) + bytes([2, 0x10, 0, 0]) + b"mntr" + space + b"XYZ "
              + bytes(12) + b"acsp" + bytes(24) + bytes(4) + _xyz(*D50)[8:] + bytes(4) + bytes(44))
    assert len(header) == 128
    return header + struct.pack(">I", len(tags)) + table + body


WIDE = profile()  # gamma 1.8, wider primaries than sRGB's: not sRGB
SRGB_LIKE = profile(gamma=None, colorants=((0.4361, 0.2225, 0.0139), (0.3851, 0.7169, 0.0971), (0.1431, 0.0606, 0.7141)))


def with_iccp(png: bytes, icc_profile: bytes) -> bytes:
    """``png`` with an iCCP chunk after its header: a name, its NUL, compression method 0, the zlib-compressed profile."""
    data = b"a profile\0\0" + zlib.compress(icc_profile)
    chunk = struct.pack(">I", len(data)) + b"iCCP" + data + struct.pack(">I", zlib.crc32(b"iCCP" + data))
    return png[:33] + chunk + png[33:]  # the signature (8) and IHDR (25)


def tiff16(pixels: np.ndarray, icc_profile: bytes) -> bytes:
    """A baseline little-endian TIFF of 16-bit RGB ``pixels`` in one strip, the profile as tag 34675."""
    height, width, _ = pixels.shape
    data = np.ascontiguousarray(pixels, "<u2").tobytes()
    entries = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 3, "bits"), (259, 3, 1, 1), (262, 3, 1, 2),
               (273, 4, 1, "data"), (277, 3, 1, 3), (278, 4, 1, height), (279, 4, 1, len(data)), (284, 3, 1, 1),
               (34675, 7, len(icc_profile), "profile")]
    bits = 8 + 2 + 12 * len(entries) + 4
    at = {"bits": bits, "profile": bits + 6, "data": bits + 6 + len(icc_profile) + len(icc_profile) % 2}
    out = b"II*\0" + struct.pack("<IH", 8, len(entries))
    for tag, kind, count, value in entries:
        value = at.get(value, value)
        out += struct.pack("<HHI", tag, kind, count) + (struct.pack("<HH", value, 0) if kind == 3 and count == 1 else struct.pack("<I", value))
    return out + bytes(4) + struct.pack("<3H", 16, 16, 16) + icc_profile + bytes(len(icc_profile) % 2) + data


def pictures(count: int, mode: str = "RGB"):
    rng = np.random.default_rng(7)
    return [Image.fromarray((rng.random((*SIZE, 3)) * 255).astype(np.uint8)).convert(mode) for _ in range(count)]


def write_frames(folder, kind: str, icc_profile: bytes, count: int = 3):
    """``count`` frames of ``kind`` carrying ``icc_profile`` in ``folder``."""
    folder.mkdir()
    for k, image in enumerate(pictures(count, {"cmyk": "CMYK", "grey": "L"}.get(kind, "RGB"))):
        if kind == "png":
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            (folder / f"f{k}.png").write_bytes(with_iccp(buffer.getvalue(), icc_profile))
        elif kind == "png16":
            (folder / f"f{k}.png").write_bytes(with_iccp(rgb16_png(np.asarray(image).astype(np.uint16) * 257), icc_profile))
        elif kind == "tiff16":
            (folder / f"f{k}.tif").write_bytes(tiff16(np.asarray(image).astype(np.uint16) * 257 + k, icc_profile))
        else:
            jpeg = ("JPEG", ".jpg", {"quality": 95})
            fmt, suffix, options = {"jpeg": jpeg, "cmyk": jpeg, "grey": jpeg,
                                    "webp": ("WEBP", ".webp", {"lossless": True}), "tiff": ("TIFF", ".tif", {})}[kind]
            image.save(folder / f"f{k}{suffix}", format=fmt, icc_profile=icc_profile, **options)
    return folder


def said(run) -> list[str]:
    """The lines said of ICC profiles while ``run()`` runs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if "ICC profile" in str(w.message)]


def profile_of(path) -> bytes | None:
    with Image.open(path) as image:
        return image.info.get("icc_profile")


def test_the_profiles_built_here_parse_and_only_srgbs_is_taken_for_it():
    """littleCMS reads each; sRGB's colorants and curve are sRGB, a gamma 1.8 wide one, a grey one
    and bytes that do not parse are not known to be."""
    ImageCms = pytest.importorskip("PIL.ImageCms")
    for made in (WIDE, SRGB_LIKE, profile(b"GRAY"), profile(b"CMYK")):
        assert ImageCms.getProfileDescription(ImageCms.ImageCmsProfile(io.BytesIO(made))).strip() == "eden-serve test profile"
    assert icc.is_srgb(SRGB_LIKE) and icc.is_srgb(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())
    assert not icc.is_srgb(WIDE) and not icc.is_srgb(profile(b"GRAY")) and not icc.is_srgb(WIDE[:100])
    assert icc.fits(WIDE, "RGB") and icc.fits(WIDE, "P") and icc.fits(WIDE, "RGBA") and not icc.fits(WIDE, "L")
    assert icc.fits(profile(b"GRAY"), "L") and icc.fits(profile(b"GRAY"), "I;16") and not icc.fits(profile(b"GRAY"), "RGB")
    assert not icc.fits(profile(b"CMYK"), "CMYK") and not icc.fits(None, "RGB")  # a CMYK image is written as RGB


@pytest.mark.parametrize("kind", ["png", "png16", "jpeg", "webp", "tiff", "tiff16", "grey"])
def test_every_frame_of_images_with_a_profile_carries_it(tmp_path, kind):
    """The originals (a PNG copied, any other written anew as PNG) and the middles: each output
    frame states the profile its frame's file does, with nothing said (a grey JPEG's grey profile on
    grey frames). A 16-bit TIFF's originals, written from their 16-bit pixels, carried none."""
    stated = profile(b"GRAY", 2.2) if kind == "grey" else WIDE
    src = write_frames(tmp_path / "src", kind, stated)
    assert said(lambda: interpolate_clip(src, tmp_path / "out", pairwise(blend), progress=False)) == []
    outputs = sorted((tmp_path / "out").iterdir())
    assert len(outputs) == 5 and [profile_of(path) for path in outputs] == [stated] * 5


def test_a_profile_that_does_not_describe_the_pixels_written_is_left_out_and_said_once(tmp_path):
    """A CMYK JPEG's frames are written as RGB (Pillow's plain conversion): its CMYK profile on them
    claimed colours they do not have, without a word. Now no frame carries it, and one line says so."""
    src = write_frames(tmp_path / "src", "cmyk", profile(b"CMYK"))
    lines = said(lambda: interpolate_clip(src, tmp_path / "out", pairwise(blend), progress=False))
    assert len(lines) == 1 and "left out" in lines[0] and "CMYK" in lines[0]
    assert all(profile_of(path) is None for path in (tmp_path / "out").iterdir())
    before, after = (Frame(i, f"frame{i}", path=src / f"f{i}.jpg") for i in range(2))  # a pair's middle alike
    lines = said(lambda: save_middle(blend(0, before, after, 0), before, after, tmp_path / "middle.jpg"))
    assert len(lines) == 1 and "CMYK" in lines[0] and profile_of(tmp_path / "middle.jpg") is None


@pytest.mark.parametrize("suffix, kept", [(".png", True), (".jpg", True), (".webp", True), (".tif", True),
                                          (".bmp", False), (".ppm", False)])
def test_a_pairs_middle_carries_the_profile_where_its_format_has_a_place(tmp_path, suffix, kept):
    """As the command writes a pair's middle (after the frame before): a JPEG, WebP or TIFF middle lost
    the profile silently; a BMP or PPM, which has no place for one, now says it is left out, once; an
    sRGB profile left out changes nothing, and is not said."""
    src = write_frames(tmp_path / "src", "png", WIDE, 2)
    before, after = (Frame(i, f"frame{i}", path=src / f"f{i}.png") for i in range(2))
    middle = blend(0, before, after, 0)
    lines = said(lambda: save_middle(middle, before, after, tmp_path / f"middle{suffix}"))
    assert profile_of(tmp_path / f"middle{suffix}") == (WIDE if kept else None)
    assert len(lines) == (0 if kept else 1)
    if not kept:
        assert "left out" in lines[0] and f"middle{suffix}" in lines[0]
        plain = write_frames(tmp_path / "srgb", "png", SRGB_LIKE, 1)
        srgb = Frame(0, "srgb", path=plain / "f0.png")
        assert said(lambda: save_middle(middle, srgb, srgb, tmp_path / f"srgb{suffix}")) == []


@pytest.mark.parametrize("icc_profile, stated", [(WIDE, (2, 2)), (SRGB_LIKE, (1, 13)), (None, (1, 13))],
                         ids=["wide", "srgb", "none"])
def test_images_written_as_a_video_do_not_claim_srgb_over_their_profile(tmp_path, icc_profile, stated):
    """A video has no place for the profile: one line says it is left out, and the output states no
    primaries or transfer (it stated sRGB's: BT.709's primaries, IEC 61966-2-1's transfer); the matrix
    its YUV was made by is stated all the same. sRGB's own profile, or none, is sRGB: stated, nothing said."""
    src = tmp_path / "src"
    if icc_profile is None:
        src.mkdir()
        for k, image in enumerate(pictures(3)):
            image.save(src / f"f{k}.png")
    else:
        write_frames(src, "png", icc_profile)
    lines = said(lambda: interpolate_clip(src, tmp_path / "out.mkv", pairwise(blend), progress=False))
    assert len(lines) == (stated == (2, 2))
    if lines:
        assert "left out" in lines[0] and "out.mkv" in lines[0] and "sRGB" in lines[0]
    with av.open(str(tmp_path / "out.mkv")) as output:
        context = output.streams.video[0].codec_context
        assert (context.color_primaries, context.color_trc, context.colorspace) == (*stated, 1)
        assert len(list(output.decode(video=0))) == 5

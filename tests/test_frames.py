"""Frames in any Pillow format and mode, the pixel limit, and the 8-bit PNG out."""

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from eden_serve.cloud.limits import read_chunk
from eden_serve.config import preset
from eden_serve.errors import BadInputError, FrameTooLargeError
from eden_serve.media.frames import (
    DEFAULT_MAX_PIXELS,
    check_frame,
    check_pair,
    frames_on,
    from_pixels,
    image_to_tensor,
    load_frame,
    open_image,
    oriented_size,
    scaled_by_table,
    to_png,
)
from eden_serve.model.synthetic import image_header


def encode(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


RGB = np.random.default_rng(0).integers(0, 256, (10, 12, 3), dtype=np.uint8)


def test_rgb_png_is_exact():
    frame = load_frame(encode(Image.fromarray(RGB)))
    assert frame.shape == (3, 10, 12) and frame.dtype == torch.float32
    assert torch.equal((frame * 255).round().to(torch.uint8).permute(1, 2, 0), torch.from_numpy(RGB))


def test_sixteen_bit_grayscale_keeps_precision():
    gray = np.array([[0, 1, 65535, 32768]], dtype=np.uint16)
    frame = load_frame(encode(Image.fromarray(gray)))
    assert frame.shape == (3, 1, 4)
    torch.testing.assert_close(frame[0, 0], torch.tensor([0, 1, 65535, 32768]) / 65535.0)
    assert torch.equal(frame[0], frame[2])


@pytest.mark.parametrize("mode", ["RGBA", "L", "P", "CMYK", "LA", "1"])
def test_any_mode_becomes_rgb(mode):
    image = Image.fromarray(RGB).convert(mode)
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    assert load_frame(encode(image, fmt)).shape == (3, 10, 12)


@pytest.mark.parametrize("fmt", ["JPEG", "WEBP", "BMP", "TIFF"])
def test_other_formats(fmt):
    assert load_frame(encode(Image.fromarray(RGB), fmt)).shape == (3, 10, 12)


def test_not_an_image():
    with pytest.raises(BadInputError, match="frame0 is not a readable image"):
        load_frame(b"hello", "frame0")


def test_truncated_image():
    with pytest.raises(BadInputError, match="not a readable image"):
        load_frame(encode(Image.fromarray(RGB))[:60])


def test_pixel_limit_checked_before_decoding():
    with pytest.raises(FrameTooLargeError, match="12x10 = 120 pixels, over the limit of 100") as info:
        load_frame(encode(Image.fromarray(RGB)), max_pixels=100)
    assert info.value.status == 413


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "JPEG"])
@pytest.mark.parametrize("max_pixels", [DEFAULT_MAX_PIXELS, None])
def test_an_image_bomb_is_too_large_from_its_header(fmt, max_pixels):
    """60000 x 60000 is past Pillow's own decompression-bomb limit, which fires before ours could."""
    with pytest.raises(FrameTooLargeError, match=r"^frame0 declares more than \d+ pixels") as info:
        load_frame(image_header(fmt, 60000, 60000), "frame0", max_pixels)
    assert info.value.status == 413


def test_side_limit_checked_from_the_header():
    """A header alone (no pixel data to decode) is enough to refuse it."""
    with pytest.raises(FrameTooLargeError, match=r"^frame1 is 70000x1: a side over 65536 pixels") as info:
        load_frame(image_header("PNG", 70000, 1), "frame1", max_side=65536)
    assert info.value.status == 413
    assert load_frame(encode(Image.fromarray(RGB)), max_side=12).shape == (3, 10, 12)


@pytest.mark.parametrize("orientation, size", [(1, (12, 10)), (6, (10, 12)), (8, (10, 12))])
def test_oriented_size_is_what_open_image_returns(orientation, size):
    image = Image.fromarray(RGB)
    exif = image.getexif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif.tobytes())
    assert oriented_size(buffer.getvalue()) == size == open_image(buffer.getvalue()).size


def test_pair_of_different_sizes():
    with pytest.raises(BadInputError, match="frame0 is 12x10, frame1 is 12x11"):
        check_pair(torch.zeros(3, 10, 12), torch.zeros(3, 11, 12))


def test_png_out_rounds():
    frame = torch.tensor([0.0, 0.5 / 255, 0.6 / 255, 1.0]).reshape(1, 1, 4).expand(3, 1, 4)
    out = np.asarray(Image.open(io.BytesIO(to_png(frame))))
    assert out.dtype == np.uint8 and out[0, :, 0].tolist() == [0, 0, 1, 255]


def png_header_with_orientation(width: int, height: int, orientation: int | None) -> bytes:
    """A PNG header, an eXIf chunk before the (absent) pixel data unless ``orientation`` is None,
    and no pixels."""
    if orientation is None:
        return image_header("PNG", width, height)
    exif = Image.Exif()
    exif[0x0112] = orientation
    body = b"eXIf" + exif.tobytes()
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    header = image_header("PNG", width, height)
    return header[:33] + chunk + header[33:]


@pytest.mark.parametrize("orientation, size", [(None, (3840, 2160)), (1, (3840, 2160)), (6, (2160, 3840)), (8, (2160, 3840))])
def test_oriented_size_of_a_png_reads_no_pixel_data(orientation, size):
    """Pillow's getexif() of a PNG without an eXIf chunk before its pixel data decodes the whole
    image to look for one after it; the header read does not (this PNG has no pixels to decode)."""
    data = png_header_with_orientation(3840, 2160, orientation)
    assert oriented_size(data) == size == check_frame(data, "frame0", DEFAULT_MAX_PIXELS)
    with pytest.raises(BadInputError, match="not a readable image"):
        load_frame(data)


def with_exif_chunk(png: bytes, exif: bytes, late: bool) -> bytes:
    """``png`` with an eXIf chunk holding ``exif``: after IHDR, or (``late``) after the pixel data, before IEND."""
    body = b"eXIf" + exif
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    at = len(png) - 12 if late else 33
    return png[:at] + chunk + png[at:]


def orientation_exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_a_late_exif_chunk_is_read_as_the_pixels_are_stored(orientation):
    """The PNG specification (3rd edition) places eXIf before the pixel data, and browsers ignore a
    late one; Pillow reads it as the image loads. Before: the cloud's header read ignored it and the
    decode applied it, so the cloud refused the frame (400, "decodes to 10x12, not the 12x10") while
    the command line turned it. Now every reader takes the pixels as stored; an early chunk turns them."""
    plain = encode(Image.fromarray(RGB))
    late = with_exif_chunk(plain, orientation_exif(orientation), late=True)
    assert oriented_size(late) == open_image(late).size == (12, 10)
    assert torch.equal(load_frame(late), load_frame(plain))
    config = preset("tiny")
    assert torch.equal(read_chunk([late, plain], config, DEFAULT_MAX_PIXELS, 65536, 10**6, 10**7)[0], load_frame(plain))
    early = with_exif_chunk(plain, orientation_exif(orientation), late=False)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(early)))
    assert oriented_size(early) == open_image(early).size == upright.size
    assert np.array_equal(np.asarray(open_image(early)), np.asarray(upright))


@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize("exif", [b"garbage!", b"", b"II*\x00\x08\x00\x00\x00"])
def test_an_exif_chunk_that_does_not_parse_is_ignored(exif, late):
    """As a browser shows such a PNG: as stored. Before: an early one made the frame unreadable (400)."""
    data = with_exif_chunk(encode(Image.fromarray(RGB)), exif, late)
    assert oriented_size(data) == (12, 10) and np.array_equal(np.asarray(open_image(data)), RGB)


def oriented_tiff(orientation: int) -> bytes:
    """:data:`RGB` as an 8-bit TIFF with an EXIF orientation, by Pillow."""
    image = Image.fromarray(RGB)
    exif = image.getexif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    image.save(buffer, format="TIFF", exif=exif.tobytes())
    return buffer.getvalue()


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_a_tiff_is_turned_once(orientation):
    """Pillow turns a TIFF by its orientation itself (its size from the header, its pixels as they
    load). Before: the header read turned its size once more, so the cloud refused one turned by 90 degrees."""
    data = oriented_tiff(orientation)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert oriented_size(data) == open_image(data).size == upright.size
    assert np.array_equal(np.asarray(open_image(data)), np.asarray(upright))


def test_a_frame_decoded_into_a_batch_equals_one_decoded_alone():
    sixteen = Image.fromarray(np.arange(120, dtype=np.uint16).reshape(10, 12) * 500)
    for image in (Image.fromarray(RGB), Image.fromarray(RGB).convert("P"), sixteen, Image.fromarray(RGB[..., 0]).convert("F")):
        batch = torch.full((2, 3, 10, 12), 7.0)
        image_to_tensor(image, batch[1])
        assert torch.equal(batch[1], load_frame(encode(image, "TIFF" if image.mode == "F" else "PNG")))
        assert torch.equal(batch[1], image_to_tensor(image)) and (batch[0] == 7).all()


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_frames_on_a_cpu_are_from_pixels_bit_for_bit(dtype):
    """Every level of the depth in the frames: the scaling is a function of the level alone, so
    these frames stand for all frames. The edge's E_cond must see the tensor the cloud computed from."""
    top = np.iinfo(dtype).max + 1
    pixels = np.random.default_rng(1).integers(0, top, (3, 128, 256, 3), dtype=dtype)
    pixels.reshape(-1)[:top] = np.arange(top, dtype=dtype)
    got = frames_on(pixels, torch.device("cpu"))
    assert len(got) == 3
    for frame, expected in zip(got, pixels):
        assert frame.is_contiguous() and torch.equal(frame, from_pixels(expected))


def test_frames_scaled_by_table_are_from_pixels_bit_for_bit():
    """The path of frames uploaded to a GPU as they are, run here on the CPU's tensors."""
    pixels = np.random.default_rng(2).integers(0, 256, (2, 16, 40, 3), dtype=np.uint8)
    pixels.reshape(-1)[:256] = np.arange(256, dtype=np.uint8)
    got = scaled_by_table(torch.from_numpy(pixels))
    assert [tuple(f.shape) for f in got] == [(3, 16, 40)] * 2
    for frame, expected in zip(got, pixels):
        assert frame.is_contiguous() and torch.equal(frame, from_pixels(expected))


def rgb16_tiff(pixels: np.ndarray, orientation: int | None) -> bytes:
    """[H, W, 3] uint16 as a baseline uncompressed little-endian TIFF, with an orientation tag unless None."""
    height, width, _ = pixels.shape
    data = pixels.astype("<u2").tobytes()
    entries = [(256, 3, 1, width), (257, 3, 1, height), (258, 3, 3, None), (259, 3, 1, 1), (262, 3, 1, 2),
               (273, 4, 1, None), (274, 3, 1, orientation), (277, 3, 1, 3), (278, 3, 1, height),
               (279, 4, 1, len(data)), (284, 3, 1, 1)]
    entries = [e for e in entries if e[3] is not None or e[0] in (258, 273)]
    ifd_size = 2 + 12 * len(entries) + 4
    bits_at, data_at = 8 + ifd_size, 8 + ifd_size + 6
    ifd = struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        value = {258: bits_at, 273: data_at}.get(tag, value)
        ifd += struct.pack("<HHI", tag, kind, count) + (struct.pack("<HH", value, 0) if kind == 3 and tag != 258 else struct.pack("<I", value))
    return b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + struct.pack("<3H", 16, 16, 16) + data


@pytest.mark.parametrize("container", ["png", "png-exif-prefixed", "tiff"])
@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_a_16_bit_frame_is_turned_by_its_orientation_as_an_8_bit_one_is(container, orientation):
    """Pillow holds no 16-bit RGB image, so FFmpeg decodes those, and FFmpeg leaves EXIF orientation
    undone. Before: a 16-bit PNG with orientation 2-4 reached the model as stored (an 8-bit one
    upright), one turned by 90 degrees was refused by the cloud ("send it upright"), and a 16-bit
    TIFF turned by 90 degrees was unreadable (its decoded size was not its header's)."""
    from eden_serve.media.frames import open_deep
    from eden_serve.wire.png import rgb16_png
    levels = RGB.astype(np.uint16) * 257
    if container != "tiff":  # PNG's eXIf holds a TIFF header; some writers keep JPEG's "Exif\0\0" before it
        exif = orientation_exif(orientation)[0 if container.endswith("prefixed") else 6:]
        deep = with_exif_chunk(rgb16_png(levels), exif, late=False)
        shallow = with_exif_chunk(encode(Image.fromarray(RGB)), exif, late=False)
    else:
        deep, shallow = rgb16_tiff(levels, orientation), oriented_tiff(orientation)
    upright = np.asarray(open_image(shallow))
    assert upright.shape != RGB.shape or orientation < 5  # the 8-bit oracle is turned
    assert np.array_equal(open_deep(deep).numpy(), upright.astype(np.uint16) * 257)
    assert oriented_size(deep) == check_frame(deep, "f", DEFAULT_MAX_PIXELS) == (upright.shape[1], upright.shape[0])
    assert torch.equal(load_frame(deep), load_frame(shallow))
    config = preset("tiny")
    assert torch.equal(read_chunk([deep, deep], config, DEFAULT_MAX_PIXELS, 65536, 10**6, 10**7)[0], load_frame(shallow))


@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize("exif", [b"garbage!", b"", b"II*\x00\x08\x00\x00\x00", orientation_exif(3)])
def test_a_16_bit_png_is_read_whatever_its_exif_chunk_holds(exif, late):
    """Pillow ignores an eXIf chunk it cannot parse, and takes one with JPEG's "Exif" prefix; FFmpeg's
    PNG decoder refused the whole 16-bit image for either (not readable, 400 from the cloud) while
    its 8-bit twin was read. Now both are read alike: as stored, or turned by an early chunk that parses."""
    from eden_serve.media.frames import open_deep
    from eden_serve.wire.png import rgb16_png
    deep = with_exif_chunk(rgb16_png(RGB.astype(np.uint16) * 257), exif, late)
    shallow = with_exif_chunk(encode(Image.fromarray(RGB)), exif, late)
    assert np.array_equal(open_deep(deep).numpy(), np.asarray(open_image(shallow)).astype(np.uint16) * 257)


@pytest.mark.parametrize("mode, written", [("CMYK", "RGB"), ("LAB", "RGB"), ("F", "I;16"), ("I", "I;16"), ("PA", "RGBA")])
def test_a_middle_of_a_mode_png_cannot_hold_goes_up_as_a_png(mode, written):
    """A 4x run's middle crosses to the cloud as a PNG (Frame.encoded): one of a CMYK directory
    failed there (`cannot write mode CMYK as PNG`); it goes as a directory clip writes it."""
    from eden_serve.media import Frame

    picture = Image.fromarray(RGB).convert("L").convert(mode) if mode in ("F", "I") else Image.fromarray(RGB).convert(mode)
    with Image.open(io.BytesIO(Frame(0, "middle", image=picture).encoded)) as sent:
        assert (sent.format, sent.mode, sent.size) == ("PNG", written, (12, 10))

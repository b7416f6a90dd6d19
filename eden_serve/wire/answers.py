"""What the edge answers the client: a chunk's middle frames as PNGs, whole or streamed.

Whole: one PNG for a pair, else a stored zip of ``000.png``, ``001.png``, ... Streamed (a request
that asks for it, docs/streaming.md): a sequence of records, each sent as soon as it is known,
which a transport may cut or join anywhere (HTTP chunks, gRPC messages)::

    kind (1 byte)  index (u32, big-endian)  length (u32)  data (length bytes)

``M``: the middle of the chunk's pair ``index``, a PNG (or a raw middle, :mod:`.raw`, where the
client asked for raw answers); ``E``: the request failed after some middles
were sent, data its JSON error document; ``Z``: the end (``index`` 0, no data).
Every answer is judged before a pixel is decoded: a PNG by its header (RGB of the frames' size, 8
bits, or 16 for a chunk deeper than 8 bits, as the edge makes them), a record by its length, so a
broken or hostile server can make the client neither decode a bomb nor write frames of another size.
A 16-bit middle comes to the client as its pixels (a uint16 tensor [H, W, 3]), which Pillow cannot hold.
"""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ..errors import ServerError, TransientError, error_from_document
from .png import RGB8, RGB16, most_png_bytes, png_header, rgb16_pixels
from .raw import RawPlanes, decode_raw, is_raw, raw_bytes

# A middle as the client gets it: an 8-bit RGB image, 16-bit RGB pixels, or (raw, asked) the planes of its output.
Middle = Image.Image | torch.Tensor | RawPlanes

MIDDLE, FAILED, END = b"M", b"E", b"Z"
RECORD_HEADER = struct.Struct(">cII")
STREAMED = "application/x-eden-middles"  # the content type of a streamed answer
ZIP_RECORDS = 128  # a stored entry's local and central records with its name, and room to spare


def record(kind: bytes, index: int, data: bytes = b"") -> bytes:
    return RECORD_HEADER.pack(kind, index, len(data)) + data


def middle_of(pixels: np.ndarray | RawPlanes) -> Middle:
    """Raw pixels as the client takes a middle: an image at 8 bits, the pixels at 16; planes as they are."""
    if isinstance(pixels, RawPlanes):
        return pixels
    return Image.fromarray(pixels) if pixels.dtype == np.uint8 else torch.from_numpy(np.array(pixels))


def middle_image(content: bytes, size: tuple[int, int], where: str, raw: bool = False) -> Middle:
    """A middle frame: an RGB PNG of ``size`` (width, height), 8 or 16 bits, read from its header
    first; or, where the client asked for them (``raw``), a raw middle of that size."""
    if raw and is_raw(content):
        return middle_of(decode_raw(content, size, where))
    stated = png_header(content)
    if stated is None:
        start = " ".join(content[:100].decode(errors="replace").split())
        raise ServerError(502, "bad_answer", f"the answer is not a PNG: {start!r} {where}")
    width, height, depth, colour = stated
    if (width, height) != size or (depth, colour) not in (RGB8, RGB16):
        mode = "" if (depth, colour) in (RGB8, RGB16) else f" not in 8- or 16-bit RGB (depth {depth}, colour type {colour})"
        raise ServerError(502, "bad_answer", f"the answer is a {width}x{height} PNG{mode}, for frames of {size[0]}x{size[1]} {where}")
    try:
        if (depth, colour) == RGB16:
            return torch.from_numpy(rgb16_pixels(content, size[::-1]))
        image = Image.open(io.BytesIO(content), formats=["PNG"])
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError, struct.error) as exc:
        raise ServerError(502, "bad_answer", f"the answer is a broken PNG ({type(exc).__name__}) {where}") from None
    return image


def most_answer_bytes(pairs: int, size: tuple[int, int], raw: bool = False) -> int:
    """The longest whole answer taken for ``pairs`` middles of ``size``: each at its largest PNG (or
    raw middle, where they were asked for) with its zip records, or an error document."""
    each = max(most_png_bytes(*size, 16), raw_bytes(*size, 16) if raw else 0)
    return pairs * (each + ZIP_RECORDS) + (1 << 16)


def zip_of(pngs) -> bytes:
    """A stored (not deflated) zip of ``000.png``, ``001.png``, ...: PNGs are compressed already."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for j, png in enumerate(pngs):
            archive.writestr(f"{j:03d}.png", png)
    return buffer.getvalue()


def whole_answer(content: bytes, pairs: int, size: tuple[int, int], where: str) -> list[Middle]:
    """The middle frames of a whole answer to ``pairs`` pairs of frames of ``size``."""
    if pairs == 1:
        return [middle_image(content, size, where)]
    names = [f"{j:03d}.png" for j in range(pairs)]
    most = most_png_bytes(*size, 16)
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            entries = archive.infolist()
            if [e.filename for e in entries] != names or any(e.compress_type != zipfile.ZIP_STORED or e.file_size > most for e in entries):
                raise ServerError(502, "bad_answer", f"the answer is not a zip of {pairs} stored PNGs {names[0]}...{names[-1]} {where}")
            return [middle_image(archive.read(name), size, where) for name in names]
    # NotImplementedError: a zip version or method zipfile lacks; RuntimeError: an encrypted entry.
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, RuntimeError, EOFError, struct.error) as exc:
        start = " ".join(content[:100].decode(errors="replace").split())
        raise ServerError(502, "bad_answer", f"the answer is not a zip of {pairs} PNGs ({exc}): {start!r} {where}") from None


class StreamedAnswer:
    """Reads a streamed answer to the pairs ``first`` ... ``pairs - 1`` of a chunk of frames of
    ``size``, as its bytes come: :meth:`feed` returns the middles completed, ``(j, image)`` in
    order; :meth:`finish` says whether the answer is whole (False: it was cut short, and what did
    not arrive must be asked for again). A failure record raises its error."""

    def __init__(self, first: int, pairs: int, size: tuple[int, int], where: str, raw: bool = False):
        self.next, self.pairs, self.size, self.where, self.raw = first, pairs, size, where, raw
        self.most = max(most_png_bytes(*size, 16), raw_bytes(*size, 16)) if raw else most_png_bytes(*size, 16)
        self.buffer = bytearray()
        self.ended = False

    def _bad(self, problem: str) -> ServerError:
        return ServerError(502, "bad_answer", f"the streamed answer {problem} {self.where}")

    def feed(self, data: bytes) -> list[tuple[int, Middle]]:
        self.buffer += data
        middles = []
        while len(self.buffer) >= RECORD_HEADER.size:
            kind, index, length = RECORD_HEADER.unpack_from(self.buffer)
            if self.ended or kind not in (MIDDLE, FAILED, END) or length > self.most:
                raise self._bad(f"holds a record it should not ({kind!r}, {length} bytes)")
            if len(self.buffer) < RECORD_HEADER.size + length:
                break
            data = bytes(self.buffer[RECORD_HEADER.size:RECORD_HEADER.size + length])
            del self.buffer[:RECORD_HEADER.size + length]
            if kind == FAILED:
                refused = error_from_document(data)
                if refused is None:
                    raise self._bad("failed without an error document")
                if refused.status >= 500:  # as a 5xx answer: worth asking again
                    raise TransientError(f"{refused} (HTTP {refused.status}) {self.where}")
                raise ServerError(refused.status, refused.kind, f"{refused} {self.where}")
            if kind == END:
                if self.next != self.pairs:
                    raise self._bad(f"ended after pair {self.next - 1} of a chunk of {self.pairs}")
                self.ended = True
                continue
            # A middle past the chunk's last would be taken for a frame the run does not have, and
            # one after another, without end, would be held without bound.
            if index != self.next or index >= self.pairs:
                due = f"pair {self.next} was due" if self.next < self.pairs else f"the chunk's pairs end at {self.pairs - 1}"
                raise self._bad(f"sent pair {index} where {due}")
            middles.append((index, middle_image(data, self.size, self.where, self.raw)))
            self.next += 1
        return middles

    def finish(self) -> bool:
        """Whether the answer is whole: its end record came, or every middle did (an edge killed
        between its last middle and its end leaves nothing to ask for; docs/streaming.md)."""
        if self.buffer and self.ended:
            raise self._bad("goes on after its end")
        return self.ended or self.next == self.pairs

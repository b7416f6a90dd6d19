"""How the edge decodes a bitstream payload's packets, by whom it was made (docs/errors-and-limits.md,
"The decoder's sandbox"): its work bounded first (every packet is decoded, at the declared frame
size: ``handler.max_decoded_pixels``); a payload that carries its cloud's keyed tag decoded in
this process, any other in the sandbox, or refused where ``handler.unkeyed_bitstream`` is
``refuse``."""

from __future__ import annotations

import numpy as np

from ..errors import TooMuchWorkError, UnauthenticPayloadError
from ..media import sandbox
from ..media.packets import decode_chunk
from ..wire import BitstreamChunk
from .worker import Settings


def check_work(chunk: BitstreamChunk, max_decoded_pixels: int) -> None:
    """Refuses a payload whose packets would decode to more pixels than the edge decodes for one
    request (each packet a frame, skipped ones included: the decoder makes them all)."""
    height, width = chunk.size
    work = len(chunk.packets) * height * width
    if work > max_decoded_pixels:
        raise TooMuchWorkError(f"the payload's {len(chunk.packets)} packets decode to {len(chunk.packets)} frames of {width}x{height}, "
                               f"{work} pixels, over this edge's {max_decoded_pixels} for one request (handler.max_decoded_pixels); "
                               "send shorter chunks, or the frames codec")


def decoded(chunk: BitstreamChunk, settings: Settings, keyed: bool) -> np.ndarray:
    """The frames of ``chunk``, [F, H, W, 3] uint8 (the bitstream kind checks each against the
    cloud's digest: 409 where one differs). ``keyed``: the payload's tag was checked against this
    edge's wire key, so its cloud made it."""
    check_work(chunk, settings.max_decoded_pixels)
    if keyed:
        return decode_chunk(chunk, settings.max_pixels)
    if settings.unkeyed_bitstream == "refuse":
        raise UnauthenticPayloadError("this edge decodes only bitstream payloads its cloud signed (handler.unkeyed_bitstream: "
                                      "refuse), and it holds no wire key; send the frames codec, or give both a wire key")
    return sandbox.decode_chunk(chunk, settings.max_pixels, settings.decode_deadline_s)

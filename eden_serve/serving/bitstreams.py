"""How the edge decodes a bitstream payload's packets, by whom it was made (docs/errors-and-limits.md,
"The decoder's sandbox"): a payload that carries its cloud's keyed tag is decoded in this process,
any other in the sandbox, or refused where ``handler.unkeyed_bitstream`` is ``refuse``; its work is
bounded first (``handler.max_decoded_pixels``). The decoder itself is the edge's
(:class:`~eden_serve.edge.conditions.PacketDecoder`); this chooses its settings."""

from __future__ import annotations

from ..edge.conditions import PacketDecoder
from ..media import sandboxed
from .worker import Settings


def packet_decoder(settings: Settings, keyed: bool) -> PacketDecoder:
    """The decoder of the edge's bitstream payloads. ``keyed``: the edge checks each payload's tag
    against its wire key, so a payload it takes was made by its cloud."""
    where = "process" if keyed else settings.unkeyed_bitstream
    return PacketDecoder(settings.max_pixels, settings.max_decoded_pixels, where, settings.decode_deadline_s)


def start_sandbox(settings: Settings, keyed: bool) -> None:
    """Starts the worker's sandbox as it loads, where bitstream payloads will be decoded there (no
    wire key, ``handler.unkeyed_bitstream: sandbox``): the first payload does not wait for it."""
    if packet_decoder(settings, keyed).where == "sandbox":
        sandboxed.start()

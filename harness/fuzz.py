"""Coverage-guided fuzzing (atheris: libFuzzer for Python) of every parser that reads bytes from
the other side of a link, seeded with real payloads that our own encoders make at run time.

    .venv/bin/python -m harness.fuzz seed DIR             # writes every target's seeds under DIR/TARGET
    .venv/bin/python -m harness.fuzz wire -runs=100000 -rss_limit_mb=2048 -timeout=10 DIR/wire

Targets (:data:`TARGETS`): ``wire`` (:func:`eden_serve.wire.decode`, formats 2, 3 and 4 in every
codec), ``keyed`` (a keyed envelope, then the payload in it), ``elided`` (a bitstream answer
without its packets, as the client fills it in), ``pages`` (pages of packets from the cloud),
``answers`` (the edge's answers, whole and streamed), ``bitstream`` (a bitstream payload decoded by
:mod:`eden_serve.media.sandboxed`, as an edge decodes one it does not trust), ``decoder`` (the
packets' bytes alone, in a seed chunk's structure, so that every input is decoded); ``all`` runs them all
in one process (tests/test_fuzz.py), ``benchmarks/fuzz.py`` each on its own.

A mutated payload would fail its digest (or its keyed tag) at once, so the targets seal each input
again before parsing it, as well as parsing it as it came: the mutations then reach the header and
the body. A target lets only the package's refusals (:class:`~eden_serve.errors.EdenError`)
through: any other exception is a crash (atheris prints it and exits non-zero), and so is a
signal; an input over libFuzzer's ``-timeout`` is a hang, memory over ``-rss_limit_mb`` a failure.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

import atheris

with atheris.instrument_imports(include=["eden_serve"]):
    from eden_serve.model import synthetic
    from eden_serve import wire
    from eden_serve.media import sandboxed as sandbox
    from eden_serve.wire import pages
    from eden_serve.media.packets import PacketReader
    from eden_serve.config import PRESETS
    from eden_serve.errors import EdenError, TransientError
    from eden_serve.media.frames import png_of
    from eden_serve.wire import keyed
    from eden_serve.wire.answers import END, MIDDLE, StreamedAnswer, record, whole_answer, zip_of
    from eden_serve.wire.bitstream import elide, fill, frame_digest, to_frames, wanted
    from eden_serve.wire.envelope import DIGEST_SIZE, PREFIX

CONFIG = PRESETS["tiny"]
SIZE = (48, 64)  # height, width of the seeds' frames: small inputs mutate fast
KEY = b"fuzzing key, 32 bytes long......"
CLOUD = hashlib.sha256(b"fuzzed cloud").hexdigest()
# The edge's own limits for these frames (handler settings), so an input is judged as a server would.
LIMITS = {"max_pixels": 1 << 20, "max_frames": 17, "max_tokens": 4096, "max_chunk_tokens": 1 << 17}
# Encoders of the seeds' videos, one per decoder of the bitstream codec that this FFmpeg can make.
VIDEOS = {"h264": ("libx264", {"g": "4", "bf": "2"}), "hevc": ("libx265", {"x265-params": "keyint=4:bframes=2:log-level=none"}),
          "vp9": ("libvpx-vp9", {"g": "4"})}


def reseal(data: bytes) -> bytes:
    """``data`` with its last 16 bytes replaced by the envelope's digest of the rest."""
    if len(data) < PREFIX.size + DIGEST_SIZE:
        return data
    body = data[:-DIGEST_SIZE]
    return body + hashlib.blake2b(body, digest_size=DIGEST_SIZE).digest()


def decode(data: bytes):
    return wire.decode(data, CONFIG, **LIMITS)


def fuzz_wire(data: bytes) -> None:
    for payload in (data, reseal(data)):
        refused(decode, payload)


def fuzz_keyed(data: bytes) -> None:
    inner = reseal(data[keyed.TAGGED_PREFIX:])
    for payload in (data, keyed.sign(inner, KEY)):
        refused(lambda p: decode(keyed.verify(p, KEY)), payload)


def fuzz_elided(data: bytes) -> None:
    def filled(elided: bytes) -> None:
        lengths = [length for _, _, length in wanted(elided)]
        whole = fill(elided, [bytes(min(n, 1 << 16)) for n in lengths])
        decode(keyed.verify(whole, None))

    refused(filled, data)


def fuzz_pages(data: bytes) -> None:
    refused(pages.unpack, data)


def fuzz_answers(data: bytes) -> None:
    def streamed(content: bytes) -> None:
        answer = StreamedAnswer(0, 3, (SIZE[1], SIZE[0]), "(fuzzed)")
        for start in range(0, len(content), 97):  # a transport cuts the bytes anywhere
            answer.feed(content[start:start + 97])
        answer.finish()

    refused(streamed, data)
    refused(lambda content: whole_answer(content, 3, (SIZE[1], SIZE[0]), "(fuzzed)"), data)


def fuzz_bitstream(data: bytes) -> None:
    def decoded(payload: bytes) -> None:
        chunk = decode(payload)
        if isinstance(chunk, wire.BitstreamChunk):
            to_frames(chunk, sandbox.decode_chunk(chunk, LIMITS["max_pixels"]))

    refused(decoded, reseal(data))


_chunks: list = []  # the decoder target's chunks: the bitstream seeds, decoded once


def fuzz_decoder(data: bytes) -> None:
    """The packets' bytes of a seed chunk (picked by the first byte) replaced by the input, cut at
    the seed's proportions, timing and flags kept: every input reaches the sandboxed decoder."""
    if not _chunks:
        with tempfile.TemporaryDirectory() as scratch:
            _chunks.extend(wire.decode(p, CONFIG) for p in bitstream_payloads(Path(scratch)))
    if len(data) < 2:
        return
    chunk = _chunks[data[0] % len(_chunks)]
    body, total = data[1:], sum(len(p.data) for p in chunk.packets)
    cuts = [0]
    for packet in chunk.packets:
        cuts.append(min(len(body), cuts[-1] + max(1, len(packet.data) * len(body) // total)))
    packets = [replace(p, data=body[a:b] or b"\0") for p, a, b in zip(chunk.packets, cuts, cuts[1:])]
    forged = replace(chunk, packets=packets)
    refused(lambda _: to_frames(forged, sandbox.decode_chunk(forged, LIMITS["max_pixels"])), b"")


def decoder_seeds(streams: list[bytes]) -> list[bytes]:
    return [bytes([i]) + b"".join(p.data for p in wire.decode(payload, CONFIG).packets) for i, payload in enumerate(streams)]


def refused(parse: Callable[[bytes], object], data: bytes) -> None:
    """``parse(data)``, where a refusal is an answer and anything else a crash."""
    try:
        parse(data)
    except (EdenError, TransientError):
        pass


# --- seeds: real payloads of every kind ----------------------------------------------------------


def token_payloads() -> list[bytes]:
    chunk = synthetic.chunk(CONFIG, SIZE, frames=3)
    chunk.decisions.cuts, chunk.copies = [1], {1: png_of(synthetic.scene(*SIZE, 0.5))}  # pair 1 across a cut: its copy travels
    return [wire.encode(chunk, CONFIG, codec) for codec in wire.TOKEN_CODECS]


def frames_payload() -> bytes:
    pixels = __import__("numpy").stack([synthetic.scene(*SIZE, t) for t in (0.0, 0.3, 0.6)])
    return wire.encode(wire.FramesChunk(pixels, wire.Decisions([0.1, -0.2], [7, 8], [1], CLOUD)), CONFIG, wire.FRAMES_CODEC)


def bitstream_payloads(directory: Path) -> list[bytes]:
    """A chunk from the middle of a short clip of each codec in :data:`VIDEOS` (B-frames where the
    encoder makes them, so the chunk skips frames and reorders)."""
    from harness.videos import local_frames, make_clip

    payloads = []
    for name, (encoder, options) in VIDEOS.items():
        path = make_clip(directory / f"{name}.mkv", encoder, options, SIZE, 10)
        reader, frames = PacketReader(path), local_frames(path)
        span = reader.needed(5, 7)
        chunk = wire.BitstreamChunk(reader.parameters, reader.packets(span), span.skip, 3, [frame_digest(f) for f in frames[5:8]],
                                    wire.Decisions([0.5, 0.25], [3, 4], [], CLOUD))
        payloads.append(wire.encode(chunk, CONFIG, wire.BITSTREAM_CODEC))
    return payloads


def answer_seeds() -> list[bytes]:
    pngs = [png_of(synthetic.scene(*SIZE, t)) for t in (0.1, 0.2, 0.3)]
    return [b"".join([*(record(MIDDLE, j, png) for j, png in enumerate(pngs)), record(END, 0)]), zip_of(pngs)]


def page_seeds(directory: Path) -> list[bytes]:
    from eden_serve.cloud.sources import SourceVideo

    video = SourceVideo(directory / "h264.mkv", 1 << 20)
    return [pages.pack(video.page(None, 0)), pages.pack(video.page(None, 4))]


def seed(directory: Path) -> None:
    """Every target's seed corpus under ``directory``/TARGET: real payloads, one file each."""
    directory.mkdir(parents=True, exist_ok=True)
    streams = bitstream_payloads(directory)
    kinds = {
        "wire": token_payloads() + [frames_payload()] + streams,
        "keyed": [keyed.sign(p, KEY) for p in token_payloads()[:2] + [frames_payload()] + streams[:1]],
        "elided": [elide(p) for p in streams] + [elide(keyed.sign(streams[0], KEY))],
        "pages": page_seeds(directory),
        "answers": answer_seeds(),
        "bitstream": streams,
        "decoder": decoder_seeds(streams),
    }
    for target, payloads in kinds.items():
        (directory / target).mkdir(exist_ok=True)
        for i, payload in enumerate(payloads):
            (directory / target / f"seed-{i}").write_bytes(payload)
    seed_all(directory)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "wire": fuzz_wire, "keyed": fuzz_keyed, "elided": fuzz_elided, "pages": fuzz_pages, "answers": fuzz_answers,
    "bitstream": fuzz_bitstream, "decoder": fuzz_decoder,
}
ALL = "all"  # every target in one process: an input's first byte picks its target (CI's short run)


def fuzz_all(data: bytes) -> None:
    if data:
        targets = list(TARGETS.values())
        targets[data[0] % len(targets)](data[1:])


def seed_all(directory: Path) -> None:
    """The ``all`` target's corpus: each target's seeds behind the byte that picks it."""
    (directory / ALL).mkdir(exist_ok=True)
    for number, target in enumerate(TARGETS):
        for path in sorted((directory / target).iterdir()):
            (directory / ALL / f"{target}-{path.name}").write_bytes(bytes([number]) + path.read_bytes())


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] not in (*TARGETS, ALL, "seed"):
        sys.exit(f"usage: python -m harness.fuzz seed DIR | TARGET [libFuzzer flags] CORPUS ({', '.join([*TARGETS, ALL])})")
    if argv[1] == "seed":
        seed(Path(argv[2]))
        return
    target = fuzz_all if argv[1] == ALL else TARGETS[argv[1]]
    atheris.Setup([argv[0], *argv[2:]], lambda data: target(bytes(data)))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)

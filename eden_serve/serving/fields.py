"""The HTTP side of a request: TorchServe's view of form fields and bodies, and content types.

TorchServe passes each multipart field as its own key of the request dict; a value is bytes, a str
(text parts) or an already parsed object (application/json parts). A raw POST body arrives under
"body" (workflows, raw POSTs) or "data".
"""

from __future__ import annotations

import re
from typing import Any

from .. import wire
from ..config import MAX_SEED
from ..errors import BadInputError, ChunkTooLargeError

OCTET_STREAM = "application/octet-stream"
PNG = "image/png"
JSON = "application/json"
ZIP = "application/zip"
FORM_HELP = ("send multipart/form-data with image fields frame0, frame1 (... frameK), optional seed (integer), "
             "codec and scene_threshold")
SOURCE_HELP = ("name a video under the cloud's media root in field source, with ask=probe, ask=packets (and stream, "
               "start), or a chunk's first frame (start) and frames (2 or more), and optional seed, codec and scene_threshold")
ASKS = ("chunk", "probe", "packets")
FRAME_FIELD = re.compile(r"frame\d+")


def form_field(request: dict, name: str) -> Any:
    """A form field of a TorchServe request, or BadInputError when it is missing."""
    value = request.get(name)
    if value is None:
        raise BadInputError(f"missing form field {name!r}; {FORM_HELP}")
    return value


def frame_fields(request: dict, max_frames: int) -> list[str]:
    """The names of a request's frame fields, frame0 ... frameK in order, all present."""
    count = sum(1 for key in request if isinstance(key, str) and FRAME_FIELD.fullmatch(key))
    if count > max_frames:
        raise ChunkTooLargeError(f"{count} frames in one request, over this server's {max_frames}; send shorter chunks")
    names = [f"frame{i}" for i in range(max(count, 2))]
    missing = [name for name in names if request.get(name) is None]
    if missing:
        raise BadInputError(f"missing form field {missing[0]!r}; {FORM_HELP}")
    return names


def image_bytes(value: Any, name: str) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()  # a text part: the image decoder refuses it
    raise BadInputError(f"form field {name!r} must be an image file, got a JSON {type(value).__name__}; {FORM_HELP}")


def text(value: Any, name: str, encoding: str = "ascii") -> str:
    """A text field; ``encoding`` "utf-8" for one that names a file (a source: any name its
    file system holds), else ASCII (numbers, words of a few letters)."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode(encoding).strip()
        except UnicodeDecodeError:
            raise BadInputError(f"form field {name!r} must be {'ASCII' if encoding == 'ascii' else encoding.upper()} text") from None
    if isinstance(value, str):
        return value.strip()
    raise BadInputError(f"form field {name!r} must be text, got a JSON {type(value).__name__}")


def parse_seed(value: Any) -> int:
    if value is None:
        return 0
    if type(value) is int:
        seed = value
    else:
        digits = text(value, "seed")
        if not (digits.isascii() and digits.isdigit()):  # no sign, inner spaces, 1e3, 0x10 or "²"
            raise BadInputError(f"seed must be a decimal integer in [0, {MAX_SEED}], got {digits!r:.40}")
        # Leading zeros aside, a seed in range has at most 20 digits; int() refuses over 4300.
        significant = digits.lstrip("0") or "0"
        if len(significant) > len(str(MAX_SEED)):
            raise BadInputError(f"seed must be in [0, {MAX_SEED}], got a number of {len(significant)} digits")
        seed = int(significant)
    if not 0 <= seed <= MAX_SEED:
        raise BadInputError(f"seed must be in [0, {MAX_SEED}], got {seed}")
    return seed


def parse_threshold(value: Any, default: float | None) -> float | None:
    """The scene-cut threshold of a request: a number in [0, 3], or "off"."""
    if value is None:
        return default
    word = text(value, "scene_threshold") if not isinstance(value, (int, float)) or isinstance(value, bool) else value
    if word == "off":
        return None
    try:
        threshold = float(word)
    except (TypeError, ValueError):
        threshold = float("nan")
    if not 0 <= threshold <= 3:  # also false for NaN
        raise BadInputError(f"scene_threshold must be a number in [0, 3] or off, got {str(word)!r:.40}")
    return threshold


def parse_kind(value: Any, default: str, *, source: bool = False) -> wire.Kind:
    """The payload kind a request's ``codec`` names (absent: ``default``); the bitstream kind only
    for a chunk of a named ``source``, whose own packets it carries."""
    return wire.kind(default if value is None else text(value, "codec"), source=source)


def request_body(request: dict) -> Any:
    """The raw body of a request."""
    for key in ("body", "data"):
        value = request.get(key)
        if value not in (None, b"", ""):
            return value
    # A body sent as a form (curl -d or --data-binary's default type is a urlencoded form) reaches
    # the handler as TorchServe's fields, not as a body: say so rather than "empty".
    sent = sorted(str(key) for key in request if key not in HEADER_KEYS and key not in ("body", "data"))
    if sent:
        named = ", ".join(f"{name!r:.24}" for name in sent[:3]) + (", ..." if len(sent) > 3 else "")
        raise BadInputError(
            f"the request came as {len(sent)} form field(s) ({named}), not as a body; "
            f"POST the wire payload made by the encoder as the raw request body with Content-Type: {OCTET_STREAM}"
        )
    raise BadInputError("empty request; POST the wire payload made by the encoder as the request body")


STREAMS = ("http", "grpc")
# TorchServe hands a handler a prediction's HTTP headers but not its query parameters, so over HTTP
# the edge's stream, first and answer fields come as these headers (over gRPC: as inputs).
FIELD_HEADERS = {"stream": "x-eden-stream", "first": "x-eden-first", "answer": "x-eden-answer"}
# What :func:`with_headers` adds to a request: not form fields the client sent.
HEADER_KEYS = frozenset({*FIELD_HEADERS, "host"})


def http_headers(headers: dict | None) -> dict[str, str]:
    """A request's own HTTP headers, by their names in lower case, from what TorchServe hands a
    handler as its headers: those (text), and each field's or input's content type under the
    field's name (a dict), which a field named "host" must not pass for a header. A request that
    came over gRPC has none; one over HTTP with a body has at least its length."""
    return {str(key).lower(): value for key, value in (headers or {}).items() if isinstance(value, str)}


def with_headers(request: dict, headers: dict | None) -> dict:
    """``request`` with the fields its HTTP ``headers`` carry (:data:`FIELD_HEADERS`), and ``host``,
    whom the request was addressed to: its HTTP Host header only, never a field of the same name."""
    lowered = http_headers(headers)
    fields = {name: lowered[header] for name, header in FIELD_HEADERS.items() if header in lowered and name not in request}
    return {**request, **fields, "host": lowered.get("host")}


def parse_stream(value: Any) -> str | None:
    """The ``stream`` field: http or grpc, the transport of a streamed answer; absent: a whole answer."""
    if value is None:
        return None
    name = text(value, "stream")
    if name not in STREAMS:
        raise BadInputError(f"stream must be one of {', '.join(STREAMS)}, got {name!r:.40}")
    return name


def parse_index(value: Any, name: str, default: int | None = None) -> int:
    """A frame number or count field: a decimal integer of at most 9 digits."""
    if value is None:
        if default is None:
            raise BadInputError(f"missing form field {name!r}; {SOURCE_HELP}")
        return default
    digits = text(value, name)
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 9:
        raise BadInputError(f"{name} must be a decimal integer of at most 9 digits, got {digits!r:.40}")
    return int(digits)


def parse_first(value: Any) -> int:
    """The ``first`` field: the first pair of the chunk to answer (default 0)."""
    if value is None:
        return 0
    digits = text(value, "first")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 6:
        raise BadInputError(f"first must be a small decimal integer, got {digits!r:.40}")
    return int(digits)

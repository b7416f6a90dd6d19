"""One error hierarchy for the package, and its mapping to HTTP statuses.

Every failure a user can cause is an :class:`EdenError`; the handlers turn it into a 4xx JSON body,
the command line into one line on stderr and exit code 2. Running out of memory is 507; a broken
device (:func:`is_device_failure`) 503; anything else is a bug (HTTP 500, with a message that names
no internals).
"""

from __future__ import annotations

import errno
import json
import re
import socket
import ssl
import sys
from typing import Any, Iterator

# Our error documents are a few hundred bytes; a larger body is no error document and is not parsed.
MAX_DOCUMENT_BYTES = 16 * 1024
_OBJECT_START = re.compile(rb"[ \t\r\n]*\{")
OUT_OF_MEMORY = "out_of_memory"
DEVICE_FAILURE = "device_failure"
# Allocation failures that reach Python as plain RuntimeErrors (cuBLAS, cuDNN, the CUDA runtime, and
# ROCm's hipBLAS and MIOpen in their place) rather than as torch.OutOfMemoryError.
_OOM_MESSAGES = re.compile(r"out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation"
                           r"|HIPBLAS_STATUS_ALLOC_FAILED|miopenStatusAllocFailed")
# CUDA errors that corrupt the context: every later kernel of the process fails too, so the worker
# must be replaced, not asked again. A ROCm build of PyTorch says "HIP error:" where CUDA's says "CUDA error:".
_STICKY_MESSAGES = re.compile(
    r"illegal memory access|illegal instruction|misaligned address|unspecified launch failure|ECC error"
    r"|device-side assert|uncorrectable|launch timed out|hardware stop|(?:CUDA|HIP) error: unknown error"
    r"|hardware stack error|invalid program counter|not supported on global/shared address space"
    r"|no CUDA-capable device is detected|context is destroyed"
)


class EdenError(Exception):
    """Base of every error caused by what the user gave us."""

    status, kind = 400, "bad_request"

    def to_json(self) -> dict:
        return {"code": self.status, "type": self.kind, "message": str(self)}


class BadInputError(EdenError):
    """A request or argument that cannot be used: missing field, not an image, mismatched frames."""

    kind = "bad_input"


class FrameTooLargeError(BadInputError):
    status, kind = 413, "frame_too_large"


class SourceForbiddenError(BadInputError):
    """A server-side source the cloud will not open: its media root is off, or the path leaves the
    root (``..``, an absolute path, a symbolic link pointing out of it)."""

    status, kind = 403, "source_forbidden"


class SourceNotFoundError(BadInputError):
    """A server-side source that is not under the media root: no such file, or a dangling link."""

    status, kind = 404, "source_not_found"


class CheckpointError(EdenError):
    """A checkpoint or weights file that does not fit the model."""

    kind = "bad_checkpoint"


class CodecError(EdenError):
    """A wire payload that cannot be decoded: corrupt, foreign, truncated, or for another model."""

    kind = "bad_payload"


class UnsupportedVersionError(CodecError):
    kind = "unsupported_version"


class PayloadTooLargeError(CodecError):
    """An intact payload for frames over the receiver's pixel limit."""

    status, kind = 413, "payload_too_large"


class ChunkTooLargeError(PayloadTooLargeError):
    """A chunk of more frames, or more tokens in all, than the receiver takes at once; shorter
    chunks of the same frames would do."""

    kind = "chunk_too_large"


class TooMuchWorkError(PayloadTooLargeError):
    """A request whose work (frames decoded, their pixels, packets read) would pass the server's
    documented bounds, judged before the work and counted while it runs, or whose decoding ran
    past its deadline (docs/errors-and-limits.md, "What one request can make a server do")."""

    kind = "too_much_work"


class ModelMismatchError(CodecError):
    """The payload is intact but was made by a model with other dimensions."""

    status, kind = 409, "model_mismatch"


class DigestMismatchError(CodecError):
    """An intact bitstream payload whose packets decode, on this edge, to other pixels than the
    cloud's digests state: another decoder build. The frames codec carries the same chunk."""

    status, kind = 409, "digest_mismatch"


class UnauthenticPayloadError(CodecError):
    """A payload whose keyed tag is missing or wrong, where the receiver holds a wire key: it was
    not made by this edge's cloud (docs/tls.md, "The keyed digest")."""

    status, kind = 403, "unauthentic_payload"


class UnavailableError(EdenError):
    """A server still failing transiently (connection lost, 5xx) after every retry."""

    status, kind = 503, "unavailable"


class UnreachableError(EdenError):
    """A server that cannot be reached in a way that trying again would not change: its
    certificate is refused, its name does not resolve."""

    status, kind = 502, "unreachable"


class UpstreamError(EdenError):
    """An error document produced by an earlier workflow node, passed on with its own status."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status = status
        self.kind = kind


class DeviceUnavailableError(Exception):
    """A worker was assigned a GPU that this process cannot use (a CPU build of PyTorch, an old
    driver, the GPU hidden from it): it refuses to load rather than run on the CPU unnoticed."""


class TransientError(Exception):
    """A failure that may pass if tried again: a lost connection, a 5xx, a restarting worker."""



def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps, however the HTTP library wrapped it (causes, contexts, a
    ``reason`` attribute, exceptions among its arguments), outermost first."""
    seen, queue = set(), [exc]
    while queue:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        inner = (current.__cause__, current.__context__, getattr(current, "reason", None), *current.args)
        queue += [e for e in inner if isinstance(e, BaseException)]


def _failure(exc: BaseException) -> tuple[str, bool]:
    """(reason, whether another try can succeed) of a failed connection."""
    causes = list(_causes(exc))
    for cause in causes:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return (f"certificate verify failed: {cause.verify_message} ({cause.reason}): the server's TLS certificate is not "
                    "trusted; give the CA that signed it (--cacert), and reach the server by a name or address its "
                    "certificate holds"), False
        if isinstance(cause, ssl.SSLError):
            return f"TLS failed: {cause.reason or cause.strerror or cause}", False
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve the host name ({cause.strerror})", cause.errno == socket.EAI_AGAIN
    for cause in causes:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused", True
        if isinstance(cause, TimeoutError):
            return "timed out", True
        if isinstance(cause, OSError) and cause.errno in (errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE):
            return f"connection lost ({cause.strerror})", True
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__} ({text[:300]})", True


def connection_failure(exc: BaseException, url: str) -> TransientError | UnreachableError:
    """What a failed connection to ``url`` means: a :class:`TransientError` (retried) for what can
    pass (refused while a server restarts, a timeout, a lost connection), an
    :class:`UnreachableError` for what cannot (a refused certificate, a name that does not
    resolve), with its reason either way."""
    reason, transient = _failure(exc)
    return TransientError(f"{reason} ({url})") if transient else UnreachableError(f"{url}: {reason}")


class PairError(EdenError):
    """The pair, or the chunk of pairs, that stopped the run, with its cause:
    ``pair 3 (frame 3 → frame 4): ...``, ``pairs 8-15 (frame 8 → frame 16): ...``."""

    def __init__(self, index: int, before, after, cause: BaseException, pairs: int = 1):
        which = f"pair {index}" if pairs == 1 else f"pairs {index}-{index + pairs - 1}"
        super().__init__(f"{which} ({before.name} → {after.name}): {cause}")
        self.index = index
        self.status = getattr(cause, "status", UnavailableError.status)
        self.kind = getattr(cause, "kind", UnavailableError.kind)


class ServerError(UpstreamError):
    """A 4xx answer: the server refused the request, and asking again would not change that."""


def error_from_document(body: Any) -> UpstreamError | None:
    """The error a ``{code, type, message}`` document states (ours, or TorchServe's own), if ``body``
    is one: bytes of JSON or an already parsed object.

    The edge handler and the client look for it in bodies (docs/serving.md, "Workflow caveat"). Wire payloads
    start with ``EDENWIRE`` and PNGs with ``\\x89PNG``, which no JSON text can, so an object with
    exactly these keys is unambiguous. Only a small body that starts as a JSON object is parsed, and
    nothing of a large one is copied.
    """
    if isinstance(body, (bytes, bytearray, memoryview)):
        if len(body) > MAX_DOCUMENT_BYTES or not _OBJECT_START.match(body):
            return None
        try:
            body = json.loads(bytes(body))
        except (ValueError, RecursionError):  # RecursionError: deeply nested arrays or objects
            return None
    if not isinstance(body, dict) or body.keys() != {"code", "type", "message"}:
        return None
    code, kind, message = body["code"], body["type"], body["message"]
    if type(code) is not int or not 400 <= code <= 599 or not isinstance(kind, str) or not isinstance(message, str):
        return None
    if len(kind) + len(message) > MAX_DOCUMENT_BYTES:
        return None
    return UpstreamError(code, kind, message)


# What an encoder's handler answers with, by type (docs/serving.md "Errors"): in a workflow the edge node gets
# it as its request body and passes it on, with its status. A 500 is not passed on.
ENCODER_REFUSALS = {cls.kind: cls.status for cls in (BadInputError, FrameTooLargeError, ChunkTooLargeError, CodecError,
                                                     SourceForbiddenError, SourceNotFoundError, TooMuchWorkError)}
ENCODER_REFUSALS[OUT_OF_MEMORY] = 507


def encoder_refusal(body: Any) -> UpstreamError | None:
    """The encoder's refusal that ``body`` hands on, or None when ``body`` is no error document.

    Anyone can POST a document to the edge, so it answers only with what an encoder can send: any
    other status or type (a 599, a 503 that would make clients retry) is a :class:`CodecError`.
    """
    upstream = error_from_document(body)
    if upstream is None or ENCODER_REFUSALS.get(upstream.kind) == upstream.status:
        return upstream
    raise CodecError(
        f"request body is an error document that no encoder sends (code {upstream.status}, type {upstream.kind!r:.40}); "
        "POST the encoder's wire payload (in the eden workflow: the encoder failed, see its log)"
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure, on the host or on a device, under any of its names."""
    # PyTorch is not imported here: the decoder sandbox's processes, which hold none, use this module too.
    torch = sys.modules.get("torch")
    if isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and _OOM_MESSAGES.search(str(exc)) is not None


def is_device_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a sticky device error (illegal address, ECC, device-side assert): the
    process's CUDA context is lost, and only a new process can use the GPU again."""
    return isinstance(exc, RuntimeError) and not is_out_of_memory(exc) and _STICKY_MESSAGES.search(str(exc)) is not None


def error_response(exc: BaseException) -> tuple[int, dict]:
    """HTTP status and JSON body for any exception; internals never leak into the body."""
    if isinstance(exc, EdenError):
        return exc.status, exc.to_json()
    if is_device_failure(exc):
        message = "the server's GPU failed; this worker is being replaced, retry shortly"
        return 503, {"code": 503, "type": DEVICE_FAILURE, "message": message}
    if is_out_of_memory(exc):
        message = "the server ran out of memory for this request; retry with smaller frames or later"
        return 507, {"code": 507, "type": OUT_OF_MEMORY, "message": message}
    return 500, {"code": 500, "type": "internal_error", "message": f"internal error ({type(exc).__name__}); see the server log"}

"""One error hierarchy for the package, and its mapping to HTTP statuses.

Every failure a user can cause is an :class:`EdenError`; the handlers turn it into a 4xx JSON body,
the command line into one line on stderr and exit code 2. Running out of memory is 507; anything
else is a bug (HTTP 500, with a message that names no internals).
"""

from __future__ import annotations

import torch


class EdenError(Exception):
    """Base of every error caused by what the user gave us."""

    status = 400
    kind = "bad_request"

    def to_json(self) -> dict:
        return {"code": self.status, "type": self.kind, "message": str(self)}


class BadInputError(EdenError):
    """A request or argument that cannot be used: missing field, not an image, mismatched frames."""

    kind = "bad_input"


class FrameTooLargeError(BadInputError):
    status = 413
    kind = "frame_too_large"


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

    status = 413
    kind = "payload_too_large"


class ModelMismatchError(CodecError):
    """The payload is intact but was made by a model with other dimensions."""

    status = 409
    kind = "model_mismatch"


class UnavailableError(EdenError):
    """A server still failing transiently (connection lost, 5xx) after every retry."""

    status = 503
    kind = "unavailable"


class UpstreamError(EdenError):
    """An error document produced by an earlier workflow node, passed on with its own status."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_response(exc: BaseException) -> tuple[int, dict]:
    """HTTP status and JSON body for any exception; internals never leak into the body."""
    if isinstance(exc, EdenError):
        return exc.status, exc.to_json()
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        message = "the server ran out of memory for this request; retry with smaller frames or later"
        return 507, {"code": 507, "type": "out_of_memory", "message": message}
    return 500, {"code": 500, "type": "internal_error", "message": f"internal error ({type(exc).__name__}); see the server log"}

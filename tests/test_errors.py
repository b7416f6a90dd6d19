"""The one mapping from errors to HTTP statuses and JSON bodies."""

import pytest
import torch

from eden_serve.errors import (
    BadInputError,
    CheckpointError,
    CodecError,
    FrameTooLargeError,
    ModelMismatchError,
    PayloadTooLargeError,
    SourceForbiddenError,
    SourceNotFoundError,
    TooMuchWorkError,
    UnavailableError,
    UnsupportedVersionError,
    UpstreamError,
    encoder_refusal,
    error_response,
)


@pytest.mark.parametrize(
    "exc, status, kind",
    [
        (BadInputError("missing frame0"), 400, "bad_input"),
        (FrameTooLargeError("too big"), 413, "frame_too_large"),
        (CheckpointError("bad"), 400, "bad_checkpoint"),
        (CodecError("corrupt"), 400, "bad_payload"),
        (UnsupportedVersionError("v2"), 400, "unsupported_version"),
        (PayloadTooLargeError("many tokens"), 413, "payload_too_large"),
        (ModelMismatchError("other dims"), 409, "model_mismatch"),
        (UnavailableError("gave up"), 503, "unavailable"),
        (UpstreamError(413, "frame_too_large", "from the encoder"), 413, "frame_too_large"),
        (MemoryError(), 507, "out_of_memory"),
        (torch.OutOfMemoryError("CUDA out of memory"), 507, "out_of_memory"),
        # Allocation failures that other libraries raise as plain errors.
        (torch.AcceleratorError("CUDA error: out of memory"), 507, "out_of_memory"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), 507, "out_of_memory"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), 507, "out_of_memory"),
        # Sticky device errors: the worker must be replaced.
        (torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), 503, "device_failure"),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), 503, "device_failure"),
        (RuntimeError("CUDA error: device-side assert triggered"), 503, "device_failure"),
        (RuntimeError("CUDA error: unspecified launch failure"), 503, "device_failure"),
        # The CUDA runtime's other sticky errors, in its own words.
        (torch.AcceleratorError("CUDA error: hardware stack error"), 503, "device_failure"),
        (torch.AcceleratorError("CUDA error: invalid program counter"), 503, "device_failure"),
        (RuntimeError("CUDA error: operation not supported on global/shared address space"), 503, "device_failure"),
        (RuntimeError("CUDA error: no CUDA-capable device is detected"), 503, "device_failure"),
        (RuntimeError("CUDA error: context is destroyed"), 503, "device_failure"),
        # ROCm's builds: the same failures under HIP's names.
        (RuntimeError("HIP error: unknown error"), 503, "device_failure"),
        (RuntimeError("HIP error: an illegal memory access was encountered"), 503, "device_failure"),
        (RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB"), 507, "out_of_memory"),
        (RuntimeError("CUDA error: HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`"), 507, "out_of_memory"),
        (RuntimeError("miopenStatusAllocFailed"), 507, "out_of_memory"),
        (RuntimeError("shape mismatch"), 500, "internal_error"),
    ],
)
def test_statuses(exc, status, kind):
    code, body = error_response(exc)
    assert code == status and body["code"] == status and body["type"] == kind
    assert set(body) == {"code", "type", "message"} and body["message"]


def test_codec_errors_are_one_type():
    for cls in (UnsupportedVersionError, PayloadTooLargeError, ModelMismatchError):
        assert issubclass(cls, CodecError)


def test_unexpected_errors_leak_nothing():
    code, body = error_response(KeyError("/secret/path/weights.safetensors"))
    assert code == 500 and body["type"] == "internal_error"
    assert "secret" not in body["message"] and "Traceback" not in body["message"]


@pytest.mark.parametrize("exc", [BadInputError("no frame1"), FrameTooLargeError("60000x60000"), CodecError("unknown codec"),
                                 SourceForbiddenError("leaves the root"), SourceNotFoundError("no such file"),
                                 TooMuchWorkError("122 frames to decode")])
def test_the_edge_hands_on_every_refusal_an_encoder_sends(exc):
    """In a workflow the edge node gets the encoder's error document as its body and answers it
    with the encoder's status: a server-side source's refusals too (they were 400 bad_payload)."""
    upstream = encoder_refusal(error_response(exc)[1])
    assert (upstream.status, upstream.kind, str(upstream)) == (exc.status, exc.kind, str(exc))


@pytest.mark.parametrize("document", [{"code": 599, "type": "bad_input", "message": "m"}, {"code": 503, "type": "unavailable", "message": "m"},
                                      {"code": 404, "type": "bad_input", "message": "m"}])
def test_the_edge_refuses_error_documents_no_encoder_sends(document):
    with pytest.raises(CodecError, match="no encoder sends"):
        encoder_refusal(document)

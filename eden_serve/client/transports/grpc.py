"""The client's gRPC transport: TorchServe's inference API over gRPC, one channel per server.

The encoder is called with ``Predictions``; the edge with the server-streaming
``StreamPredictions``, so each middle comes as soon as the edge has it. TorchServe's gRPC answers a
handler's refusal with status OK and the handler's JSON error document as the body (it passes on
the body and drops the HTTP status), so refusals are read from the body, as the HTTP transport
does; gRPC's own statuses say what TorchServe itself refused (a bad token: PERMISSION_DENIED). URLs
are ``grpc://HOST:PORT``, or ``grpcs://HOST:PORT`` for TLS (the system's roots, or ``--cacert``). The messages
are generated at setup from TorchServe's own inference.proto (:mod:`.protos`).
"""

from __future__ import annotations

import os
import re
import time
from typing import Callable

from PIL import Image

from ...errors import BadInputError, ServerError, TransientError
from ...wire.answers import StreamedAnswer
from ..tls import ClientTLS
from .base import DECODER, ENCODER, Transport, check_document, cuttable

SERVICE = "/org.pytorch.serve.grpc.inference.InferenceAPIsService"
URL = re.compile(r"(grpcs?)://([^/]+?)/?", re.IGNORECASE)  # a scheme in any case, as URLs' are (RFC 3986)
MAX_MESSAGE_BYTES = 512 << 20  # above TorchServe's largest answer (its max_response_size, config.properties)
# What a retry may cure, as a 5xx or a dropped connection over HTTP is retried: a server restarting
# or overloaded (UNAVAILABLE, RESOURCE_EXHAUSTED as its queue's 503), a worker that failed (INTERNAL),
# a link that broke (UNKNOWN, CANCELLED by a reset) or stalled (DEADLINE_EXCEEDED).
TRANSIENT = {"UNAVAILABLE", "RESOURCE_EXHAUSTED", "INTERNAL", "UNKNOWN", "DEADLINE_EXCEEDED", "CANCELLED", "ABORTED"}
HTTP_STATUS = {"PERMISSION_DENIED": 403, "UNAUTHENTICATED": 401, "NOT_FOUND": 404, "INVALID_ARGUMENT": 400,
               "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 416, "UNIMPLEMENTED": 501}


def _modules():
    """grpc and the generated messages, or a clear error saying how to get them."""
    # gRPC's core wrote its own lines to stderr (a failed TLS handshake at INFO) beside the
    # command's one line; a verbosity the user set is kept.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        import grpc
    except ImportError:
        raise BadInputError("--transport grpc needs the grpc extra: pip install 'eden-serve[grpc]'") from None
    try:
        from .generated import inference_pb2
    except ImportError:
        raise BadInputError("--transport grpc needs its generated messages: "
                            "python -m eden_serve.client.transports.protos (setup.sh runs it)") from None
    return grpc, inference_pb2


def target(url: str, option: str) -> tuple[str, bool]:
    """HOST:PORT and whether to use TLS, from ``grpc://HOST:PORT`` or ``grpcs://HOST:PORT``."""
    match = URL.fullmatch(url) if isinstance(url, str) else None
    if match is None:
        raise BadInputError(f"{option} must be a grpc:// or grpcs:// URL with the server's gRPC inference port, got {url!r}")
    return match.group(2), match.group(1).lower() == "grpcs"


def credentials(grpc, tls: ClientTLS):
    """TLS credentials that trust ``tls``'s CA (else the system's roots)."""
    if tls.cacert is None:
        return grpc.ssl_channel_credentials()
    tls.ssl_context()  # a missing or bad file is one line here, not a channel that never connects
    return grpc.ssl_channel_credentials(root_certificates=tls.cacert.read_bytes())


class GrpcTransport(Transport):
    """TorchServe's gRPC inference API at ``cloud`` and ``edge``; TorchServe has no gRPC workflow
    API, so ``server`` names a server with both models. ``timeout``: seconds a call may take."""

    name = "grpc"
    schemes = ("grpc", "grpcs")
    secure = ("grpcs",)
    workflow_api = False

    def __init__(self, server: str | None, cloud: str | None, edge: str | None, tokens: dict[str, str | None], timeout: float,
                 tls: ClientTLS):
        self.grpc, self.messages = _modules()
        self.timeout = timeout
        self.models = {"encoder": ENCODER, "decoder": DECODER}
        self.reach({"encoder": cloud, "decoder": edge} if server is None else {"encoder": server, "decoder": server}, tokens)
        self.where = self.urls
        self.metadata = {step: (("authorization", value),) if value else () for step, value in self.authorization.items()}
        self.channels, self.calls = {}, {}
        for step, url in self.urls.items():
            address, secure = target(url, step)
            if (address, secure) not in self.channels:
                options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                           ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
                self.channels[address, secure] = (self.grpc.secure_channel(address, credentials(self.grpc, tls), options)
                                                  if secure else self.grpc.insecure_channel(address, options))
            channel = self.channels[address, secure]
            kind = channel.unary_stream if step == "decoder" else channel.unary_unary
            method = "StreamPredictions" if step == "decoder" else "Predictions"
            self.calls[step] = kind(f"{SERVICE}/{method}", request_serializer=self.messages.PredictionsRequest.SerializeToString,
                                    response_deserializer=self.messages.PredictionResponse.FromString)

    def _request(self, step: str, inputs: dict[str, bytes]):
        return self.messages.PredictionsRequest(model_name=self.models[step], input=inputs)

    def _failure(self, exc, step: str) -> Exception:
        code = exc.code().name if callable(getattr(exc, "code", None)) else "UNKNOWN"
        detail = " ".join(str(exc.details() if callable(getattr(exc, "details", None)) else exc).split())[:200]
        message = f"gRPC {code}: {detail} ({self.where[step]})"
        if code in TRANSIENT:
            return TransientError(message)
        return ServerError(HTTP_STATUS.get(code, 400), code.lower(), message)

    def ask_cloud(self, frames: list[bytes], form: dict[str, str], first_byte: Callable[[float], None] | None = None,
                  turn=None) -> tuple[bytes, int]:
        """``first_byte`` gets the time the answer arrived (whole: a unary call has no earlier
        moment to report). ``turn`` is not taken: a unary call's answer crosses as soon as the cloud
        has it, and taking the link's turn for the whole call would keep the cloud idle while a
        payload crosses."""
        inputs = {f"frame{i}": data for i, data in enumerate(frames)}
        inputs.update((key, value.encode()) for key, value in form.items())
        request = self._request("encoder", inputs)
        try:
            future = self.calls["encoder"].future(request, metadata=self.metadata["encoder"], timeout=self.timeout)
            with cuttable(future.cancel):  # its caller gets CANCELLED: a server that does not answer is not waited for
                answer = future.result()
        except self.grpc.RpcError as exc:
            raise self._failure(exc, "encoder") from None
        except self.grpc.FutureCancelledError:
            raise TransientError(f"gRPC CANCELLED: the run stopped ({self.where['encoder']})") from None
        if first_byte is not None:
            first_byte(time.perf_counter())
        check_document(answer.prediction, self.where["encoder"])
        return answer.prediction, request.ByteSize()

    def ask_edge(self, payload: bytes, first: int, pairs: int, size: tuple[int, int],
                 deliver: Callable[[int, Image.Image], None]) -> int:
        """The middles stream in ``StreamPredictions`` messages."""
        request = self._request("decoder", {"body": payload, "stream": b"grpc", "first": str(first).encode()})
        answer = StreamedAnswer(first, pairs, size, f"(from {self.where['decoder']})")
        received = 0
        try:
            call = self.calls["decoder"](request, metadata=self.metadata["decoder"], timeout=self.timeout)
            with cuttable(call.cancel):
                for message in call:
                    received += len(message.prediction)
                    if answer.next == first and not answer.buffer:  # a refusal comes whole, before any record
                        check_document(message.prediction, self.where["decoder"])
                    for j, image in answer.feed(message.prediction):
                        deliver(j, image)
        except self.grpc.RpcError as exc:
            raise self._failure(exc, "decoder") from None
        if not answer.finish():
            raise TransientError(f"the stream ended after {answer.next - first} of {pairs - first} middles ({self.where['decoder']})")
        return received

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

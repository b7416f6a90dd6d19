"""The TorchServe handler of both halves; ``handlers/*.py`` subclass it, naming their service.

TorchServe loads the one class defined in a handler file, so each file holds a three-line subclass
and the logic lives here and in :mod:`.services`. This is the only module that imports TorchServe.
"""

from __future__ import annotations

from ts.handler_utils.utils import send_intermediate_predict_response
from ts.torch_handler.base_handler import BaseHandler

from .services import Service


class EdenHandler(BaseHandler):
    service_class: type[Service]

    def initialize(self, context):
        self.service = self.service_class.load(context)
        self.service.send_part = self.send_part
        self.initialized = True

    def send_part(self, idx: int, body: bytes, content_type: str) -> None:
        """A part of request ``idx``'s answer, now: an HTTP chunk, or a gRPC stream's message."""
        context = self.service.context
        context.set_response_status(200, "OK", idx)
        context.set_response_content_type(idx, content_type)
        send_intermediate_predict_response({idx: body}, {idx: context.request_ids[idx]}, "Intermediate", 200, context)

    def preprocess(self, data):
        return self.service.preprocess(data)

    def inference(self, data, *args, **kwargs):
        return self.service.inference(data)

    def postprocess(self, data):
        return self.service.postprocess(data)

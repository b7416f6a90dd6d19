"""TorchServe handler of the cloud half: two frames (multipart form) -> EDEN wire payload.

Thin on purpose: request parsing, errors, device and thread choice and metrics live in
eden_serve.serving, which the archive carries alongside this file.
"""

from ts.torch_handler.base_handler import BaseHandler

from eden_serve import serving


class EdenEncoderHandler(BaseHandler):
    def initialize(self, context):
        self.service = serving.EncoderService.load(context)
        self.initialized = True

    def preprocess(self, data):
        return serving.each(self.service.parse, data)

    def inference(self, data, *args, **kwargs):
        return serving.each(self.service.run, data)

    def postprocess(self, data):
        return serving.respond(self.context, data)

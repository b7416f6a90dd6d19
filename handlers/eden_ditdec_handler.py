"""TorchServe handler of the edge half: EDEN wire payload (request body) -> middle frame PNG.

Thin on purpose: payload checks, errors (including an upstream workflow node's error document),
device and thread choice and metrics live in eden_serve.serving, which the archive carries.
"""

from ts.torch_handler.base_handler import BaseHandler

from eden_serve import serving


class EdenDitDecHandler(BaseHandler):
    def initialize(self, context):
        self.service = serving.EdgeService.load(context)
        self.initialized = True

    def preprocess(self, data):
        return serving.each(self.service.parse, data)

    def inference(self, data, *args, **kwargs):
        return serving.each(self.service.run, data)

    def postprocess(self, data):
        return serving.respond(self.context, data)

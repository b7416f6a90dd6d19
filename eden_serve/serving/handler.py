"""The TorchServe handler of both halves; ``handlers/*.py`` subclass it, naming their service.

TorchServe loads the one class defined in a handler file, so each file holds a three-line subclass
and the logic lives here and in :mod:`.services`. This is the only module that imports TorchServe.
"""

from __future__ import annotations

from ts.torch_handler.base_handler import BaseHandler

from .services import Service


class EdenHandler(BaseHandler):
    service_class: type[Service]

    def initialize(self, context):
        self.service = self.service_class.load(context)
        self.initialized = True

    def preprocess(self, data):
        return self.service.preprocess(data)

    def inference(self, data, *args, **kwargs):
        return self.service.inference(data)

    def postprocess(self, data):
        return self.service.postprocess(data)

"""TorchServe handler of eden_ditdec.mar, the edge half: wire payload (request body) -> middle frame PNG."""

from eden_serve.serving.handler import EdenHandler
from eden_serve.serving.services import EdgeService


class EdenDitDecHandler(EdenHandler):
    service_class = EdgeService

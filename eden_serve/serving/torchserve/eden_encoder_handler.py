"""TorchServe handler of eden_encoder.mar, the cloud half: two frames (multipart form) -> wire payload."""

from eden_serve.serving.handler import EdenHandler
from eden_serve.serving.cloud_service import CloudService


class EdenEncoderHandler(EdenHandler):
    service_class = CloudService

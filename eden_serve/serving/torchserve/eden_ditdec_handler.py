"""TorchServe handler of eden_ditdec.mar, the edge half: wire payload (request body) -> middle frame PNG."""

import os
import sys

# This archive's own package first: TorchServe puts the model's directory after the PYTHONPATH it
# was started with, where another eden_serve would be the one imported (docs/serving.md, "Building the archives").
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from eden_serve.serving.handler import EdenHandler  # noqa: E402
from eden_serve.serving.services import EdgeService  # noqa: E402


class EdenDitDecHandler(EdenHandler):
    service_class = EdgeService

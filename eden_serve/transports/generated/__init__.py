"""Made by python -m eden_serve.transports.protos; not in git."""

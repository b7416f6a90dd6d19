"""EDEN video frame interpolation, split into a cloud encoder and an edge DiT+decoder, served on
TorchServe. The folders are the rooms of the system, bottom-up (docs/development.md, "Layout"):
``wire/`` (what crosses between them), ``media/`` (frames and video in and out), ``model/`` (the
model and its weights), ``cloud/`` and ``edge/`` (the two halves), ``clips/`` (the clip engine and
the in-process pipeline), ``client/`` and ``serving/`` (the client and the TorchServe glue),
``commands/`` and ``page/`` (the front ends); ``config.py`` and ``errors.py`` below them all."""

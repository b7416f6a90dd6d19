"""How a failed request becomes its answer, request by request within a batch: a
:class:`Refusal` (status and JSON document) in its place, the others going on."""

from __future__ import annotations

import logging
import traceback
from typing import Any, Callable, NamedTuple

import torch

from ..errors import EdenError, error_response, is_device_failure

logger = logging.getLogger(__name__)
# The line a worker logs as its device fails (gpu_torchserve.py counts it in TorchServe's logs).
LEAVING = "the device failed; this worker exits once it has answered, so that TorchServe replaces it"
# Sticky device failures, kept for the rest of this (ending) process: see :func:`refusal`.
_KEPT: list[BaseException] = []


class Refusal(NamedTuple):
    """A failed request, reduced to its answer. Not the exception: its traceback holds the frames
    that held the request's body and what was made of it, and the batch's results list holding the
    exception would keep them all alive, in a cycle, until the garbage collector runs."""

    status: int
    document: dict
    device_failure: bool = False  # this process's device broke (not a document passed on saying so)


def refusal(exc: BaseException) -> Refusal:
    """The answer to a failed request; unexpected failures are logged with their traceback."""
    if isinstance(exc, EdenError):
        logger.info("request refused: %d %s: %s", exc.status, exc.kind, exc)
    else:
        # As text: a record holding the exception would keep its frames' tensors alive in any
        # handler that buffers records.
        logger.error("request failed\n%s", "".join(traceback.format_exception(exc)).rstrip())
    if not is_device_failure(exc):
        return Refusal(*error_response(exc))
    # Said now, not as the worker leaves: on a GPU the process may not live that long. After a
    # sticky error, freeing a tensor that a side stream used records a CUDA event, which fails
    # inside the tensor's deleter, where C++ can only terminate (an H200 ended a worker so, as the
    # traceback's frames were let go). So the failure, and with it every tensor its frames hold, is
    # kept until the process exits.
    logger.critical(LEAVING)
    _KEPT.append(exc)
    return Refusal(*error_response(exc), True)


def release_cached_memory() -> None:
    """Return the CUDA allocator's cached blocks after an out-of-memory error (a no-op where CUDA
    was never used). Called once the failed work's traceback, and the tensors its frames hold,
    are gone: while they live their blocks cannot be released."""
    torch.cuda.empty_cache()


def request_by_request(step: Callable[[int, Any], Any], items: list) -> list:
    """``step(idx, item)`` for every item of a batch, each failure kept in its place as a
    :class:`Refusal`. An item refused by an earlier step is passed on untouched."""
    results = []
    for idx, item in enumerate(items):
        if isinstance(item, Refusal):
            results.append(item)
            continue
        try:
            results.append(step(idx, item))
        except Exception as exc:  # one request's failure must not fail the batch
            results.append(refusal(exc))
    return results

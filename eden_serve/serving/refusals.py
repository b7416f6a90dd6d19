"""How a failed request becomes its answer, request by request within a batch: a
:class:`Refusal` (status and JSON document) in its place, the others going on."""

from __future__ import annotations

import logging
import traceback
from typing import Any, Callable, NamedTuple

import torch

from ..errors import EdenError, error_response, is_device_failure

logger = logging.getLogger(__name__)


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
    return Refusal(*error_response(exc), is_device_failure(exc))


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

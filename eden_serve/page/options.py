"""What a page asks of a run, read as the command line reads it: the page's fields become the
options of ``eden-serve interpolate`` / ``eden-serve client`` (``--factor``, ``--fps``, the video
encoder, ``--seed``, ``--scene-threshold``, ``--wire-codec``), parsed by the same parser code and
checked by the same :func:`~eden_serve.clips.arguments.clip_options`, before the run is queued."""

from __future__ import annotations

import argparse
from fractions import Fraction

from ..clips.arguments import add_clip_arguments, clip_options
from ..cloud.scene_cuts import SCENE_THRESHOLD
from ..commands.shared import threshold, threshold_text
from ..errors import BadInputError
from .media import OUTPUT_EXTENSIONS

# The fields a page may set, by their command-line names.
FIELDS = ("factor", "fps", "time-error", "vcodec", "crf", "preset", "pix-fmt", "seed", "scene-threshold", "wire-codec",
          "process-size")
MAX_FIELD = 100  # characters of a field's value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise BadInputError(message)


def run_arguments(page: argparse.Namespace, fields: dict, servers: bool) -> argparse.Namespace:
    """The page's own options (``page``: its command line) with a run's ``fields`` over them, as
    the command that computes the run takes them; raises :class:`BadInputError` as it would."""
    parser = _Parser(prog="eden-serve", add_help=False, exit_on_error=False)
    add_clip_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scene-threshold", type=threshold_text if servers else threshold,
                        default=None if servers else SCENE_THRESHOLD)
    parser.add_argument("--wire-codec", dest="codec", default=page.codec)
    argv = []
    for name, value in fields.items():
        if name not in FIELDS:
            raise BadInputError(f"unknown option {str(name)[:40]!r}; a page sets {', '.join(FIELDS)}")
        if not isinstance(value, (str, int, float)) or len(str(value)) > MAX_FIELD:
            raise BadInputError(f"--{name} takes a value of at most {MAX_FIELD} characters")
        if str(value).strip():
            argv.append(f"--{name}={str(value).strip()}")
    try:
        parsed = parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        raise BadInputError(str(exc)) from None
    args = argparse.Namespace(**{**vars(page), **vars(parsed), "resume": False, "progress": False})
    clip_options(args)  # refused now, before the run waits its turn
    return args


def output_extension(kind: str, own: str, asked: str | None) -> str:
    """The result's extension: a video's in the container ``asked`` (else its own), an
    animation's its own format (the output is of the input's kind)."""
    if kind != "video" or not asked:
        return own or ".mkv"
    if asked not in OUTPUT_EXTENSIONS:
        raise BadInputError(f"container {str(asked)[:20]!r}: a page writes {', '.join(OUTPUT_EXTENSIONS)}")
    return asked


def expected_pairs(args: argparse.Namespace, frames: int | None) -> int | None:
    """Middles a run computes where that is known before it starts: F - 1 per pair for a factor
    F of 2, 4 or 8 (a retimed run computes only what its frames show: not known ahead)."""
    options = clip_options(args)
    factor = Fraction(options["factor"])
    if frames is None or options["fps"] is not None or factor not in (2, 4, 8):
        return None
    return int(factor - 1) * (frames - 1)

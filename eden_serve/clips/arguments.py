"""The command line's clip options: frame rate, encoder, processing size and headerless input
(docs/video.md), parsed into what :func:`eden_serve.clips.streaming.interpolate_clip` takes."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..errors import BadInputError
from ..media import PIPE, Encoding, RawVideo, Retiming
from ..media.encoding import parse_option
from ..media.sequence import DEFAULT_RATE, check_rate
from ..media.timing import DEFAULT_TIME_ERROR, parse_fraction, parse_rate


def parse_size(text: str) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW such as 480x854, got {text!r}") from None
    if height < 1 or width < 1:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return height, width


def parse_shape(text: str) -> tuple[int, ...]:
    """HxW, or HxWxPAIRS: a frame size and the pairs of a forward."""
    parts = text.lower().split("x")
    try:
        values = tuple(int(v) for v in parts)
    except ValueError:
        values = ()
    if len(values) not in (2, 3) or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected HxW or HxWxPAIRS such as 480x854x16, got {text!r}")
    return values


def add_clip_arguments(parser: argparse.ArgumentParser) -> None:
    """A clip's output: its frame rate, encoder and processing size (docs/video.md)."""
    parser.add_argument("--factor", default="2",
                        help="frame rate multiplier of a clip: 2, 4, 8 (every middle), or any N or N/D such as 3 or 5/2 "
                             "(the nearest middles within --time-error) (default 2)")
    parser.add_argument("--fps", help="output frames a second of a video, N, N/D or a decimal: 60, 24000/1001, 25.5; "
                                      "23.976, 29.97, 59.94 and 119.88 are NTSC's 24000/1001... (docs/video.md)")
    parser.add_argument("--time-error", default=str(DEFAULT_TIME_ERROR),
                        help=f"with --fps or a factor not a power of two: how far a frame may be from its time, in output "
                             f"frames, up to 1/2 (default {DEFAULT_TIME_ERROR})")
    parser.add_argument("--resume", action="store_true",
                        help="if the run stops, keep its partial output and journal; continue one left by the same command")
    parser.add_argument("--process-size", type=parse_size, metavar="HxW",
                        help="interpolate at this size and scale the middles back (Lanczos down, bicubic up)")
    raw = parser.add_argument_group("input without a frame rate or header (a directory of images written as a video; raw video "
                                    "on - or in a file; else the container says)")
    raw.add_argument("--input-fps", metavar="RATE",
                     help="frames a second of a directory of images written as a video (-o out.mp4), as ffmpeg's -framerate, "
                          "or of raw video: N, N/D or a decimal, read as --fps is (default 25)")
    raw.add_argument("--input-size", type=parse_size, metavar="HxW", help="the input is raw video of frames this size")
    raw.add_argument("--input-pix-fmt", default="yuv420p", help="its pixel format (default yuv420p)")
    video = parser.add_argument_group("video encoder (default: the input's codec; docs/video.md)")
    video.add_argument("--vcodec", help="encoder or codec: libx264, libx265, libsvtav1, libvpx-vp9, ffv1, av1...")
    video.add_argument("--crf", help="constant quality (x264 18, x265 20, AV1 30, VP9 31 by default)")
    video.add_argument("--preset", help="speed preset (x264/x265: medium...; svt-av1: 0-13; aom/vpx: cpu-used)")
    video.add_argument("--pix-fmt", help="pixel format, 8-bit or deeper: yuv420p10le, yuv444p12le, p010le... (default: the "
                                         "input's where the encoder takes it, else yuv420p10le for a deeper input, else yuv420p)")
    video.add_argument("--encoder-opt", action="append", default=[], metavar="KEY=VALUE",
                       help="an encoder option passed as it is (repeatable)")
    video.add_argument("-v", "--verbose", action="store_true",
                       help="the encoder's own log on stderr (x265's and SVT-AV1's banners and statistics), else its errors "
                            "only; and the encoder's share of the run and of a chunk")
    video.add_argument("--encoder-instances", type=int, metavar="N",
                       help="x264 instances, each on a segment of the video starting with a key frame, joined into one "
                            "stream, sharing the host's cores (default 1: one x264 with all the cores was faster)")


def clip_options(args) -> dict:
    """The clip options of ``args`` as :func:`eden_serve.clips.streaming.interpolate_clip` takes them."""
    if args.encoder_instances is not None and args.encoder_instances < 1:
        raise BadInputError(f"--encoder-instances must be at least 1, got {args.encoder_instances}")
    encoding = Encoding(args.vcodec, args.crf, args.preset, args.pix_fmt,
                        tuple(parse_option(text) for text in args.encoder_opt), verbose=args.verbose, instances=args.encoder_instances)
    factor = parse_fraction(args.factor, "--factor")
    fps = parse_rate(args.fps) if args.fps is not None else None
    time_error = parse_fraction(args.time_error, "--time-error")
    Retiming(factor, fps, time_error)  # refused here, before any model loads
    input_fps = parse_rate(args.input_fps, "--input-fps") if args.input_fps is not None else None
    if input_fps is not None:
        check_rate(input_fps)  # refused here, before any model loads
    return {"factor": int(factor) if factor.denominator == 1 else factor,
            "fps": fps, "time_error": time_error,
            "encoding": encoding, "process_size": args.process_size,
            # Raw video's rate defaults to 25 without a word, as FFmpeg's rawvideo demuxer's; a directory's is said.
            "raw": RawVideo(args.input_size, args.input_pix_fmt, input_fps or DEFAULT_RATE) if args.input_size else None,
            "input_fps": None if args.input_size else input_fps}


def refuse_clip_options(args) -> None:
    options = clip_options(args)
    if (options["factor"] != 2 or args.resume or options["fps"] is not None or options["encoding"].given
            or args.process_size is not None or options["raw"] is not None or options["input_fps"] is not None):
        raise BadInputError("--factor, --fps, --input-fps, --resume, --process-size and the video encoder options apply to a clip; "
                            "two frames give their middle frame")


def _for_shell(path) -> str:
    """``path`` as a shell reads it back whatever it holds (spaces, quotes, a newline), and never as
    an option (a leading dash), so that the command printed can be pasted."""
    return shlex.quote(f"./{path}" if str(path).startswith("-") else str(path))


def report(summary, output: str, verbose: bool = False) -> None:
    """The summary on stdout (stderr when stdout carries the video), with ``verbose`` the encoder's
    share, and for a directory of frames the ffmpeg command that makes a video of it."""
    out = sys.stderr if output == PIPE else sys.stdout
    print(summary, file=out)
    if verbose and summary.encoder_line():
        print(summary.encoder_line(), file=out)
    if output != PIPE and Path(output).is_dir():
        frames, video = _for_shell(Path(output) / "%06d.png"), _for_shell(f"{Path(output).name}.mp4")
        print(f"make a video of it: ffmpeg -framerate RATE -i {frames} -c:v libx264 -crf 18 "
              f"-pix_fmt yuv420p {video}  (RATE: the output's frames a second, the input's times the factor)")

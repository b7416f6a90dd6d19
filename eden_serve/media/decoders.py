"""Which decoder reads a clip: the host's (FFmpeg on the CPU), or the GPU's (NVDEC through PyAV's
hardware acceleration), chosen by measuring each on the clip's first frames, not by name (docs/video.md,
"Decoding on the GPU").

- ``host``: FFmpeg's software decoder, its frames converted to RGB by swscale on the host (what a
  clip always had).
- ``nvdec``: NVDEC decodes, PyAV copies each frame to the host (NV12, P010 deeper), and swscale
  converts it there, through the planar format the host's decoder gives (swscale's NV12 path
  interpolates the chroma, its planar one does not): the decoding leaves the host's cores, the
  conversion and the copy stay.
- ``nvdec-device``: NVDEC decodes into the GPU's memory and the frame stays there: its planes are
  read through DLPack and converted to RGB on the device (:func:`~.planes.nv12_to_rgb`, by the
  frame's own matrix, any the host's conversion takes, within 3 levels of swscale's), so the cloud
  takes them without a copy; only the originals the writer re-encodes are copied to the host, as
  NV12 (their pictures unchanged: no RGB round trip). 8-bit video only: a deeper one's trial fails,
  and another decoder reads it.

torchcodec's CUDA decoder is not among them: it gives RGB alone, so the writer would re-encode the
originals from RGB, which changes them.

:func:`choose` decodes the first frames with each candidate that opens, on its own container,
times them (the device synchronised), refuses one whose frames or times differ from the host's,
and keeps the fastest. A stream on which the host's decoder won here before goes to it untried
(:mod:`.decoder_memory`). Beside a CPU edge there is nothing to choose: the host decodes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from .containers import main_video
from .decoder_memory import Memory
from .planes import YUV_MATRICES, nv12_to_rgb

logger = logging.getLogger(__name__)

DECODERS = ("auto", "host", "nvdec", "nvdec-device")  # auto: measured beside a GPU, the host's beside a CPU
TRIAL_FRAMES = 12  # decoded by each candidate before the run (its time counts in the start-up): half a second of video


class Decoder:
    """The host's decoder: what a candidate is asked (the base) and how the host answers."""

    name = "host"
    # The context under which a wait for the whole device runs: the clip engine hands over the edge's
    # (edge/streams.CaptureGate.shared), so that it never meets a graph's capture.
    waiting: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def open(self, path: Path):
        import av

        return av.open(str(path))

    def pixels(self, frame, rgb: Callable) -> torch.Tensor:
        """The frame's RGB pixels as the model takes them (``rgb``: the host's conversion)."""
        return rgb(frame)

    def raw(self, frame):
        """The frame the writer re-encodes for an original."""
        return frame

    def sync(self) -> None:
        """Wait for the work the frames so far queued on a device."""


class Nvdec(Decoder):
    """NVDEC through PyAV's hardware acceleration; ``on_device``: its frames stay in the GPU's memory."""

    def __init__(self, on_device: bool, device: int = 0):
        self.on_device, self.device = on_device, device
        self.name = "nvdec-device" if on_device else "nvdec"

    def open(self, path: Path):
        import av

        accel = av.codec.hwaccel.HWAccel("cuda", device=str(self.device), allow_software_fallback=False, is_hw_owned=self.on_device)
        return av.open(str(path), hwaccel=accel)

    def pixels(self, frame, rgb: Callable) -> torch.Tensor:
        if not self.on_device:
            return rgb(planar(frame))
        if frame.sw_format is None or frame.sw_format.name != "nv12":
            raise ValueError(f"frames of {frame.sw_format and frame.sw_format.name} are not converted on the device (8-bit NV12 only)")
        matrix = YUV_MATRICES.get(int(frame.colorspace))
        if matrix is None:  # as the host refuses it (video.check_convertible): no guess at another matrix
            raise ValueError(f"frames of matrix {int(frame.colorspace)} are not converted on the device")
        luma, chroma = (torch.from_dlpack(plane) for plane in frame.planes[:2])  # [H, W] and [H/2, W] (U, V interleaved)
        return nv12_to_rgb(luma[: frame.height, : frame.width], chroma[: frame.height // 2, : frame.width], matrix,
                           int(frame.color_range) == 2)

    def raw(self, frame):
        if not self.on_device:
            return frame
        import av

        planes = [torch.from_dlpack(plane)[:, : frame.width].cpu() for plane in frame.planes[:2]]
        host = av.VideoFrame.from_ndarray(torch.cat(planes).numpy(), format="nv12")
        host.pts, host.time_base, host.duration = frame.pts, frame.time_base, frame.duration
        host.colorspace, host.color_range = frame.colorspace, frame.color_range
        return host

    def sync(self) -> None:
        if self.on_device and torch.cuda.is_available():
            with self.waiting():  # a wait for the whole device fails while a graph is captured
                torch.cuda.synchronize(self.device)


PLANAR = {"nv12": "yuv420p", "p010le": "yuv420p10le"}  # a hardware decoder's formats, as the host's decoder gives them


def host_pix_fmt(context) -> str | None:
    """The pixel format of the frames a stream's decoder (``context``, PyAV's) gives the host: its
    own, or for a hardware decoder, whose context names its surfaces (``cuda``, a format of no
    components), what those surfaces hold, as the host's decoder would give it. None where not
    known yet."""
    import av

    name = context.pix_fmt
    if name is None or av.VideoFormat(name).components:
        return name
    held = getattr(context, "sw_format", None)
    return None if held is None else PLANAR.get(held.name, held.name)


def planar(frame):
    """A frame of a hardware decoder's interleaved format in the planar one of the host's decoder: the
    same samples (a lossless copy), so that swscale converts it to RGB as it converts the host's."""
    name = PLANAR.get(frame.format.name)
    if name is None:
        return frame
    converted = frame.reformat(format=name)
    converted.colorspace, converted.color_range = frame.colorspace, frame.color_range
    return converted


def candidates(device: torch.device) -> list[Decoder]:
    """The decoders to try beside an edge on ``device``: the host's, and NVDEC's two ways on a GPU
    whose PyAV has CUDA among its hardware devices."""
    found = [Decoder()]
    if device.type == "cuda":
        import av

        if "cuda" in av.codec.hwaccel.hwdevices_available():
            found += [Nvdec(False, device.index or 0), Nvdec(True, device.index or 0)]
    return found


@dataclass(frozen=True)
class Trial:
    """One candidate on the clip's first frames: frames a second (None where it did not run), and why not."""

    name: str
    rate: float | None
    refused: str | None = None


def trial(decoder: Decoder, path: Path, frames: int, rgb: Callable, clock: Callable[[], float] = time.perf_counter) -> tuple[Trial, list]:
    """``decoder`` on the first ``frames`` frames of ``path``: its rate, and their time stamps."""
    try:
        container = decoder.open(path)
    except Exception as exc:  # a decoder that does not open here is no candidate
        return Trial(decoder.name, None, f"does not open: {type(exc).__name__}: {exc}"[:200]), []
    stamps = []
    try:
        started = clock()
        for frame in container.decode(main_video(container, str(path))):
            decoder.pixels(frame, rgb)
            decoder.raw(frame)
            stamps.append(frame.pts)
            if len(stamps) == frames:
                break
        decoder.sync()
        seconds = clock() - started
    except Exception as exc:
        return Trial(decoder.name, None, f"fails: {type(exc).__name__}: {exc}"[:200]), stamps
    finally:
        container.close()
    return Trial(decoder.name, len(stamps) / seconds if seconds > 0 else float("inf")), stamps


def choose(path: Path, decoders: Sequence[Decoder], rgb: Callable, frames: int = TRIAL_FRAMES,
           clock: Callable[[], float] = time.perf_counter, memory: Memory | None = None) -> tuple[Decoder, list[Trial]]:
    """The fastest of ``decoders`` (the host's first: the reference) on the clip's first frames, and
    every trial; one whose frames or time stamps differ from the host's is refused. With a
    ``memory``, a stream on which the host's decoder won here before goes to it untried (no
    trials), and a new win of the host's is remembered."""
    key = memory.key(path) if memory is not None else None
    if key is not None and memory.host_won(key):
        logger.info("decoders on %s: %s chosen untried, as it won the trials on such a stream here (remembered in %s; "
                    "delete that file to measure again)", path.name, decoders[0].name, memory.path)
        return decoders[0], []
    trials, chosen, best, reference = [], decoders[0], None, None
    for decoder in decoders:
        result, stamps = trial(decoder, path, frames, rgb, clock)
        if reference is None:
            reference = stamps
        elif result.rate is not None and stamps != reference:
            result = Trial(decoder.name, None, f"its frames differ from the host's ({len(stamps)} against {len(reference)}, "
                                               f"or their times)")
        trials.append(result)
        if result.rate is not None and (best is None or result.rate > best):
            chosen, best = decoder, result.rate
    kept = f", {memory.remember(key)}" if key is not None and won_by_host(trials) else ""
    logger.info("decoders on %s's first %d frames: %s; %s chosen%s", path.name, frames,
                ", ".join(f"{t.name} {t.rate:.0f} frames/s" if t.rate else f"{t.name} {t.refused}" for t in trials), chosen.name, kept)
    return chosen, trials


def won_by_host(trials: Sequence[Trial]) -> bool:
    """Whether the host's decoder (the first) outran every other that ran, and one did: others that
    only failed or were refused (NVDEC absent, or busy for a while) are no win to remember."""
    others = [t.rate for t in trials[1:] if t.rate is not None]
    return trials[0].rate is not None and bool(others) and trials[0].rate > max(others)

"""The GPU's own video encoder (NVENC) in place of x264 or x265, where the edge computes on a GPU
(``Encoding.gpu``), no encoder was named, and NVENC opens there: an H100 has none, and NVENC's H.264
takes at most 4096 a side. Whether it opens is probed once a GPU and frame size in a process.

NVENC encodes on the edge's GPU (``Encoding.gpu_index``), probed there too: FFmpeg's ``gpu`` option,
left at its default, takes the first GPU that has NVENC, GPU 0 with the edge on ``cuda:1``. Its index
counts the CUDA devices this process sees, as torch's does (both through CUDA's driver, after
``CUDA_VISIBLE_DEVICES``), so torch's index is the one to give."""

from __future__ import annotations

from fractions import Fraction

from .encoding import import_av, open_encoder

# The GPU's encoder for a software one, used where the edge is a GPU and it opens there.
HARDWARE = {"libx264": "h264_nvenc", "libx265": "hevc_nvenc"}
# The inputs' pixel formats that NVENC writes as the software encoder would (None: not known yet,
# a pipe's): 8-bit 4:2:0. NVENC's H.264 has no deeper profile, and its formats are semi-planar or
# 4:4:4: a 10-bit, 4:2:2 or 4:4:4 input beside a GPU keeps x264 or x265, its depth and its chroma,
# rather than be rounded for speed by default.
NVENC_KEEPS = (None, "yuv420p", "yuvj420p")
# FFmpeg's encoders through NVENC, each of which takes the ``gpu`` option.
NVENC = {"h264_nvenc", "hevc_nvenc", "av1_nvenc"}
# Whether each hardware encoder opened in this process, by GPU and frame size: NVENC's H.264 takes at
# most 4096 a side, so one that opened for a 1080p clip may refuse the page's next, a 5K one.
_OPENS: dict[tuple[str, int, int, int], bool] = {}


def hardware(name: str, width: int, height: int, gpu: int) -> str | None:
    """The GPU's encoder in place of the software encoder ``name``, where this PyAV has one and it
    opens on GPU ``gpu`` (torch's index) for frames of ``width`` x ``height`` (a GPU without NVENC,
    such as an H100, no driver, or a size NVENC refuses: None)."""
    candidate = HARDWARE.get(name)
    av = import_av()
    if candidate is None or candidate not in av.codecs_available:
        return None
    key = (candidate, gpu, width, height)
    if key not in _OPENS:
        _OPENS[key] = _opens(av, candidate, gpu, width, height)
    return candidate if _OPENS[key] else None


def on_gpu(name: str, gpu: int) -> dict[str, str]:
    """The option that puts encoder ``name`` on GPU ``gpu`` (torch's index), where it is NVENC's."""
    return {"gpu": str(gpu)} if name in NVENC else {}


def _opens(av, name: str, gpu: int, width: int, height: int) -> bool:
    """Whether encoder ``name`` opens on GPU ``gpu`` for 8-bit 4:2:0 frames of ``width`` x ``height``."""
    try:
        context = av.CodecContext.create(name, "w")
        context.width, context.height, context.pix_fmt, context.time_base = width, height, "yuv420p", Fraction(1, 25)
        context.options = on_gpu(name, gpu)
        open_encoder(context)
    except (av.error.FFmpegError, ValueError):
        return False
    return True

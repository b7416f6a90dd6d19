"""The streams on which the host's decoder won :func:`~.decoders.choose`'s trials here, remembered on
disk, so that a later run on such a stream skips them (docs/video.md, "Decoding on the GPU").

Only the host's wins are remembered: its decoder is the reference the others are checked against, so
choosing it untried is always right, at worst slower than an NVDEC that would now win. NVDEC's wins
are not: its frames and times are checked against the host's on each clip, so it is tried on every run.

The file is ``decoders.json`` under the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``,
then ``eden-serve/``, as inductor's cache), or where ``EDEN_DECODERS_FILE`` names. It holds a key per
win: what the outcome depends on, the machine's part (the GPU, its driver, CUDA, PyTorch, PyAV,
FFmpeg, the host's cores and this package's version) and the stream's (codec, pixel format, frame
size). A key with a part that cannot be read is neither looked up nor remembered. A missing,
unreadable or damaged file is an empty memory, and one that cannot be written keeps nothing: the
trials run, never an error. Deleting the file forgets every win.
"""

from __future__ import annotations

import json
import re
import time
from importlib import metadata
from os import environ
from pathlib import Path

import torch

from ..config import cache_home
from ..errors import BadInputError
from . import segments
from .containers import main_video
from .atomic import atomic_output

FILE_ENV = "EDEN_DECODERS_FILE"
FORMAT = 1  # the file's layout; a file of another is an empty memory, replaced at the next win
KEEP = 64  # wins kept, the newest: a machine meets a few codecs and sizes, and 64 keys are about 23 KB
MAX_BYTES = 1 << 20  # a larger file is not read (this module never writes one)


def default_path() -> Path | None:
    """The file's path; None where there is no home to keep it in."""
    if environ.get(FILE_ENV):
        return Path(environ[FILE_ENV])
    try:
        return cache_home() / "eden-serve" / "decoders.json"
    except RuntimeError:  # no HOME, and the user has no entry in the password database
        return None


# Where the NVIDIA driver's kernel module states its release: alone, or within a line ("NVRM version:
# NVIDIA UNIX [Open ]Kernel Module [for x86_64]  580.159.04  Release Build ...").
DRIVER_FILES = (("/sys/module/nvidia/version", r"^\s*(\d+\.\d+(?:\.\d+)?)\s*$"),
                ("/proc/driver/nvidia/version", r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)\s"))


def driver_version() -> str | None:
    """The NVIDIA driver's release: NVDEC's library comes with the driver, and PyTorch reports only
    the CUDA it was built for."""
    for path, pattern in DRIVER_FILES:
        try:
            text = Path(path).read_text(errors="replace")[:4096]
        except OSError:
            continue
        found = re.search(pattern, text)
        if found:
            return found.group(1)
    return None


def gpu(device: torch.device) -> dict:
    """The GPU the trials run beside, the CUDA PyTorch was built for, and the driver; None where not
    read (beside a CPU, all three)."""
    name = driver = None
    if device.type == "cuda":
        try:
            name = torch.cuda.get_device_name(device)
        except (RuntimeError, AssertionError):  # no CUDA, or no such device
            pass
        driver = driver_version()
    return {"gpu": name, "cuda": torch.version.cuda, "driver": driver}


def _package_version() -> str | None:
    try:
        return metadata.version("eden-serve")  # the candidates and the trial are this code's
    except metadata.PackageNotFoundError:
        return None


def machine(device: torch.device) -> dict:
    """What a trial's outcome depends on besides the stream: the GPU and the libraries on both sides,
    and the host's cores, which its decoder's threads and the conversion to RGB share."""
    import av

    libavcodec = av.library_versions.get("libavcodec")
    return {**gpu(device), "torch": torch.__version__, "pyav": av.__version__, "ffmpeg": getattr(av, "ffmpeg_version_info", None),
            "libavcodec": libavcodec and ".".join(map(str, libavcodec)), "cores": segments.host_cores(),
            "eden-serve": _package_version()}


def stream(path: Path) -> dict:
    """The stream's part of the key: its codec, pixel format and frame size, exact (a clip comes in a
    few sizes, and a decoder's speed against another's changes with its size)."""
    import av

    try:
        with av.open(str(path)) as container:
            context = main_video(container, str(path)).codec_context
            return {"codec": context.name, "pix_fmt": context.pix_fmt, "size": f"{context.width}x{context.height}"}
    except (av.FFmpegError, BadInputError, OSError):
        return {"codec": None, "pix_fmt": None, "size": None}


def unknown(key: dict) -> list[str]:
    return [name for name, value in key.items() if value is None]


def _wins(found) -> list[dict] | None:
    """The wins a file's JSON holds, or None where it is not this module's layout."""
    if not isinstance(found, dict) or found.get("format") != FORMAT or not isinstance(found.get("host_won"), list):
        return None
    wins = found["host_won"]
    return wins if all(isinstance(win, dict) and isinstance(win.get("key"), dict) for win in wins) else None


class Memory:
    """The file of the host's wins, asked beside ``device``."""

    def __init__(self, device: torch.device, path: Path | None = None):
        self.device, self.path = device, path or default_path()

    def key(self, clip: Path) -> dict:
        return {**machine(self.device), **stream(clip)}

    def host_won(self, key: dict) -> bool:
        return not unknown(key) and any(win["key"] == key for win in self._read())

    def remember(self, key: dict) -> str:
        """Keep ``key`` as one the host's decoder won; what became of it, for the log."""
        if unknown(key) or self.path is None:
            return f"not remembered (unknown here: {', '.join(unknown(key) or ['a home directory'])})"
        wins = [win for win in self._read() if win["key"] != key][-(KEEP - 1):]
        wins.append({"key": key, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        try:
            # Whole or not at all; two runs remembering at once keep one of their wins, and the other
            # runs its trials once more.
            with atomic_output(self.path) as tmp:
                tmp.write_text(json.dumps({"format": FORMAT, "host_won": wins}, indent=1) + "\n")
        except (BadInputError, OSError) as exc:
            return f"not remembered ({exc})"[:300]
        return f"remembered in {self.path} (delete it to measure again)"

    def _read(self) -> list[dict]:
        if self.path is None:
            return []
        try:
            with open(self.path, "rb") as file:
                data = file.read(MAX_BYTES + 1)
            found = json.loads(data) if len(data) <= MAX_BYTES else None
        except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, nested too deep
            return []
        return _wins(found) or []

"""What the command line asks of a video output's encoder (:class:`Encoding`: ``--vcodec``,
``--crf``, ``--preset``, ``--pix-fmt``, ``--encoder-opt``), and what every user of PyAV's encoders
needs: :func:`import_av` (PyAV is the optional ``video`` extra), :func:`holds` (whether a container
takes an encoder's stream), :func:`added` (whether it holds an input's stream as it is, and its
copy) and :func:`open_encoder`. Which encoder writes the output, and with which
options, is :mod:`.encoders`'; its pixel format :mod:`.pixel_formats`'; the GPU's own encoder
:mod:`.nvenc`'.

Every encoder opens through :func:`open_encoder`, which keeps the process's threads under the
scheduling policy they had: SVT-AV1 run as root moves the thread that opens it, and its own, to
SCHED_FIFO at priority 99 (docs/video.md, "Encoder speed").
"""

from __future__ import annotations

import fcntl
import io
import os
from dataclasses import asdict, dataclass, replace

from ..errors import BadInputError

VIDEO_EXTRA = "reading or writing video needs PyAV: pip install 'eden-serve[video]'"


def _threads() -> set[int]:
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except OSError:  # not Linux
        return set()


def open_encoder(context) -> None:
    """Open an encoder's ``context``; the calling thread, and the threads the encoder starts, stay
    under the caller's scheduling policy. Run as root, SVT-AV1 moves the thread that opens it to
    SCHED_FIFO at priority 99, and with it every thread started after (the encoder's own, then the
    writer's and the model's): on a 2-core host two chunk workers then spun on both cores while a
    thread they waited on, of the same priority, never ran again, and the command never ended
    (docs/video.md, "Encoder speed")."""
    if not hasattr(os, "sched_getscheduler"):
        context.open()
        return
    policy, param, before = os.sched_getscheduler(0), os.sched_getparam(0), _threads()
    try:
        context.open()
    finally:
        for tid in (0, *(_threads() - before)):  # 0: this thread
            try:
                if (os.sched_getscheduler(tid), os.sched_getparam(tid)) != (policy, param):
                    os.sched_setscheduler(tid, policy, param)
            except OSError:
                continue  # ended meanwhile


def import_av():
    try:
        import av
    except ImportError:
        raise BadInputError(VIDEO_EXTRA) from None
    return av


class FFmpegErrors:
    """FFmpeg's errors logged on this thread within ``with``, in one line (:attr:`line`; "" where it
    said none). PyAV keeps FFmpeg's log off, and its errors then say only "Invalid argument ...
    returned 22" or "Operation not permitted", never why: the log is on, at errors only, for that
    moment, and this thread's captured. PyAV drops a line the same as the last it let through, in any
    thread and long before: a second refusal alike in one process (the page's next run) said nothing,
    so repeats are kept for that moment too."""

    def __enter__(self) -> FFmpegErrors:
        self._av = av = import_av()
        self._level, self._skip = av.logging.get_level(), av.logging.get_skip_repeated()
        av.logging.set_level(av.logging.ERROR)
        av.logging.set_skip_repeated(False)
        self._capture = av.logging.Capture()
        self._logs = self._capture.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._capture.__exit__(*exc)
        self._av.logging.set_skip_repeated(self._skip)
        self._av.logging.set_level(self._level)

    @property
    def line(self) -> str:
        said = (" ".join(message.split()) for level, _, message in self._logs if level <= self._av.logging.ERROR)
        return " ".join(said).rstrip(".")


def side_data(frame) -> list:
    """A decoded frame's side data, each with its ``type``, whichever PyAV: 18 iterates them, 19
    their types (a mapping of type to side data: taking an item for a side data failed on the first
    frame of any video that had one, a phone's rotation, an encoder's SEI). None where the frame
    holds a type PyAV does not know: PyAV 18 names every type as it reads them, and FFmpeg 8.1's
    newer ones (a TIFF's EXIF, 31) raised ValueError, an internal error."""
    try:
        found = getattr(frame, "side_data", None)
    except ValueError:
        return []
    return [item if hasattr(item, "type") else found[item] for item in found] if found else []


@dataclass(frozen=True)
class Encoding:
    """What the command line asked of the encoder; None: the default."""

    vcodec: str | None = None
    crf: str | None = None
    preset: str | None = None
    pix_fmt: str | None = None
    options: tuple[tuple[str, str], ...] = ()  # --encoder-opt, in order, passed to the encoder as they are
    gpu: bool = False  # the edge computes on a GPU: the encoder's defaults keep its pace (:mod:`.encoders`)
    gpu_index: int = 0  # that GPU, torch's index: NVENC encodes there (:mod:`.nvenc`)
    verbose: bool = False  # -v: the encoder's own log (x265's and SVT-AV1's banners and statistics) on stderr
    instances: int | None = None  # x264 instances on segments (:mod:`.segments`); None: one

    @property
    def given(self) -> bool:
        """Whether the command line asked anything of the encoder."""
        return replace(self, gpu=False, gpu_index=0, verbose=False) != Encoding()

    def identity(self) -> dict:
        fields = {key: list(map(list, value)) if key == "options" else value for key, value in asdict(self).items()}
        del fields["verbose"], fields["gpu_index"]  # the output does not depend on them
        if not self.gpu:
            del fields["gpu"]  # as journals read before there was a GPU default
        if self.instances is None:
            del fields["instances"]  # likewise
        return fields

    def instances_for(self, name: str) -> int:
        """How many instances of encoder ``name`` encode the video: x264's as asked, else one, beside
        a GPU too: one x264 with all the cores was faster than several on segments with their shares
        wherever measured (docs/video.md, "Encoder speed"); any other encoder one."""
        if name != "libx264" or self.instances is None:
            return 1
        return self.instances


def parse_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise BadInputError(f"--encoder-opt takes KEY=VALUE, such as tune=film, got {text!r}")
    return key, value


# What a muxer takes but writes where no reader, or few, finds it: MPEG-TS writes a codec it has no
# stream type for as private data (FLAC, PCM, ALAC audio, SRT or ASS subtitles, read back as data),
# and MP4 PCM as ISO's ipcm, which players other than FFmpeg do not read (and which fails as the file
# ends where the channels' layout is unknown, as a Matroska file's PCM is): FFmpeg's command line
# re-encodes both (MP2 and AAC, the containers' defaults).
TS_CODECS = {"aac", "aac_latm", "mp2", "mp3", "ac3", "eac3", "dts", "truehd", "opus", "s302m", "dvb_subtitle", "dvb_teletext"}
M2TS_CODECS = {"pcm_bluray", "hdmv_pgs_subtitle"}  # Blu-ray's, which the muxer types in a .m2ts (its m2ts_mode) alone
MP4_FORMATS = {"mp4", "ipod", "3gp", "3g2", "ismv", "f4v", "psp"}


def muxes(format_name: str, name: str, add, m2ts: bool = False) -> bool:
    """Whether a container of ``format_name`` (a Blu-ray's ``m2ts``) takes the packets of a stream of
    codec ``name`` as they are and writes them where a reader finds them: not as above, and its muxer
    writes a header with the stream that ``add`` adds to a container (MOV refuses FLAC and Opus,
    only there)."""
    av = import_av()
    typed = TS_CODECS | M2TS_CODECS if m2ts else TS_CODECS
    if (format_name == "mpegts" and name not in typed) or (format_name in MP4_FORMATS and name.startswith("pcm_")):
        return False
    with av.open(io.BytesIO(), "w", format=format_name) as scratch:
        try:
            add(scratch)
            scratch.start_encoding()
        except (av.error.FFmpegError, ValueError):
            return False
    return True


def added(container, name: str, add):
    """The stream of codec ``name`` that ``add`` adds to ``container``, to take the input's packets
    as they are, or None where the container cannot hold them so (:func:`muxes`). ``add`` copies a
    local input's stream, or makes one from a cloud's probe (``client/remote.py``): both are decided
    alike, on a scratch muxer of the output's format."""
    av = import_av()
    m2ts = str(container.name).lower().endswith(".m2ts")  # as FFmpeg's muxer tells its mode
    if not muxes(container.format.name, name, add, m2ts):
        return None
    try:
        return add(container)
    except (av.error.FFmpegError, ValueError):
        return None


def copy_of(container, stream):
    """``container``'s copy of the input's audio, subtitle or attachment ``stream``, or None where it
    cannot hold it as it is (:func:`added`; an attachment is all header, and taken where it can be)."""
    av = import_av()
    if stream.type == "attachment":
        try:
            return container.add_stream_from_template(stream)
        except (av.error.FFmpegError, ValueError):
            return None
    name = stream.codec_context.codec.canonical_name if stream.codec_context is not None else ""
    return added(container, name, lambda output: output.add_stream_from_template(stream))


def header_refused(container, stream) -> str:
    """Why ``container``'s muxer refused to write its header with the video ``stream``, in FFmpeg's
    words, from a scratch muxer of its format tried again with its log captured; "" where it does
    not say. Asked only after the refusal: the log is on for that moment alone."""
    av = import_av()
    scratch = av.open(io.BytesIO(), "w", format=container.format.name)
    try:
        with FFmpegErrors() as errors:
            try:
                scratch.add_stream_from_template(stream)
                scratch.start_encoding()
            except (av.error.FFmpegError, ValueError):
                return errors.line
        return ""
    finally:
        try:
            scratch.close()
        except av.error.FFmpegError:  # a trailer of no frames, which GIF's muxer refuses
            pass


def close_unwritten(container) -> None:
    """Closes ``container``, an output whose muxer refused its header, and the file it opened for it:
    PyAV opens a container's file as it writes the header and closes it only after a header written,
    so the refused one's stayed open for the life of the process (the page's: one a run, on a partial
    output deleted since). Once closed, PyAV 18 (the version pyproject.toml takes) touches that file no
    more; its descriptor, the one that writes the container's path, is found in /proc (elsewhere it
    is left as PyAV leaves it)."""
    container.close()
    path = os.path.realpath(str(container.name))
    try:
        held = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in held:
        try:
            writes = fcntl.fcntl(int(name), fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
            if writes and os.readlink(f"/proc/self/fd/{name}") in (path, f"{path} (deleted)"):
                os.close(int(name))
        except OSError:
            continue  # the listing's own, closed since


def holds(format_name: str, name: str) -> bool:
    """Whether a container of ``format_name`` takes a stream of encoder ``name``: where FFmpeg does
    not know (MPEG-PS, which lists no codecs), it is tried, as the stream would be."""
    with import_av().open(io.BytesIO(), "w", format=format_name) as scratch:
        try:
            scratch.add_stream(name)
        except ValueError:
            return False
    return True

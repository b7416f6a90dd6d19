"""Video clips through PyAV (the optional ``video`` extra)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Iterator

from ..errors import BadInputError
from ..frames import check_size
from .base import Clip, ClipWriter, Frame

VIDEO_SUFFIXES = {".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi"}
VIDEO_EXTRA = "reading or writing video needs PyAV: pip install 'eden-serve[video]'"


def import_av():
    try:
        import av
    except ImportError:
        raise BadInputError(VIDEO_EXTRA) from None
    return av


class VideoClip(Clip):
    kind = "video"

    def __init__(self, path: Path, max_pixels: int | None = None):
        super().__init__(path)
        av = import_av()
        self._error = av.error.FFmpegError
        try:
            self.container = av.open(str(path))
        except self._error as exc:
            raise BadInputError(f"{path}: not a readable video ({exc})") from None
        if not self.container.streams.video:
            self.container.close()
            raise BadInputError(f"{path}: has no video stream")
        self.stream = self.container.streams.video[0]
        if max_pixels is not None:
            try:
                check_size(self.stream.width, self.stream.height, max_pixels, str(path))
            except BadInputError:
                self.container.close()
                raise
        self.stream.thread_type = "AUTO"
        self.length = self.stream.frames or None
        self.rate = Fraction(self.stream.average_rate or self.stream.guessed_rate or 25)

    def __iter__(self) -> Iterator[Frame]:
        try:
            for i, frame in enumerate(self.container.decode(self.stream)):
                yield Frame(i, f"frame {i}", image=frame.to_image(), raw=frame)
        except self._error as exc:
            raise BadInputError(f"{self.path}: cannot decode the video ({exc})") from None

    def writer(self, tmp, dst):
        return VideoWriter(tmp, dst, self)

    def close(self) -> None:
        self.container.close()


class VideoWriter(ClipWriter):
    """The input's codec and pixel format at twice its average frame rate, muxed as frames arrive.
    Original frames are re-encoded from their decoded pictures (no RGB round trip); H.264/H.265 use
    CRF 18. Frames get consecutive timestamps, so variable frame rate becomes constant; audio and
    other streams are not copied."""

    def __init__(self, tmp: Path, dst: Path, clip: VideoClip):
        av = import_av()
        self._error = av.error.FFmpegError
        try:
            self.container = av.open(str(tmp), "w")  # the container format follows the extension
        except (self._error, ValueError) as exc:
            raise BadInputError(f"output {str(dst)!r}: not a video file name ({exc})") from None
        source = clip.stream.codec_context
        try:
            self.stream = self.container.add_stream(source.name, rate=clip.rate * 2)
        except (self._error, ValueError) as exc:
            self.container.close()
            raise BadInputError(f"cannot encode {source.name} video with this PyAV build ({exc})") from None
        self.stream.width, self.stream.height = source.width, source.height
        self.stream.pix_fmt = source.pix_fmt
        if self.stream.codec_context.name in ("libx264", "libx265"):
            self.stream.options = {"crf": "18"}
        self.time_base = 1 / (clip.rate * 2)
        self.pix_fmt = source.pix_fmt
        self.count = 0
        self._none = av.video.frame.PictureType.NONE
        self._from_image = av.VideoFrame.from_image

    def _encode(self, picture) -> None:
        picture.pts, picture.time_base = self.count, self.time_base
        picture.pict_type = self._none  # let the encoder place keyframes, not the input's
        self.count += 1
        self.container.mux(self.stream.encode(picture))

    def add(self, frame):
        self._encode(frame.raw)

    def add_middle(self, middle, before, after):
        self._encode(self._from_image(middle.convert("RGB")).reformat(format=self.pix_fmt))

    def finish(self):
        self.container.mux(self.stream.encode(None))

    def close(self):
        self.container.close()

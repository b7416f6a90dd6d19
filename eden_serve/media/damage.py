"""A damaged video read on, as FFmpeg's command line reads one: a packet its decoder refuses
(bytes flipped or lost), frames it leaves out (those before the first key frame of a stream cut
between key frames, a picture it cannot conceal), frames it gives timed before the one it gave
last (its reordering lost after damage), and a file that ends before the end its container states
(cut short) are each left behind, and the run goes on with the frames that did decode, each at
its own time stamp: the middles across a gap are made between the frames either side of it, at
their times. What was lost is said in one warning as the reading ends: how many frames, and
where, in the input's seconds (:meth:`Damage.report`).

A stream of which no frame decodes is refused in one line (:class:`~eden_serve.errors.BadInputError`);
frames that repeat a time stamp still are (:meth:`~.video.VideoClip.timed`): that timing is broken,
not damaged, and no frame can be told to be the lost one."""

from __future__ import annotations

import bisect
import heapq
import re
import warnings
from fractions import Fraction
from types import SimpleNamespace
from typing import Iterator

from ..errors import BadInputError
from .encoding import import_av
from .steady import SteadyDecoder

SHOWN_RANGES = 4  # ranges of lost frames named in the warning; more are counted
INTERVAL_PACKETS = 64  # the first packets, whose times show a frame's interval
TS_PACKETS = (188, 192, 204)  # an MPEG-TS packet's bytes: TS, M2TS (a time code before each), with Reed-Solomon bytes
GAPS_KEPT = 1000  # gaps between frames held for the end's judgement: a variable rate's many are not all kept


class Damage:
    """What reading one video stream met: its packets as the demuxer gave them, the frames its
    decoder gave, and where either fell short."""

    def __init__(self, stream, path):
        self.stream, self.path = stream, path
        self.time_base = stream.time_base or Fraction(1, 25)
        # The time stamps of the packets sent to the decoder whose frames have not come out (at the
        # end, those lost: a long video's frames are not all kept), and the first few, for a frame's interval.
        self.pending: set[int] = set()
        self.first: list[int] = []
        self.packets = 0
        self.discarded = 0  # packets whose frames the container discards (an edit list)
        self.refused: list[int] = []  # packets (time stamps) the decoder refused
        self.disordered: list[int] = []  # frames timed before the one given before them, left out
        # Frames given that the decoder marks corrupt: damage it concealed (H.264's, MPEG-2's), the
        # one sign of it that PyAV gives (not the frame's decode_error_flags, nor the decoder's counts).
        self.concealed: list[int | None] = []
        # Gaps between frames given (the times either side) wider than the narrowest, as packets a
        # demuxer skipped leave them (a damaged Matroska cluster), judged at the end against the rate.
        self.gaps: list[tuple[int, int]] = []
        self.narrowest: int | None = None
        self.stopped: str | None = None  # why the demuxer stopped before the file's end
        self.end: int | None = None  # where the last packet ends (time stamp)
        self.muxer: set[str] = set()  # the container's names, as FFmpeg's demuxer gives them
        # The packets' time stamps not yet passed by a frame given, and how many were (:meth:`at`).
        self._ahead: list[int] = []
        self._passed = 0
        self.untimed = False  # a packet without a time stamp was read
        # The time stamps of packets that a server-side source's pages mark discarded (client/remote.py):
        # PyAV cannot set a packet's discard flag, so their frames are dropped here as FFmpeg's
        # decoder drops those of a local file's (decoded all the same, as references).
        self.hidden: set[int] = set()
        self.size: int | None = None  # the file's bytes (None: not known, a pipe's)
        self.positions: list[int | None] = []  # where the first packets start in it

    @classmethod
    def stated(cls, given: dict, time_base: Fraction, path) -> "Damage":
        """The damage of a server-side source's reading (client/remote.py), judged against the end
        its container states as the cloud's probe gives it (:func:`stated_end`); ValueError where
        ``given`` is not such a statement. A cloud from before states none: nothing is judged cut short."""
        if not isinstance(given, dict) or not set(given) <= {"container", "frames", "duration"} or (
                given and given.get("container") not in ("mov", "matroska")):
            raise ValueError("stated must hold container (mov or matroska), frames and duration at most")
        frames, duration = given.get("frames", 0), given.get("duration")
        if type(frames) is not int or not 0 <= frames < 1 << 32:
            raise ValueError("stated frames must be an integer from 0 to 2**32")
        if duration is not None and not (isinstance(duration, str) and len(duration) <= 40 and parse_duration(duration) is not None):
            raise ValueError("stated duration must be a Matroska duration, HH:MM:SS.nnnnnnnnn")
        stream = SimpleNamespace(time_base=time_base, frames=frames, start_time=None, metadata={"DURATION": duration} if duration else {})
        damage = cls(stream, path)
        damage.muxer = {given["container"]} if given else set()
        return damage

    def decoded(self, container, context, packets: Iterator | None = None) -> Iterator:
        """The frames of ``context`` (the stream's decoder, or libvpx's for its alpha) from the
        container's packets of the stream (or ``packets``: a server-side source's, as its pages
        bring them), a packet the decoder refuses left behind, a GOP that holds damage decoded
        without threads (:mod:`.steady`); a demuxer that fails ends the stream there, as FFmpeg's
        command line ends it."""
        av = import_av()
        packets, ending = container.demux(self.stream) if packets is None else packets, None
        decoder = SteadyDecoder(context)
        self.refused = decoder.refused
        if container is not None:
            self.muxer = set(str(getattr(getattr(container, "format", None), "name", "")).split(","))
            self.size = getattr(container, "size", None)
        while True:
            try:
                packet = next(packets)
            except StopIteration:
                break
            except av.error.FFmpegError as exc:
                self.stopped = one_line(exc)
                break
            if not packet.size:  # the demuxer ends a stream with an empty packet: flushed with it, frames keep their time base
                ending = packet
                continue
            self.packets += 1
            if packet.pts is None:
                self.untimed = True
            else:
                heapq.heappush(self._ahead, packet.pts)
            if packet.is_discard or packet.pts in self.hidden:  # an edit list's: the decoder drops its frame, as it should
                self.discarded += 1
            elif packet.pts is not None:
                self.pending.add(packet.pts)
                if len(self.first) < INTERVAL_PACKETS:
                    self.first.append(packet.pts)
                    self.positions.append(packet.pos)
                end = packet.pts + (packet.duration or 0)
                self.end = end if self.end is None else max(self.end, end)
            yield from self._seen(self._shown(decoder.decode(packet)))
        for frame in self._seen(self._shown(decoder.decode(ending))):  # what the decoder held back that it cannot give is lost: counted by the frames never shown
            if frame.time_base is None:  # flushed without the demuxer's last packet, which a failing demuxer did not give
                frame.time_base = self.stream.time_base
            yield frame

    def _seen(self, frames: list) -> list:
        self.concealed += [frame.pts for frame in frames if frame.is_corrupt]
        return frames

    def _shown(self, frames: list) -> list:
        """``frames`` but those of packets marked :attr:`hidden`."""
        return frames if not self.hidden else [frame for frame in frames if frame.pts not in self.hidden]

    def keep(self, pts: int | None, previous: int | None) -> bool:
        """Whether a frame timed ``pts`` (the decoder's stamp) follows the one given before it (timed
        ``previous``; None: not to be compared); one timed before it is left out (a decoder's
        reordering lost after damage), counted."""
        if pts is not None and previous is not None and pts < previous:
            self.disordered.append(pts)
            return False
        if pts is not None and previous is not None and pts > previous:
            gap = pts - previous
            if self.narrowest is None or gap < self.narrowest:
                self.narrowest = gap
            elif 2 * gap > 3 * self.narrowest and len(self.gaps) < GAPS_KEPT:
                self.gaps.append((previous, pts))
        self.pending.discard(pts)
        return True

    def at(self, pts: int) -> int:
        """The number of a frame timed ``pts`` among all the stream's frames, counted by time stamp
        as the packets state them (lost ones and those its container discards counted too): the
        packets read so far timed before it. Asked of the frames given, in the order given; a
        decoder gives a frame only once every packet shown before it has been sent to it."""
        while self._ahead and self._ahead[0] < pts:
            heapq.heappop(self._ahead)
            self._passed += 1
        return self._passed

    def lost(self) -> list[int]:
        """The time stamps of the frames that never came out: packets refused, or whose frames the
        decoder left out or gave out of order."""
        # Not the packets refused: a frame-threaded decoder tells a packet's error as it takes a later one.
        return sorted(self.pending)

    def skipped(self) -> list[int]:
        """The times of frames missing from a constant rate's packets (a gap between two frames given
        where no packet was read: a demuxer that skipped what it could not parse); none at a variable rate."""
        step = self._step(constant=True)
        if step is None:
            return []
        pending, missing = sorted(self.pending), []
        for before, after in self.gaps:
            for time in range(before + step, after - step // 2, step):
                at = bisect.bisect_left(pending, time - step // 2)
                if at == len(pending) or pending[at] > time + step // 2:  # no packet read there: not counted as lost
                    missing.append(time)
        return missing

    def report(self, frames: int) -> None:
        """After the reading, ``frames`` given: a stream of which none decoded refused in one line,
        and any damage met said in one warning."""
        skipped = self.skipped()
        lost = sorted(self.lost() + skipped)
        untimed = sum(pts is None for pts in self.refused)
        said = []
        if lost or untimed:
            disordered = f", {len(self.disordered)} of them decoded out of order and left out" if self.disordered else ""
            unread = f", {len(skipped)} of them in packets that could not be read" if skipped else ""
            said.append(f"{len(lost) + untimed} of its video's {self.packets - self.discarded + len(skipped)} frames were lost"
                        f"{self._where(lost)}{disordered}{unread}")
        if self.concealed:
            patched = len(self.concealed)
            said.append(f"{patched} {'frame was' if patched == 1 else 'frames were'} decoded with damage its decoder concealed"
                        f"{self._where(sorted(pts for pts in self.concealed if pts is not None))}")
        short = self._short()
        if self.stopped:
            said.append(f"reading stopped{'' if self.end is None else f' at {self._seconds(self.end)} s'}: {self.stopped}")
        elif short:
            said.append(short)
        if not frames and (self.packets or said):
            raise BadInputError(f"{self.path}: none of its video's frames could be decoded: the file is damaged"
                                f" ({'; '.join(said) or f'{self.packets} packets'})")
        if said:
            gone = lost or untimed or self.stopped or short
            warnings.warn(f"{self.path}: damaged: {'; '.join(said)}; " + (
                "the output goes on without them, each middle made between the frames either side of a gap, at their times"
                if gone else "the output keeps what was decoded"))

    def _short(self) -> str | None:
        """Where the packets end before the end the container states: MP4's and MOV's count of the
        stream's samples, exact; AVI's length, and Matroska's ``DURATION`` tag, which count the last
        frame for as long as it lasts, which the packets may not say: more than two frames short.
        MPEG-TS states no end (FFmpeg estimates one from its time stamps): a file cut within a packet
        shows it by its last packet's bytes (:func:`ts_tail`)."""
        if "mpegts" in self.muxer:
            tail = ts_tail(self.size, self.positions)
            return f"its last {tail[1]}-byte MPEG-TS packet holds {tail[0]} bytes (cut short?)" if tail and tail[0] else None
        if self.muxer & {"mov", "mp4"}:
            stated = self.stream.frames or 0
            return f"its header states {stated} frames, and the file holds {self.packets} (cut short?)" if self.packets < stated else None
        if "avi" in self.muxer and self.stream.frames:  # its header's length, in ticks of the time base (FFmpeg's duration is what it found)
            end = ((self.stream.start_time or 0) + self.stream.frames) * self.time_base
        elif self.muxer & {"matroska", "webm"}:
            tag = {str(k).upper(): str(v) for k, v in (self.stream.metadata or {}).items()}.get("DURATION")
            # FFmpeg's muxer writes where the stream ends, others how long it lasts: the earlier is taken.
            end = parse_duration(tag) if tag else None
        else:
            return None
        step = self._step()
        if end is None or self.end is None or step is None:
            return None
        ends = self.end * self.time_base
        if ends < end - 2 * step * self.time_base:
            return f"its packets end at {float(ends):.2f} s, before the {float(end):.2f} s its header states (cut short?)"
        return None

    def _step(self, constant: bool = False) -> int | None:
        """A frame's interval as the first packets' times show it (the median), not as the container
        states it; ``constant``: only where nearly all of them are that far apart, within a tick."""
        times = sorted(self.first)
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        step = gaps[len(gaps) // 2] if gaps else None
        if constant and (step is None or len(gaps) < 8 or 10 * sum(abs(g - step) > 1 for g in gaps) > len(gaps)):
            return None
        return step

    def _where(self, lost: list[int]) -> str:
        if not lost:
            return ""
        step = self._step()
        ranges: list[list[int]] = []
        for pts in lost:  # runs of consecutive frames, one range each
            if ranges and step is not None and pts - ranges[-1][1] <= step * Fraction(3, 2):
                ranges[-1][1] = pts
            else:
                ranges.append([pts, pts])
        named = [self._seconds(a) if a == b else f"{self._seconds(a)}-{self._seconds(b)}" for a, b in ranges[:SHOWN_RANGES]]
        more = f" and {len(ranges) - SHOWN_RANGES} more places" if len(ranges) > SHOWN_RANGES else ""
        return f", at {', '.join(named)}{more} s of the input"

    def _seconds(self, pts: int | None) -> str:
        return "?" if pts is None else f"{float(pts * self.time_base):.2f}"


def until_failure(packets: Iterator) -> Iterator:
    """A demuxer's ``packets`` up to where it fails: the stream ends there, as FFmpeg's command line
    ends it (a cloud's scan and pages of a source; what is lost is judged against :func:`stated_end`)."""
    try:
        yield from packets
    except import_av().error.FFmpegError:
        return


def ts_tail(size: int | None, positions: list) -> tuple[int, int] | None:
    """An MPEG-TS file's last packet, cut: (its bytes, the packet size), as the file's ``size`` and
    where its first video packets start (``positions``) show them: the one packet size of 188
    (TS), 192 (M2TS) and 204 (with Reed-Solomon bytes) that every packet starts on; None where
    not known. A file cut at a packet's end shows nothing: MPEG-TS states no length."""
    starts = [pos for pos in positions if isinstance(pos, int) and pos >= 0]
    if not size or size < 0 or len(set(starts)) < 2:
        return None
    fits = [packet for packet in TS_PACKETS if len({pos % packet for pos in starts}) == 1]
    return ((size - starts[0]) % fits[0], fits[0]) if len(fits) == 1 else None


def stated_end(container, stream) -> dict:
    """Where the container states the stream ends, as :meth:`Damage._short` judges a file cut short
    by it, for a cloud's probe: MP4's and MOV's count of samples, Matroska's ``DURATION`` tag (a
    cloud opens no MPEG-TS source)."""
    muxer = set(str(getattr(getattr(container, "format", None), "name", "")).split(","))
    if muxer & {"mov", "mp4"}:
        return {"container": "mov", "frames": stream.frames or 0}
    if muxer & {"matroska", "webm"}:
        tag = {str(k).upper(): str(v) for k, v in (stream.metadata or {}).items()}.get("DURATION")
        return {"container": "matroska", **({"duration": tag} if tag and len(tag) <= 40 and parse_duration(tag) else {})}
    return {}


def parse_duration(text: str) -> Fraction | None:
    """Matroska's ``DURATION`` tag (``HH:MM:SS.nnnnnnnnn``) in seconds; None where it is not one."""
    match = re.fullmatch(r"\s*(\d+):(\d{1,2}):(\d{1,2}(?:\.\d+)?)\s*", text)
    if not match:
        return None
    hours, minutes, seconds = match.groups()
    return Fraction(int(hours) * 3600 + int(minutes) * 60) + Fraction(seconds)


def one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())

"""Where retimed output frames fall and which dyadic middle each shows: expected values worked out
by hand in the comments."""

import argparse
import warnings
from fractions import Fraction as F

import pytest

from eden_serve.clips.arguments import add_clip_arguments, clip_options
from eden_serve.clips.schedule import Schedule, ancestors, nearest_dyadic
from eden_serve.errors import BadInputError
from eden_serve.media.timing import Retiming, parse_rate


def test_the_shallowest_dyadic_within_the_tolerance_is_shown():
    assert nearest_dyadic(F(5, 12), F(1, 10)) == F(1, 2)  # 0 is 5/12 away, 1/2 only 1/12
    assert nearest_dyadic(F(1, 12), F(1, 10)) == 0  # the original itself is close enough
    assert nearest_dyadic(F(11, 12), F(1, 10)) == 1  # so is the next one
    assert nearest_dyadic(F(1, 3), F(1, 12)) == F(1, 4)  # 1/2 is 1/6 away; 1/4 exactly 1/12
    assert nearest_dyadic(F(1, 3), F(1, 13)) == F(3, 8)  # 1/4 is now too far; 3/8 is 1/24 away
    assert nearest_dyadic(F(3, 4), F(0)) == F(3, 4)
    assert nearest_dyadic(F(1, 3), F(0)) == F(341, 1024)  # never exact: the deepest level's nearest


def test_a_middle_needs_its_ancestors_and_nothing_else():
    assert ancestors(F(1, 2)) == {F(1, 2)}
    assert ancestors(F(3, 8)) == {F(3, 8), F(1, 4), F(1, 2)}  # 3/8 from 1/4 and 1/2; 1/4 from 0 and 1/2
    assert ancestors(F(7, 8)) == {F(7, 8), F(3, 4), F(1, 2)}
    assert ancestors(F(0)) == ancestors(F(1)) == set()


def test_25_to_60_fps_over_five_source_intervals():
    """Output k is due at k/60 s; source interval i spans [i/25, (i+1)/25). The tolerance, a
    quarter of 1/60 s, is 5/48 of an interval."""
    schedule = Schedule(Retiming(fps=F(60)))
    got = [schedule.interval(F(i, 25), F(i + 1, 25)) for i in range(5)]
    positions = [[t.position for t in targets] for targets in got]
    assert positions == [[0, F(5, 12), F(5, 6)], [F(1, 4), F(2, 3)], [F(1, 12), F(1, 2), F(11, 12)],
                         [F(1, 3), F(3, 4)], [F(1, 6), F(7, 12)]]
    shown = [[t.shown for t in targets] for targets in got]
    assert shown == [[0, F(1, 2), F(3, 4)], [F(1, 4), F(3, 4)], [0, F(1, 2), 1], [F(1, 4), F(3, 4)], [F(1, 4), F(1, 2)]]
    # Middles computed: {1/2, 3/4}, {1/2, 1/4, 3/4}, {1/2}, {1/2, 1/4, 3/4}, {1/2, 1/4}: 11 for 5 intervals.
    assert (schedule.middles, schedule.intervals) == (11, 5)
    assert schedule.worst == F(1, 5)  # 1/12 of a 1/25 s interval is 1/300 s: 1/5 of 1/60 s
    assert "2.20 EDEN passes per source interval" in schedule.report()
    assert "within 0.20 of an output frame (3.3 ms)" in schedule.report()


def test_the_frames_after_the_last_original_show_it_until_the_video_ends():
    schedule = Schedule(Retiming(fps=F(60)))
    schedule.interval(F(0), F(1, 25))
    # The last original at 1/25 s shows until 2/25 s: frames due at 3/60 and 4/60 (5/60 > 2/25 is not).
    tail = schedule.tail(F(1, 25), F(2, 25))
    assert [t.shown for t in tail] == [0, 0]
    assert [F(1, 25) + t.position * F(1, 25) for t in tail] == [F(3, 60), F(4, 60)]


def test_factor_5_2_counts_in_source_frames_and_ends_at_the_last_original():
    schedule = Schedule(Retiming(factor=F(5, 2)))
    got = [schedule.interval(F(i), F(i + 1)) for i in range(2)]
    # Outputs at k * 2/5 source frames; tolerance 1/4 * 2/5 = 1/10 of an interval.
    assert [[t.position for t in targets] for targets in got] == [[0, F(2, 5), F(4, 5)], [F(1, 5), F(3, 5)]]
    assert [[t.shown for t in targets] for targets in got] == [[0, F(1, 2), F(3, 4)], [F(1, 4), F(1, 2)]]
    assert [t.position for t in schedule.tail(F(2), None)] == [0]  # output 5 is due at 2 exactly
    schedule = Schedule(Retiming(factor=F(3, 2)))
    assert len(schedule.interval(F(0), F(1))) == 2  # at 0 and 2/3
    assert schedule.tail(F(1), None) == []  # the next is due at 4/3: past the last original, not shown


def test_the_error_bound_sets_the_cost():
    """A looser bound shows shallower middles: 24 -> 60 fps costs less at 1/2 than at 1/8."""
    def cost(bound):
        schedule = Schedule(Retiming(fps=F(60), time_error=bound))
        for i in range(10):  # two periods of 5 intervals (12 output frames each)
            targets = schedule.interval(F(i, 24), F(i + 1, 24))
            assert all(abs(t.shown - t.position) * F(1, 24) <= bound / 60 for t in targets)
        return schedule.middles

    assert cost(F(1, 2)) < cost(F(1, 4)) < cost(F(1, 8))


def test_powers_of_two_keep_the_full_levels():
    assert Retiming(factor=F(8)).levels == 3
    assert Retiming(factor=F(3)).levels is None and Retiming(fps=F(60)).levels is None


@pytest.mark.parametrize("options, message", [
    ({"fps": F(0)}, "--fps must be above 0"),
    ({"factor": F(1)}, "--factor must be above 1 and at most 64, got 1"),
    ({"factor": F(65)}, "--factor must be above 1 and at most 64, got 65"),
    ({"fps": F(60), "time_error": F(3, 4)}, "--time-error must be above 0 and at most 1/2"),
])
def test_bad_retiming_is_refused(options, message):
    with pytest.raises(BadInputError, match=message):
        Retiming(**options)


def test_rates_parse_exactly():
    assert parse_rate("24000/1001") == F(24000, 1001)
    assert parse_rate("2997/50") == F(2997, 50)  # FFmpeg's reading of 59.94, when written as a fraction
    with pytest.raises(BadInputError, match="--fps takes N, N/D or a decimal"):
        parse_rate("sixty")
    with pytest.raises(BadInputError, match="--fps takes"):
        parse_rate("1/0")


@pytest.mark.parametrize("text, rate", [
    ("23.976", F(24000, 1001)), ("29.97", F(30000, 1001)), ("59.94", F(60000, 1001)), ("119.88", F(120000, 1001)),
    ("47.952", F(48000, 1001)), ("29.970", F(30000, 1001)), ("23.98", F(24000, 1001)),
    # not NTSC's to their digits: k = 26, 13 and 30 give 25.974, 12.987 and 29.97, not 25.5, 12.5 and 29.9
    ("25.5", F(51, 2)), ("12.5", F(25, 2)), ("29.9", F(299, 10)),
    ("60.0", F(60)), ("60", F(60)), ("30000/1001", F(30000, 1001)), ("2997/50", F(2997, 50)), ("5994e-2", F(2997, 50)),
])
def test_a_decimal_that_rounds_an_ntsc_rate_means_it(text, rate):
    """23.976, 29.97, 59.94 and 119.88 are NTSC's k*1000/1001 as a person writes them (HandBrake reads
    them so); before, 59.94 was 2997/50 exactly, as FFmpeg reads it. A decimal that no NTSC rate
    rounds to, a whole number and N/D stay exact."""
    assert parse_rate(text) == rate


def test_only_rates_read_decimals_as_ntsc():
    """--fps and --input-fps are rates; --factor and --time-error are not, and stay as written."""
    parser = argparse.ArgumentParser()
    add_clip_arguments(parser)
    options = clip_options(parser.parse_args(["--fps", "29.97", "--factor", "2.997", "--time-error", "0.2997",
                                              "--input-size", "16x16", "--input-fps", "59.94"]))
    assert options["fps"] == F(30000, 1001) and options["raw"].rate == F(60000, 1001)
    assert options["factor"] == F(2997, 1000) and options["time_error"] == F(2997, 10000)


def test_a_tick_is_the_nearest_halves_up_so_even_frames_stay_even():
    """Frames 1/60 s apart that start half a tick off the grid (an MPEG-PS video at 0.5417 s) keep
    one tick each: halves to even (Python's round) put 34.5 and 33.5 on the same tick."""
    from eden_serve.media.timing import tick_of

    start, tick = F(48750, 90000), F(1, 60)
    ticks = [tick_of(start + k * tick, tick) for k in range(8)]
    assert ticks == list(range(33, 41))
    assert [round((start + k * tick) / tick) for k in range(3)] == [32, 34, 34]  # what went wrong
    assert tick_of(F(7, 3), F(1)) == 2 and tick_of(F(-1, 2), F(1)) == 0


# --- a container's own clock ---------------------------------------------------------------------------


def written(src, dst, asked: list | None = None) -> list:
    """``src`` doubled into ``dst`` by a stand-in model, and the pairs it was asked (into ``asked``)."""
    from eden_serve.clips.processors import pairwise
    from eden_serve.clips.streaming import interpolate_clip
    from test_video import average

    asked = [] if asked is None else asked
    interpolate_clip(src, dst, pairwise(lambda *pair: asked.append(pair[0]) or average(*pair)), progress=False)
    return asked


def fast_clip(path, rate: int):
    """Four frames at ``rate`` a second, on a clock that holds them (Matroska's ms, else MP4's)."""
    from test_video import make_video

    return make_video(path, list(range(4)), F(1, rate), audio=None)


@pytest.mark.parametrize("rate, suffix, clock", [(1000, ".mkv", "1/1000 s"), (1000, ".webm", "1/1000 s"),
                                                 (1000, ".flv", "1/1000 s"), (1000, ".avi", "1/600 s"),
                                                 (1000, ".gif", "1/100 s"), (600, ".mkv", "1/1000 s"),
                                                 (600, ".avi", "1/600 s")])
def test_frames_closer_than_the_containers_clock_are_refused_before_any_is_made(tmp_path, rate, suffix, clock):
    """Doubled to 2000 or 1200 a second, two frames fall on one of Matroska's, WebM's or FLV's ms
    (written without a word, sharing a time stamp) or of AVI's or GIF's ticks (FFmpeg's "Invalid
    argument" as it wrote): refused before a pair is asked, naming the clock and where it fits."""
    pytest.importorskip("av")
    src = fast_clip(tmp_path / ("in.mkv" if rate == 1000 else "in.mp4"), rate)
    dst, asked = tmp_path / f"out{suffix}", []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # H.264 into WebM or GIF: written in the container's own codec
        named = "write .apng, .webp, .mp4, .mov or .nut" if suffix == ".gif" else "write .mp4, .mov or .nut"  # an animation's first
        with pytest.raises(BadInputError, match=f"clock of {clock}, too coarse for {2 * rate} frames a second.*{named}"):
            written(src, dst, asked)
    assert asked == [] and not dst.exists() and not list(tmp_path.glob(".out*"))


def test_a_variable_rates_frames_closer_than_the_clock_are_refused_and_nothing_is_left(tmp_path):
    """Frames 1 ms apart, doubled, are 0.5 ms apart: refused at the first such pair in Matroska (they
    shared a time stamp), the partial output removed; MP4, whose clock is the frames', holds them."""
    from test_video import make_video

    av = pytest.importorskip("av")
    src = make_video(tmp_path / "vfr.mkv", [0, 1, 2, 40, 80, 120], F(1, 1000), audio=None)
    with pytest.raises(BadInputError, match=r"at 0.000000 s and 0.000500 s, are closer than a tick of its container's "
                                            r"clock \(matroska: 1/1000 s\).*write .mp4, .mov or .nut"):
        written(src, tmp_path / "out.mkv")
    assert not list(tmp_path.glob("*out*"))
    written(src, tmp_path / "out.mp4")
    with av.open(str(tmp_path / "out.mp4")) as container:
        times = [frame.time for frame in container.decode(video=0)]
    assert len(times) == 11 and times == sorted(set(times)) and times[1] == 0.0005


@pytest.mark.parametrize("suffix", [".mp4", ".mov", ".nut"])
def test_containers_with_a_fine_clock_hold_2000_frames_a_second(tmp_path, suffix):
    av = pytest.importorskip("av")
    written(fast_clip(tmp_path / "in.mkv", 1000), tmp_path / f"out{suffix}")
    with av.open(str(tmp_path / f"out{suffix}")) as container:
        times = [frame.time for frame in container.decode(video=0)]
    assert [round(t - times[0], 6) for t in times] == [k / 2000 for k in range(7)]


def test_avi_is_given_a_clock_it_keeps_where_its_own_is_too_coarse(tmp_path):
    """500 frames a second doubled: AVI's muxer times any tick finer than 1 ms on 1/600 s, and
    failed as it wrote ("Invalid argument"); a frame's own 1/1000 s it keeps."""
    av = pytest.importorskip("av")
    written(fast_clip(tmp_path / "in.mp4", 500), tmp_path / "out.avi")
    with av.open(str(tmp_path / "out.avi")) as container:
        stream = container.streams.video[0]
        stamps = [packet.dts for packet in container.demux(stream) if packet.size]
        assert stream.time_base == F(1, 1000)
    assert len(stamps) == 7 and stamps == sorted(set(stamps))


def test_a_clock_too_coarse_is_one_line_and_exit_2_on_the_command_line(tmp_path, capsys):
    from eden_serve.commands.cli import main

    pytest.importorskip("av")
    src, dst = fast_clip(tmp_path / "in.mkv", 1000), tmp_path / "out.mkv"
    assert main(["interpolate", str(src), "-o", str(dst), "--config", "tiny"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "synthetic weights" not in line]
    assert len(err) == 1 and "matroska) times frames on a clock of 1/1000 s" in err[0], err
    assert not dst.exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize("timescale", [30000, 90000])
def test_ntsc_doubled_into_avi_is_on_its_own_frame_tick(tmp_path, timescale):
    """29.97 frames a second doubled into AVI: on the muxer's 1/600 s (its clock for any tick finer
    than 1 ms, which 59.94 a second do not fall on) the frames were rounded unevenly and the ticks
    between padded with empty frames, a "600 fps" AVI of 120 frames; as FFmpeg writes an AVI, they
    are on their own tick, 1001/60000 s, one packet each, the last shown until the input ends."""
    from test_video import make_video

    av = pytest.importorskip("av")
    step = timescale // 30000 * 1001
    src = make_video(tmp_path / "in.mp4", [step * k for k in range(6)], F(1, timescale), audio=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a constant rate's frames are not moved: nothing to say
        written(src, tmp_path / "out.avi")
    with av.open(str(tmp_path / "out.avi")) as container:
        stream = container.streams.video[0]
        assert (stream.time_base, stream.average_rate) == (F(1001, 60000), F(60000, 1001))
        stamps = [packet.dts for packet in container.demux(stream) if packet.size]
        assert stream.frames * stream.time_base == F(6 * 1001, 30000)  # 11 frames, the last two ticks long
    assert stamps == list(range(stamps[0], stamps[0] + 11))


def test_a_variable_rate_into_avi_is_on_the_nearest_ticks_of_a_constant_rate_said_once(tmp_path):
    """AVI holds a constant rate alone: a variable rate's frames are each moved to the nearest tick
    of its average rate, one warning saying so; two that would meet on one tick are refused."""
    from test_video import make_video

    av = pytest.importorskip("av")
    src = make_video(tmp_path / "vfr.mkv", [0, 17, 33, 50, 67, 83], F(1, 1000), audio=None)
    with pytest.warns(UserWarning, match=r"out.avi: its container \(avi\) holds a constant frame rate alone") as said:
        written(src, tmp_path / "out.avi")
    assert len([w for w in said if "constant frame rate" in str(w.message)]) == 1
    with av.open(str(tmp_path / "out.avi")) as container:
        stream = container.streams.video[0]
        stamps = [packet.dts for packet in container.demux(stream) if packet.size]
        assert 1 / stream.time_base == stream.average_rate < 600
    assert len(stamps) == 11 and stamps == sorted(set(stamps))
    src = make_video(tmp_path / "burst.mkv", [0, 40, 80, 82, 120, 160], F(1, 1000), audio=None)
    with pytest.warns(UserWarning, match="holds a constant frame rate alone"), \
            pytest.raises(BadInputError, match=r"closer than a tick of its container's clock \(avi: .*write .mp4, .mov or .nut"):
        written(src, tmp_path / "burst.avi")
    assert not list(tmp_path.glob("*burst.avi*"))


# --- an encoder's own clock: MPEG-4 Part 2 counts time in 16 bits ---------------------------------------


def test_mpeg4_at_a_rate_whose_clock_exceeds_16_bits_is_one_line_and_exit_2(tmp_path, capsys):
    """--vcodec mpeg4 --fps 119.88 needs a tick of 1001/120000 s, and MPEG-4 Part 2 counts at most
    65535 a second: the encoder refused it in a line that named the options it had been given
    (chroma_sample_location, qscale). Refused before any pair, naming the rate, the limit and what works."""
    from eden_serve.commands.cli import main

    pytest.importorskip("av")
    src, dst = fast_clip(tmp_path / "in.mp4", 25), tmp_path / "out.mp4"
    assert main(["interpolate", str(src), "-o", str(dst), "--config", "tiny", "--vcodec", "mpeg4", "--fps", "119.88"]) == 2
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if "synthetic weights" not in line]
    assert len(err) == 1 and "chroma_sample_location" not in err[0] and "qscale" not in err[0], err
    for said in ("mpeg4", "120000/1001", "65535", "--vcodec", "--fps 120"):
        assert said in err[0], err
    assert "pairs" not in captured.out and not dst.exists() and not list(tmp_path.glob(".out*"))


def test_mpeg4_from_a_90khz_clock_is_on_the_finest_16_bit_clock_its_frames_fall_on(tmp_path):
    """An MPEG-TS input's 1/90000 s, doubled into mpeg4: refused as above though 50 frames a second
    fit. Now on 1/65500 s, where each frame of 50 a second falls, evenly; a variable rate's frames on
    the finest 16-bit clock its average rate falls on, each within half a tick of its time (a tick of
    the first), without a word. A refusal before any pair
    where not even a frame's tick fits."""
    from eden_serve.clips.processors import pairwise
    from eden_serve.clips.streaming import interpolate_clip
    from eden_serve.media import Encoding
    from test_video import average, make_video

    av = pytest.importorskip("av")
    for name, stamps in (("cfr", [3600 * k for k in range(6)]), ("vfr", [0, 3000, 6600, 10800, 14400, 18000])):
        src = make_video(tmp_path / f"{name}.mp4", stamps, F(1, 90000), audio=None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            interpolate_clip(src, tmp_path / f"{name}-out.mp4", pairwise(average), progress=False, encoding=Encoding(vcodec="mpeg4"))
        with av.open(str(tmp_path / f"{name}-out.mp4")) as container:
            stream = container.streams.video[0]
            times = [F(frame.pts) * stream.time_base for frame in container.decode(stream)]
            tick = stream.time_base
            assert stream.codec_context.name == "mpeg4" and tick.denominator <= 65535 and (name == "vfr" or tick == F(1, 65500))
        wanted = [F(t, 90000) for pair in zip(stamps, stamps[1:]) for t in (pair[0], F(sum(pair), 2))] + [F(stamps[-1], 90000)]
        assert len(times) == 11 and all(abs(t - times[0] - w) <= tick for t, w in zip(times, wanted)), (name, tick, times)
    asked = []
    with pytest.raises(BadInputError, match=r"mpeg4 \(MPEG-4 Part 2\) counts time in at most 65535 ticks a second, and "
                                            r"120000/1001 \(119.880\) frames a second need 120000"):
        interpolate_clip(src, tmp_path / "fast.mp4", pairwise(lambda *pair: asked.append(pair[0]) or average(*pair)),
                         progress=False, encoding=Encoding(vcodec="mpeg4"), fps=F(120000, 1001))
    assert asked == [] and not list(tmp_path.glob("*fast*"))


def test_a_variable_rate_into_mpeg2_is_on_its_frame_rate_said_once_and_a_burst_refused_as_such(tmp_path):
    """MPEG-1/2 video is timed on its frame rate: a variable rate's frames were moved to its ticks
    without a word, and two that met on one were refused as "the input's time base is too coarse",
    though the input's clock was 1 ms. As into AVI: one warning naming the encoder, and a refusal
    naming its clock and the way out, nothing left."""
    from eden_serve.clips.processors import pairwise
    from eden_serve.clips.streaming import interpolate_clip
    from eden_serve.media import Encoding
    from test_video import average, make_video

    av = pytest.importorskip("av")
    src = make_video(tmp_path / "vfr.mkv", [0, 20, 41, 60, 79, 100], F(1, 1000), audio=None)
    with pytest.warns(UserWarning, match=r"out.mpg: mpeg2video writes a constant frame rate alone") as said:
        interpolate_clip(src, tmp_path / "out.mpg", pairwise(average), progress=False, encoding=Encoding("mpeg2video"))
    assert len([w for w in said if "constant frame rate" in str(w.message)]) == 1
    with av.open(str(tmp_path / "out.mpg")) as container:
        assert len(list(container.decode(video=0))) == 11
    src = make_video(tmp_path / "burst.mkv", [0, 40, 80, 82, 120, 160], F(1, 1000), audio=None)
    with pytest.warns(UserWarning, match="mpeg2video writes a constant frame rate alone"), \
            pytest.raises(BadInputError, match=r"at 0.080000 s and 0.081000 s, are closer than a tick of mpeg2video's clock "
                                               r"\(1/60 s\).*choose another --vcodec"):
        interpolate_clip(src, tmp_path / "burst.mpg", pairwise(average), progress=False, encoding=Encoding("mpeg2video"))
    assert not list(tmp_path.glob("*burst.mpg*"))

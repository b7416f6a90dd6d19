"""Where retimed output frames fall and which dyadic middle each shows: expected values worked out
by hand in the comments."""

import argparse
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

"""``--codec auto``: the slower of link and edge sets the pace, and the codec follows it."""

from __future__ import annotations

import threading

import pytest

from eden_serve.pace import AutoCodec, BusyTime, choose_codec

# Bytes per pair measured at chunk K = 8 on 640x272 camera video with the official dimensions
# (docs/wire-codecs.md): the frames codec about a twentieth of bf16+zstd.
SIZES = {"frames": 150e3, "bf16+zstd": 1.5e6}
MBIT = 1e6 / 8


@pytest.mark.parametrize("link_mbit, edge_rate, expected", [
    (20, 0.5, "bf16+zstd"),  # a CPU edge: 1.7 pairs/s of bf16 fit the link; the edge sets the pace either way
    (20, 30.0, "frames"),  # a GPU edge: bf16 is link bound at 1.7 pairs/s, frames at 16.7
    (1000, 30.0, "bf16+zstd"),  # 83 pairs/s of bf16 fit the link: the edge is the bottleneck again
    (100, 30.0, "frames"),  # bf16 8.3 pairs/s on the link
])
def test_the_slower_of_link_and_edge_sets_the_pace(link_mbit, edge_rate, expected):
    assert choose_codec(SIZES, link_mbit * MBIT, edge_rate) == expected


def test_near_ties_go_to_the_default_and_clear_wins_do_not():
    link = 1.5e6 * 10  # bf16: 10 pairs/s on the link
    assert choose_codec(SIZES, link, 10.1) == "bf16+zstd"  # frames would gain 1%: not worth the edge's E_cond
    assert choose_codec(SIZES, link, 10.5) == "frames"
    assert choose_codec({"frames": 1.0, "int8+zstd": 2.0}, 1.0, 100.0, default="bf16+zstd") == "frames"


def test_busy_time_is_the_union_of_overlapping_spans():
    busy = BusyTime()
    assert busy.rate() is None
    busy.add(0.0, 2.0, 10)
    busy.add(1.0, 3.0, 10)  # overlaps: the resource was busy 3 s in all, not 4
    busy.add(10.0, 11.0, 4)
    assert busy.rate() == pytest.approx(24 / 4)


def test_busy_time_follows_the_last_spans():
    busy = BusyTime(window=2)
    for start in range(5):
        busy.add(start, start + 1.0, 1 if start < 3 else 10)
    assert busy.rate() == pytest.approx(10)


def test_auto_tries_each_codec_once_then_chooses_from_measurements():
    auto = AutoCodec()
    assert [auto.next(), auto.next()] == ["frames", "bf16+zstd"]
    assert auto.next() == "frames"  # nothing measured yet
    # a slow link (1 MB/s) and a fast edge (20 pairs/s)
    auto.downloaded("frames", 8, 8 * 70e3, 0.0, 0.56)
    auto.answered(8, 0.6, 1.0)
    auto.downloaded("bf16+zstd", 8, 8 * 1.5e6, 1.0, 13.0)
    auto.answered(8, 13.0, 13.4)
    assert auto.next() == "frames"
    # then the edge slows to a crawl (0.2 pairs/s): the link no longer matters
    for start in range(20, 100, 5):
        auto.answered(1, float(start), start + 5.0)
    assert auto.edge.rate() == pytest.approx(0.2)
    assert auto.next() == "bf16+zstd"


def test_auto_is_safe_from_many_threads():
    auto = AutoCodec()
    seen = []

    def chunk(i: int) -> None:
        codec = auto.next()
        seen.append(codec)
        auto.downloaded(codec, 4, 4000 if codec == "frames" else 40000, i, i + 0.5)
        auto.answered(4, i + 0.5, i + 1.0)

    threads = [threading.Thread(target=chunk, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 32 and {"frames", "bf16+zstd"} <= set(seen)

"""``--codec auto``: the slower of link and edge sets the pace, and the codec follows it."""

from __future__ import annotations

import threading

import pytest

from eden_serve.client.pace import AutoCodec, BusyTime, choose_codec

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


def test_auto_keeps_to_frames_while_the_link_holds_it_back():
    auto = AutoCodec()
    assert [auto.next(), auto.next()] == ["frames", "frames"]  # nothing measured yet
    # a slow link (0.5 MB/s) and a fast edge (20 pairs/s): frames is link bound at 3.3 pairs/s,
    # so bf16's ten times larger payloads could only be slower, and are never tried
    auto.downloaded("frames", 8, 8 * 150e3, 0.0, 2.4)
    auto.answered(8, 2.4, 2.8)
    assert {auto.next() for _ in range(5)} == {"frames"}
    assert "bf16+zstd" not in auto.payload_bytes_per_pair


def test_auto_tries_the_default_where_the_edge_is_the_bottleneck_then_chooses():
    auto = AutoCodec()
    assert auto.next() == "frames"
    # a fast link (12.5 MB/s) and a CPU edge (0.5 pairs/s): frames is edge bound
    auto.downloaded("frames", 8, 8 * 150e3, 0.0, 0.096)
    auto.answered(8, 0.1, 16.1)
    assert auto.next() == "bf16+zstd"  # tried once
    assert auto.next() == "frames"  # its size is not known yet
    auto.downloaded("bf16+zstd", 8, 8 * 1.5e6, 16.1, 17.06)
    auto.answered(8, 17.1, 33.1)
    assert auto.next() == "bf16+zstd"  # both edge bound at 0.5 pairs/s: the default, which costs the edge less
    # then the link drops to 0.25 MB/s: bf16 would manage 0.17 pairs/s, frames still 0.5
    for start in range(40, 200, 10):
        auto.downloaded("bf16+zstd", 1, 1.5e6, float(start), start + 6.0)
    assert auto.next() == "frames"


def test_auto_is_safe_from_many_threads():
    auto = AutoCodec()
    seen = []

    def chunk(i: int) -> None:
        codec = auto.next()
        seen.append(codec)
        auto.downloaded(codec, 4, 4000 if codec == "frames" else 40000, i, i + 0.5)
        auto.answered(4, i + 0.5, i + 10.0)

    threads = [threading.Thread(target=chunk, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 32 and set(seen) <= {"frames", "bf16+zstd"}
    assert len(auto.link._spans) == len(auto.edge._spans) == 16  # each window kept its last 16, none lost
    assert auto.next() in ("frames", "bf16+zstd")

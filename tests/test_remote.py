"""A server-side source through the client (eden_serve/client/remote.py, eden_serve/wire/pages.py):
pages of packets checked before use, and ``cloud:NAME`` inputs written locally exactly as the same
file given locally, on a real TorchServe with the tiny model."""

from __future__ import annotations

import json
import warnings
from fractions import Fraction

import numpy as np
import pytest

from eden_serve import wire
from eden_serve.client import Client
from eden_serve.client.remote import RemoteVideo
from eden_serve.cloud import sources
from eden_serve.cloud.sources import SourceVideo
from eden_serve.commands.cli import main
from eden_serve.config import preset
from eden_serve.errors import CodecError
from eden_serve.media import Encoding, open_clip
from eden_serve.clips.processors import pairwise
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.media.colour import LIMITED, Colour
from eden_serve.media.containers import MAX_CHAPTERS, MAX_LABEL_CHARACTERS, MAX_TAGS, Labels
from eden_serve.wire.bitstream import BITSTREAM_CODEC, BitstreamKind
from eden_serve.wire.pages import MAGIC, Packet, Page, pack, unpack
from harness.servers import build_archives, torchserve
from harness.videos import damaged, edited, local_frames, make_clip, make_graded_clip, remux
from test_colour import P3
from test_dynamic_hdr import with_dolby_vision, with_hdr10_plus
from test_video import audio_end, average, display, frame_times, labelled_video, labels_of, make_video, real_video
from test_video_display import late_ts

av = pytest.importorskip("av")
HDR10 = Colour(9, 16, 9, LIMITED, P3, (1000, 400), chroma=3)


def page(**changes) -> Page:
    fields = {"stream": {"index": 0, "type": "video", "codec": "h264", "time_base": "1/12800", "width": 96, "height": 64,
                         "pix_fmt": "yuv420p"},
              "extradata": b"\x01\x02", "packets": [Packet(b"abc", 0, -512, 512, True), Packet(b"", None, None, 0, False)],
              "next": 7}
    return Page(**(fields | changes))


def test_a_page_round_trips():
    assert unpack(pack(page())) == page()
    skipping = [Packet(b"ab", -1024, -1024, 1024, True, (1024, 0)), Packet(b"c", 0, 0, 1024, True, (0, 648))]
    assert unpack(pack(page(packets=skipping))) == page(packets=skipping)  # an audio packet's samples to drop
    assert unpack(pack(page(next=None, packets=[]))) == page(next=None, packets=[])
    hidden = [Packet(b"ab", -512, -512, 512, True, discard=True), Packet(b"c", 0, 0, 512, False)]
    assert unpack(pack(page(packets=hidden))) == page(packets=hidden)  # an edit list's hidden frame
    assert "discard" not in _header(pack(page()))[0]  # stated only where a packet is: other pages as before


def _header(data: bytes) -> tuple[dict, bytes]:
    length = int.from_bytes(data[5:9], "big")
    return json.loads(data[9:9 + length]), data[9 + length:]


def _forged(edit) -> bytes:
    header, body = _header(pack(page()))
    edit(header)
    text = json.dumps(header).encode()
    return MAGIC + b"\x01" + len(text).to_bytes(4, "big") + text + body


@pytest.mark.parametrize("data, message", [
    (b"EDP", "too short"),
    (b"XXXX\x01\0\0\0\0", "wrong magic"),
    (b"EDPK\x02\0\0\0\0", "version 2"),
    (b"EDPK\x01\xff\xff\xff\xff{}", "over the limit or past the end"),
    (pack(page())[:-1], "runs past the end"),
    (pack(page()) + b"x", "1 bytes after the last packet"),
    (_forged(lambda h: h["packets"][0].__setitem__(0, 10**6)), "runs past the end"),
    (_forged(lambda h: h["packets"][0].__setitem__(0, -1)), "must be \\[size, pts, dts, duration, key\\]"),
    (_forged(lambda h: h["packets"][0].__setitem__(1, "0")), "pts must be an integer"),
    (_forged(lambda h: h["packets"][0].append([1, -1])), "or those and \\[skip start, end\\]"),
    (_forged(lambda h: h["packets"][0].append([1, 2**32])), "or those and \\[skip start, end\\]"),
    (_forged(lambda h: h["packets"][0].append([1, 2, 3])), "or those and \\[skip start, end\\]"),
    (_forged(lambda h: h["packets"][0].extend([[1, 2], 0])), "or those and \\[skip start, end\\]"),
    (_forged(lambda h: h["packets"].extend([[0, 0, 0, 0, False]] * 300)), "at most 256"),
    (_forged(lambda h: h["stream"].__setitem__("time_base", "1/0")), "not a positive fraction"),
    (_forged(lambda h: h["stream"].__setitem__("width", 2**40)), "width is not a small int"),
    (_forged(lambda h: h["stream"].__setitem__("__class__", "x")), "stream parameters must be among"),
    (_forged(lambda h: h.__setitem__("extradata", 10**9)), "extradata runs past the end"),
    (_forged(lambda h: h.__setitem__("more", 1)), "exactly stream, extradata, next and packets"),
    (_forged(lambda h: h.__setitem__("discard", [2])), "discard must list packets of the page"),
    (_forged(lambda h: h.__setitem__("discard", [1, 0])), "discard must list packets of the page"),
    (_forged(lambda h: h.__setitem__("discard", [0, 0])), "discard must list packets of the page"),
    (_forged(lambda h: h.__setitem__("discard", [True])), "discard must list packets of the page"),
    (_forged(lambda h: h.__setitem__("discard", "0")), "discard must list packets of the page"),
])
def test_hostile_pages_are_refused_with_a_reason(data, message):
    with pytest.raises(CodecError, match=message):
        unpack(data)


def test_a_remote_video_reads_as_the_local_file_across_pages(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_PAGE_PACKETS", 7)  # the cloud's pages, shorter: several of them
    path = real_video(tmp_path / "gops.mp4", 20, Fraction(25), source="bikes.mp4", size=(96, 64), audio=None,
                      options={"g": "6", "bf": "2"})
    video = SourceVideo(path, 10**7)
    asked = []

    def fetch(stream, start, after):
        asked.append(start)
        page = video.page(stream, start, after and (after.pts, after.dts, len(after.data)))
        assert video.demuxed <= 2 * 7 + 6 if start else True  # from the key frame before the page, not from the start
        return pack(page)

    remote = RemoteVideo("gops.mp4", json.loads(json.dumps(video.probe())), fetch)
    with open_clip(path) as clip:
        local = [(f.index, f.time, f.end, np.asarray(f.image)) for f in clip]
    read = [(f.index, f.time, f.end, np.asarray(f.image)) for f in remote]
    assert len(read) == len(local) == 20
    assert all(a[:3] == b[:3] and np.array_equal(a[3], b[3]) for a, b in zip(read, local))
    assert asked == [0, 7, 14]  # each page once: the first (read to plan) serves the first frames too


# MP4s whose edit list hides frames (harness.videos.edited): the first 3 (an `ffmpeg -ss ... -c copy`
# cut), the last 4, both, and the first 3 of a GOP with B-frames reordered across the edit's start.
EDITED = {"lead.mp4": {"count": 12, "hidden": 3}, "trail.mp4": {"count": 12, "hidden": 0, "shown": 8},
          "both.mp4": {"count": 14, "hidden": 2, "shown": 7},
          "preroll.mp4": {"count": 20, "hidden": 3, "options": {"x264-params": "keyint=8:min-keyint=8:bframes=2:b-adapt=0:scenecut=0"}}}


@pytest.mark.parametrize("name", sorted(EDITED))
def test_a_remote_video_whose_edit_list_hides_frames_reads_as_the_local_file(tmp_path, name):
    """The frames, times and numbers of the local run, nothing said of damage, and each frame named
    to the cloud by the number the cloud reads it at. Before, the pages did not say which packets
    the container discards: the client decoded and numbered the hidden frames, which the cloud's
    decoder never gives (`frames 0 to 1 do not all decode`, 400)."""
    path = edited(tmp_path / name, **EDITED[name])
    with open_clip(path) as clip:
        local = [(f.index, f.time, f.end, np.asarray(f.image)) for f in clip]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        remote = [(f.index, f.time, f.end, np.asarray(f.image), f.at) for f in _remote(path)]
    assert len(remote) == len(local) == EDITED[name].get("shown", EDITED[name]["count"] - EDITED[name]["hidden"])
    assert all(a[:3] == b[:3] and np.array_equal(a[3], b[3]) for a, b in zip(remote, local))
    cloud = SourceVideo(path, 10**7)
    assert all(np.array_equal(cloud.read(at, 1)[0], pixels) for _, _, _, pixels, at in remote)


@pytest.mark.parametrize("probe", [[], {"frames": -1, "rate": "25", "time_base": "1/25", "streams": []},
                                   {"frames": 3, "rate": "0", "time_base": "1/25", "streams": []},
                                   {"frames": 3, "rate": "25", "time_base": "x", "streams": []},
                                   {"frames": 3, "rate": "25", "time_base": "1/25", "streams": [], "start": "1e9"},
                                   {"frames": 3, "rate": "25", "time_base": "1/25", "streams": [], "streams_start": 600},
                                   {"frames": 3, "rate": "25", "time_base": "1/25", "streams": [], "start": str(2**33)}])
def test_a_probe_that_is_no_probe_is_refused(probe):
    with pytest.raises(CodecError, match="probe"):
        RemoteVideo("x.mp4", probe, lambda stream, start, after: pack(page()))


def _remote(path) -> RemoteVideo:
    """``path`` as a cloud serves it, read by a client in this process."""
    video = SourceVideo(path, 10**7)
    return RemoteVideo(path.name, json.loads(json.dumps(video.probe())),
                       lambda stream, start, after: pack(video.page(stream, start, after and (after.pts, after.dts, len(after.data)))))


def test_a_remote_video_decodes_by_the_colour_its_container_states(tmp_path):
    """FFV1 states no colour in its stream, Matroska does: a BT.709 clip's pixels are converted by
    BT.709's matrix on the client as on the cloud, not by swscale's default (BT.601)."""
    colour = Colour(1, 1, 1, LIMITED)
    path = make_graded_clip(tmp_path / "bt709.mkv", "ffv1", "yuv420p", (32, 48), 3, colour)
    remote = _remote(path)
    assert remote.colour == colour
    assert all(np.array_equal(a.pixels, b) for a, b in zip(remote, local_frames(path), strict=True))


@pytest.mark.parametrize("colour, message", [
    ("bt709", "colour must be an object"),
    ({"primaries": 1}, "colour must be an object"),
    (Colour(1, 1, 1).fields() | {"primaries": 256}, "primaries must be an integer from 0 to 255"),
    (Colour(1, 1, 1).fields() | {"range": True}, "range must be an integer"),
    (Colour(1, 1, 1).fields() | {"chroma": 7}, "chroma must be an integer from 0 to 6"),
    (Colour(1, 1, 1).fields() | {"light": [1000, 70000]}, "light must be null or"),
    (Colour(1, 1, 1).fields() | {"mastering": {"red": ["1/2", "1/3"]}}, "mastering must be null or an object"),
    (HDR10.fields() | {"mastering": HDR10.fields()["mastering"] | {"white": ["1/0", "1/3"]}}, "mastering white must be"),
    (HDR10.fields() | {"mastering": HDR10.fields()["mastering"] | {"green": ["3/2", "1/3"]}}, "mastering green must be"),
    (HDR10.fields() | {"mastering": HDR10.fields()["mastering"] | {"luminance": ["0", "9" * 10]}}, "mastering luminance must be"),
    (HDR10.fields() | {"mastering": HDR10.fields()["mastering"] | {"blue": ["0.1", "0.2"]}}, "mastering blue must be two fractions"),
])
def test_a_probes_colour_is_checked(tmp_path, colour, message):
    path = make_graded_clip(tmp_path / "clip.mkv", "ffv1", "yuv420p", (32, 48), 2)
    probe = json.loads(json.dumps(SourceVideo(path, 10**7).probe())) | {"colour": colour}
    with pytest.raises(CodecError, match=f"the cloud's probe: (colour's )?{message}"):
        RemoteVideo("clip.mkv", probe, lambda stream, start, after: pack(page()))


def test_a_probes_colour_reads_back_as_stated():
    assert Colour.from_fields(json.loads(json.dumps(HDR10.fields()))) == HDR10
    assert Colour.from_fields(Colour().fields()) == Colour()


def remote_and_local(src, dst, **warned) -> tuple:
    """``src`` written to ``dst``'s name as a cloud's source (read by a client in this process) and
    as a local file: the two outputs, and the warnings of each run."""
    outputs, said = [], []
    for kind, clip in (("remote", _remote(src)), ("local", src)):
        outputs.append(dst.with_name(f"{kind}{dst.suffix}"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            interpolate_clip(clip, outputs[-1], pairwise(average), progress=False)
        said.append([str(w.message).replace(outputs[-1].name, "OUT") for w in caught if "the input's" in str(w.message)])
    return outputs, said


@pytest.mark.parametrize("name, encoder, codec, suffix, made", [
    ("aac.mp4", "aac", "aac", ".webm", "opus"), ("aac.mp4", "aac", "aac", ".ivf", None),
    ("mp3.mp4", "libmp3lame", "mp3float", ".webm", "opus"),
    ("flac.mkv", "flac", "flac", ".mov", "aac"), ("pcm.mkv", "pcm_s16le", "pcm_s16le", ".mp4", "aac"),
    ("pcm.mkv", "pcm_s16le", "pcm_s16le", ".ts", "mp2")])
def test_a_remote_videos_audio_the_output_cannot_hold_is_re_encoded_as_a_local_files(tmp_path, name, encoder, codec, suffix, made):
    """AAC and MP3 into WebM become Opus, packet for packet the local run's, from the pages' packets
    and the samples their side data says to drop (the MP3's first frame is cut, and its time moved);
    IVF, which holds no audio, leaves it out: one warning each, the local run's. Before, refused.
    FLAC into MOV, PCM into MP4 or MPEG-TS, which the container lists but cannot hold as they are,
    are decided as a local file's are, on a scratch muxer: before, MOV refused FLAC at its header, MP4's
    PCM failed as the file ended, and MPEG-TS wrote PCM as data no reader takes for audio."""
    src = make_video(tmp_path / name, list(range(10)), Fraction(1, 25), audio=encoder)
    (remote, local), (said_remote, said_local) = remote_and_local(src, tmp_path / f"out{suffix}")
    assert said_remote == said_local and len(said_remote) == 1
    if suffix == ".ivf":
        assert said_remote[0] == f"OUT cannot hold the input's {codec} audio (stream 1); it is left out"
        assert stream_types(remote) == ["video"]
        return
    assert said_remote[0].startswith(f"OUT cannot hold the input's {codec} audio as it is: it is re-encoded")
    assert audio_of(remote) == audio_of(local) and audio_of(remote)[0][0] == made
    assert audio_end(remote) >= audio_end(src) - Fraction(1, 1000)  # all of it, to the encoder's last samples


@pytest.mark.parametrize("codec, given, suffix", [("mov_text", ".mp4", ".mkv"), ("subrip", ".mkv", ".webm"), ("ass", ".mkv", ".mp4")])
def test_a_remote_videos_text_subtitles_the_output_cannot_hold_are_converted_as_a_local_files(tmp_path, codec, given, suffix):
    """mov_text into Matroska (ASS), SRT into WebM (WebVTT), ASS into MP4 (mov_text): line for line
    the local run's, from the pages' packets and the track's header. Before, left out."""
    from test_subtitles import lines, source

    (remote, local), (said_remote, said_local) = remote_and_local(source(tmp_path, codec, given), tmp_path / f"out{suffix}")
    assert said_remote == said_local and len(said_remote) == 1 and "it is converted" in said_remote[0]
    assert lines(remote) == lines(local) and [text for _, _, text in lines(remote)[1]] == [b"hello", b"world"]


def test_a_remote_videos_labels_are_kept_as_a_local_files(tmp_path):
    src = labelled_video(real_video(tmp_path / "plain.mkv", 6, Fraction(25), audio=None), tmp_path / "labelled.mkv")
    for suffix in (".mkv", ".mp4"):
        (remote, local), _ = remote_and_local(src, tmp_path / f"out{suffix}")
        assert labels_of(remote) == labels_of(local) and labels_of(remote)[0]["title"] == "A film"
        assert [c[2] for c in labels_of(remote)[2]] == ["One", "Two"]


def starts(path) -> list[Fraction]:
    with av.open(str(path)) as container:
        return [s.start_time * s.time_base for s in container.streams]


@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_a_remote_file_whose_streams_all_start_late_is_moved_as_a_local_one(tmp_path, suffix):
    """Its streams and chapters moved earlier, so that the first starts at 0 (a recording's clip, 600 s
    into its clock), as the probe's start and streams_start say. Before, the probe said neither and
    the output was not moved: a Matroska output lasted from 0, its first frame 600 s in."""
    src = late_ts(tmp_path / "in.mkv", Fraction(600), Fraction(1, 10), chapters=[
        {"id": 1, "start": 600000, "end": 600060, "time_base": Fraction(1, 1000), "metadata": {"title": "One"}},
        {"id": 2, "start": 600060, "end": 600120, "time_base": Fraction(1, 1000), "metadata": {"title": "Two"}}])
    assert min(starts(src)) > 599
    (remote, local), _ = remote_and_local(src, tmp_path / f"out{suffix}")
    assert starts(remote) == starts(local) and min(starts(remote)) < 1
    assert frame_times(remote) == frame_times(local) and len(frame_times(remote)) == 5
    assert labels_of(remote)[2] == labels_of(local)[2] and [c[2] for c in labels_of(remote)[2]] == ["One", "Two"]


def probed(tmp_path) -> tuple:
    """A cloud's probe of a short video, and the fetch of its pages."""
    video = SourceVideo(make_video(tmp_path / "x.mp4", list(range(4)), Fraction(1, 25), audio=None), 10**7)
    return json.loads(json.dumps(video.probe())), lambda stream, start, after: pack(video.page(stream, start, None))


CHAPTER = {"id": 1, "start": 0, "end": 40, "time_base": "1/1000", "tags": {"title": "One"}}


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(tags={f"t{i}": "x" for i in range(MAX_TAGS + 1)}), "tags must be at most 64 tags"),
    (lambda d: d.update(tags={"title": 5}), "names and values strings"),
    (lambda d: d.update(video_tags={"title": ["x"]}), "video_tags must be"),
    (lambda d: d.update(tags={"comment": "x" * MAX_LABEL_CHARACTERS}), "more than 65536 characters"),
    (lambda d: d.update(chapters=[CHAPTER] * (MAX_CHAPTERS + 1)), "at most 256"),
    (lambda d: d.update(chapters=[{**CHAPTER, "tags": {"title": "x" * 1000}}] * 100), "more than 65536 characters"),
    (lambda d: d.update(chapters=[{**CHAPTER, "time_base": "1/0"}]), "time base must be a fraction"),
    (lambda d: d.update(chapters=[{**CHAPTER, "start": "0"}]), "a chapter must hold exactly"),
    (lambda d: d.update(chapters=[{**CHAPTER, "start": 2**64}]), "a chapter must hold exactly"),
    (lambda d: d.update(chapters=[{**CHAPTER, "code": "x"}]), "a chapter must hold exactly"),
    (lambda d: d.update(disposition=-1), "disposition"),
    (lambda d: d.pop("chapters"), "labels must hold exactly"),
])
def test_a_probes_labels_past_their_bounds_are_refused(tmp_path, edit, message):
    """A hostile or broken cloud writes no unbounded or unchecked labels: the run is refused in one line."""
    probe, fetch = probed(tmp_path)
    edit(probe["labels"])
    with pytest.raises(CodecError, match=f"the cloud's probe: .*{message}") as caught:
        RemoteVideo("x.mp4", probe, fetch)
    assert "\n" not in str(caught.value)
    with pytest.raises(CodecError, match="labels must hold"):
        RemoteVideo("x.mp4", {**probe, "labels": ["title"]}, fetch)


def test_a_remote_videos_dynamic_hdr_is_named_as_a_local_files(tmp_path):
    """The probe names it (HDR10+, Dolby Vision's record), the client takes it: its writer says the
    line a local file's says. A cloud from before states none; a hostile one's names are refused."""
    hdr10 = make_graded_clip(tmp_path / "hdr10.mkv", "libx265", "yuv420p10le", (48, 64), 3, HDR10)
    for src, named in [(with_dolby_vision(hdr10, tmp_path / "dv.mkv"), ("Dolby Vision (profile 8)",)),
                       (with_hdr10_plus(hdr10, tmp_path / "plus.mkv"), ("HDR10+",)), (hdr10, ())]:
        remote = _remote(src)
        with open_clip(src) as local:
            assert remote.dynamic_hdr == local.dynamic_hdr == named
        assert remote.probe["dynamic_hdr"] == list(named)
    video = SourceVideo(tmp_path / "dv.mkv", 10**7)
    probe = json.loads(json.dumps(video.probe()))

    def fetch(stream, start, after):
        return pack(video.page(stream, start, None))

    assert RemoteVideo("dv.mkv", {k: v for k, v in probe.items() if k != "dynamic_hdr"}, fetch).dynamic_hdr == ()
    for hostile in ["Dolby Vision", ["x" * 41], ["a\nb"], [3], ["HDR10+"] * 9]:
        with pytest.raises(CodecError, match="dynamic_hdr must be"):
            RemoteVideo("dv.mkv", {**probe, "dynamic_hdr": hostile}, fetch)


def test_labels_past_the_bounds_are_left_out_by_the_cloud():
    """The cloud states what fits, the title first; a client takes it back as stated."""
    chapters = [{"id": i, "start": 40 * i, "end": 40 * i + 40, "time_base": Fraction(1, 1000), "metadata": {"title": f"c{i}"}}
                for i in range(MAX_CHAPTERS + 10)]
    many = Labels({"title": "A film", "comment": "x" * MAX_LABEL_CHARACTERS, **{f"t{i}": "y" for i in range(100)}},
                  {"language": "fra"}, 1, chapters)
    fields = json.loads(json.dumps(many.fields()))
    back = Labels.from_fields(fields)
    assert back.tags["title"] == "A film" and "comment" not in back.tags and len(back.tags) == MAX_TAGS
    assert back.video_tags == {"language": "fra"} and back.disposition == 1
    assert back.chapters == chapters[:MAX_CHAPTERS]


def test_a_remote_png_video_decodes_as_the_local_file_alpha_included(tmp_path):
    """PNG in MOV, its packets each a whole picture: the client's decoder was not told they were key
    frames, and FFmpeg's PNG decoder added each picture to the one before (colours and alpha wrong
    from the second frame). Now the frames, their alpha included, are the local file's, and so is
    the output's alpha."""
    from test_output_alpha import alpha_samples, make_input

    src = make_input(tmp_path / "rgba.mov", "png", "rgba")
    with open_clip(src) as clip:
        local = [f.raw.to_ndarray() for f in clip]
    remote = [f.raw.to_ndarray() for f in _remote(src)]
    assert len(remote) == len(local) == 3 and all(np.array_equal(a, b) for a, b in zip(remote, local))
    (remote, local), _ = remote_and_local(src, tmp_path / "out.mov")
    alphas = []
    for path in (remote, local):
        with av.open(str(path)) as container:
            alphas.append([alpha_samples(f) for f in container.decode(video=0)])
    assert len(alphas[0]) == 5 and all(np.array_equal(a, b) for a, b in zip(*alphas))


def test_a_remote_webms_alpha_is_said_to_be_left_out_and_the_output_claims_none(tmp_path):
    """VP9's alpha is held beside each frame (Matroska's BlockAdditional), which a page's packets do
    not carry: it was dropped without a word. The probe says so, and the client says it once; the
    output is opaque and its track not marked as holding alpha. A cloud from before says nothing;
    a probe's alpha_left_out that is no boolean is refused."""
    from test_webm_alpha import alphas_and_tags, make_webm

    if "libvpx-vp9" not in av.codecs_available:
        pytest.skip("this PyAV has no libvpx-vp9")
    src = make_webm(tmp_path / "in.webm", "libvpx-vp9")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clip = _remote(src)
        interpolate_clip(clip, tmp_path / "out.webm", pairwise(average), progress=False)
    said = [str(w.message) for w in caught if "alpha" in str(w.message)]
    assert clip.probe["alpha_left_out"] is True
    assert len(said) == 1 and said[0].startswith("cloud:in.webm: ") and "the alpha is left out" in said[0], said
    means, tags = alphas_and_tags(tmp_path / "out.webm")
    assert "alpha_mode" not in tags and len(means) == 5 and all(m == 255 for m in means)
    opaque = make_video(tmp_path / "opaque.mp4", list(range(3)), Fraction(1, 25), audio=None)
    assert _remote(opaque).probe["alpha_left_out"] is False
    video = SourceVideo(src, 10**7)
    probe = json.loads(json.dumps(video.probe()))

    def fetch(stream, start, after):
        return pack(video.page(stream, start, None))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RemoteVideo("in.webm", {k: v for k, v in probe.items() if k != "alpha_left_out"}, fetch)
    assert not any("alpha" in str(w.message) for w in caught)
    with pytest.raises(CodecError, match="alpha_left_out must be true or false"):
        RemoteVideo("in.webm", {**probe, "alpha_left_out": "yes"}, fetch)


@pytest.mark.parametrize("codec, pix_fmt", [("qtrle", "argb"), ("prores_ks", "yuva444p10le")])
def test_a_remote_video_decodes_as_the_local_file_with_what_its_container_tells_the_decoder(tmp_path, codec, pix_fmt):
    """QuickTime RLE's decoder opens only with the bits of a coded sample, and ProRes's decodes 4444
    at 12 bits only told its codec tag (``ap4h``), both of which the container states: the client
    refused the first ("avcodec_open2 qtrle: Invalid data") and decoded the second at 10 bits. The
    probe's ``decoding`` states them; a cloud from before states none and the client decodes as it
    did; one out of its bounds is refused."""
    from test_output_alpha import make_input

    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV has no {codec}")
    src = make_input(tmp_path / "in.mov", codec, pix_fmt)  # prores_ks on yuva444p10le: 4444, tagged ap4h
    with open_clip(src) as clip:
        local = [f.raw for f in clip]
    remote = [f.raw for f in _remote(src)]
    assert [f.format.name for f in remote] == [f.format.name for f in local] and len(local) == 3
    assert all([bytes(p) for p in a.planes] == [bytes(p) for p in b.planes] for a, b in zip(remote, local))
    video = SourceVideo(src, 10**7)
    probe = json.loads(json.dumps(video.probe()))
    assert probe["decoding"]

    def fetch(stream, start, after):
        return pack(video.page(stream, start, None))

    before = RemoteVideo("in.mov", {k: v for k, v in probe.items() if k != "decoding"}, fetch)
    assert before.decoding == {}
    for decoding, message in [("ap4h", "decoding must hold"), ({"codec_tag": "ap4h\n"}, "four printable ASCII"),
                              ({"bits_per_coded_sample": 65}, "from 1 to 64"), ({"bits_per_coded_sample": True}, "from 1 to 64"),
                              ({"pix_fmt": "rgba"}, "decoding must hold")]:
        with pytest.raises(CodecError, match=message):
            RemoteVideo("in.mov", {**probe, "decoding": decoding}, fetch)


@pytest.mark.parametrize("transparent", [True, False])
def test_a_remote_palettes_alpha_is_kept_as_a_local_files(tmp_path, transparent):
    """A paletted source (PNG in MOV, ``pal8``) holds its alpha in its palette: the client takes its
    first picture's palette as a local run does (media/palette.py), so its APNG output is RGBA where
    the palette is translucent, RGB where opaque (before: ``pal8`` was chosen, and its middles,
    made of RGB, could not be encoded)."""
    from test_output_alpha import alpha_samples, make_paletted

    src = make_paletted(tmp_path / "in.mov", transparent)
    outputs = []
    for clip, name in ((_remote(src), "remote.apng"), (src, "local.apng")):
        interpolate_clip(clip, tmp_path / name, pairwise(average), progress=False)
        with av.open(str(tmp_path / name)) as container:
            frames = list(container.decode(video=0))
        outputs.append((frames[0].format.name, [alpha_samples(f) for f in frames] if transparent else []))
    (remote, remote_alphas), (local, local_alphas) = outputs
    assert remote == local == ("rgba" if transparent else "rgb24")
    assert all(np.array_equal(a, b) for a, b in zip(remote_alphas, local_alphas, strict=True))


# --- cloud: sources end to end ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    real_video(root / "gops.mp4", 24, Fraction(25), source="bikes.mp4", size=(96, 64), audio=None,
               options={"g": "6", "bf": "2", "sc_threshold": "0"})
    real_video(root / "gops.mkv", 16, Fraction(25), source="bikes.mp4", size=(96, 64), audio=None,  # no dts stored
               options={"g": "6", "bf": "2", "sc_threshold": "0"})
    real_video(root / "sine.mp4", 12, Fraction(25), source="bikes.mp4", size=(96, 64), audio="aac")
    make_video(root / "vfr.mkv", [0, 1, 3, 4, 7, 8, 9, 12, 13, 15], Fraction(1, 25), audio=None)  # a variable rate
    make_video(root / "opus.mkv", list(range(10)), Fraction(1, 25), audio="libopus")  # WebM's and Matroska's usual audio
    make_video(root / "mp3.mp4", list(range(10)), Fraction(1, 25), audio="libmp3lame")
    make_video(root / "flac.mkv", list(range(10)), Fraction(1, 25), audio="flac")  # MOV lists FLAC, and refuses it
    make_video(root / "pcm.mkv", list(range(10)), Fraction(1, 25), audio="pcm_s16le")  # MP4's ipcm, MPEG-TS's data
    make_video(root / "mpeg4.mp4", list(range(10)), Fraction(1, 25), video="mpeg4", audio=None)  # no codec bitstream carries
    make_video(root / "shown.mp4", list(range(10)), Fraction(1, 25), audio=None, shown=(90, True, Fraction(4, 3)))
    make_video(root / "subtitled.mkv", list(range(10)), Fraction(1, 25), subtitle_codec="subrip",
               subtitles=[(0, 120, "bonjour"), (200, 360, "au revoir")])
    plain = real_video(tmp_path_factory.mktemp("plain") / "plain.mkv", 6, Fraction(25), size=(96, 64), audio=None)
    labelled_video(plain, root / "labelled.mkv")
    hdr10 = make_graded_clip(tmp_path_factory.mktemp("hdr") / "hdr10.mkv", "libx265", "yuv420p10le", (64, 96), 4, HDR10)
    with_dolby_vision(hdr10, root / "dolby.mkv", size=(64, 96))
    with_hdr10_plus(hdr10, root / "hdr10plus.mkv")
    ffv1 = make_clip(tmp_path_factory.mktemp("whole") / "ffv1.mkv", "ffv1", {}, (48, 64), 20, synthetic=True)
    damaged(ffv1, root / "refused.mkv", 11)  # a packet its decoder refuses, the last of its GOP: what follows decodes as it was
    damaged(ffv1, root / "refused within.mkv", 7)  # within its GOP: the frames after it in the GOP lost with it
    h264 = make_clip(tmp_path_factory.mktemp("whole") / "h264.mkv", "libx264", {"g": "10", "bframes": "0"}, (48, 64), 20, synthetic=True)
    remux(h264, root / "keyless.mkv", lambda index, packet: index >= 3)  # cut before its first key frame
    # A P-frame its decoder conceals, and its GOP after it: decoded again without threads, here and on the cloud.
    damaged(make_clip(tmp_path_factory.mktemp("whole") / "h264.mkv", "libx264", {"g": "10", "bframes": "0"}, (96, 128), 20,
                      synthetic=True), root / "concealed.mkv", 5)
    remux(h264, root / "undecodable.mkv", lambda index, packet: 1 <= index < 10)
    for name, made in EDITED.items():
        edited(root / name, **made)
    (root / "vidéos").mkdir()
    (root / "vidéos" / "été 1.mp4").write_bytes((root / "gops.mp4").read_bytes())
    return root


@pytest.fixture(scope="module")
def servers(media, tmp_path_factory):
    store = build_archives(tmp_path_factory.mktemp("store"), config="tiny", media_root=media)
    with torchserve(store, models=["eden_encoder.mar", "eden_ditdec.mar"], token_auth=False) as server:
        yield server


def frames_and_times(path) -> list[tuple[int, np.ndarray]]:
    with av.open(str(path)) as container:
        return [(frame.pts, frame.to_ndarray(format="rgb24")) for frame in container.decode(video=0)]


def same_video(a, b) -> bool:
    x, y = frames_and_times(a), frames_and_times(b)
    return len(x) == len(y) and all(p == q and np.array_equal(f, g) for (p, f), (q, g) in zip(x, y))


@pytest.mark.serving
@pytest.mark.parametrize("codec, options", [
    (wire.DEFAULT_CODEC, {}),
    (wire.FRAMES_CODEC, {"fps": Fraction(60)}),
    (wire.DEFAULT_CODEC, {"fps": Fraction(60)}),
    (wire.DEFAULT_CODEC, {"factor": 4}),
])
def test_a_cloud_source_equals_the_same_file_sent_from_here(servers, media, tmp_path, codec, options):
    url = servers.inference_url
    # Lossless: x264's own output varies from run to run. One chunk at the edge at a time: pairs of
    # two chunks batched together round otherwise as the timing of their requests has it.
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1"), **options}
    with Client(cloud=url, edge=url, codec=codec) as client:
        remote = client.interpolate_clip("cloud:gops.mp4", tmp_path / "remote.mkv", **run)
        local = client.interpolate_clip(media / "gops.mp4", tmp_path / "local.mkv", **run)
    assert same_video(tmp_path / "remote.mkv", tmp_path / "local.mkv")
    assert remote.pairs == local.pairs > 0
    if "factor" not in options:  # every chunk named, none uploaded: a few hundred bytes of form per chunk
        assert remote.sent_bytes - remote.payload_bytes < local.sent_bytes - local.payload_bytes < local.sent_bytes


@pytest.mark.serving
@pytest.mark.parametrize("codec", [BITSTREAM_CODEC, wire.FRAMES_CODEC])
def test_a_cloud_source_may_have_any_name_its_file_system_holds(servers, media, tmp_path, codec):
    """A name beyond ASCII, sent as UTF-8, as any client sends text: the cloud refused it with 400,
    "form field 'source' must be ASCII text"."""
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    with Client(cloud=url, edge=url, codec=codec) as client:
        remote = client.interpolate_clip("cloud:vidéos/été 1.mp4", tmp_path / "remote.mkv", **run)
        client.interpolate_clip(media / "gops.mp4", tmp_path / "local.mkv", **run)
    assert remote.pairs == 23 and same_video(tmp_path / "remote.mkv", tmp_path / "local.mkv")


@pytest.mark.serving
@pytest.mark.parametrize("codec", [BITSTREAM_CODEC, wire.FRAMES_CODEC])
def test_a_cloud_source_is_shown_as_the_same_file_sent_from_here(servers, media, tmp_path, codec):
    """Its display matrix (a rotation and a mirror) and its pixels' aspect ratio, from the probe: the
    client decodes the packets without the container that states them."""
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False}
    with Client(cloud=url, edge=url, codec=codec) as client:
        client.interpolate_clip("cloud:shown.mp4", tmp_path / "remote.mp4", **run)
        client.interpolate_clip(media / "shown.mp4", tmp_path / "local.mp4", **run)
    matrix, aspect = display(media / "shown.mp4")
    assert len(matrix) == 1 and aspect == Fraction(4, 3)
    assert display(tmp_path / "remote.mp4") == display(tmp_path / "local.mp4") == (matrix, aspect)


@pytest.mark.serving
@pytest.mark.parametrize("name", sorted(EDITED))
@pytest.mark.parametrize("codec", [wire.FRAMES_CODEC, BITSTREAM_CODEC])
def test_a_cloud_source_whose_edit_list_hides_frames_equals_the_local_file(servers, media, tmp_path, name, codec):
    """An MP4 cut by `ffmpeg -ss ... -c copy` (its first frames hidden), one whose last frames are
    hidden, and one whose hidden frames are B-frames' references: the local run's frames, times and
    middles, the bitstream chunks sent as packets, without a warning. Before, `frames 0 to 1 do not
    all decode` (400) with either codec: the client decoded the hidden frames and named them."""
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    with warnings.catch_warnings(record=True) as caught, Client(cloud=url, edge=url, codec=codec) as client:
        warnings.simplefilter("always")
        remote = client.interpolate_clip(f"cloud:{name}", tmp_path / "remote.mkv", **run)
        local = client.interpolate_clip(media / name, tmp_path / "local.mkv", **run)
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught]
    assert same_video(tmp_path / "remote.mkv", tmp_path / "local.mkv")
    assert remote.pairs == local.pairs == len(local_frames(media / name)) - 1 >= 6
    if codec == BITSTREAM_CODEC:  # as packets, not the frames codec's pixels
        with Client(cloud=url, edge=url, codec=wire.FRAMES_CODEC) as client:
            frames = client.interpolate_clip(f"cloud:{name}", tmp_path / "frames.mkv", **run)
        assert remote.received_bytes < frames.received_bytes


@pytest.mark.serving
def test_a_variable_rate_cloud_source_keeps_its_times(servers, media, tmp_path):
    url = servers.inference_url
    run = {"chunk": 3, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    with Client(cloud=url, edge=url) as client:
        client.interpolate_clip("cloud:vfr.mkv", tmp_path / "remote.mkv", **run)
        client.interpolate_clip(media / "vfr.mkv", tmp_path / "local.mkv", **run)
    assert same_video(tmp_path / "remote.mkv", tmp_path / "local.mkv")
    times = [t for t, _ in frames_and_times(tmp_path / "remote.mkv")]
    assert len(times) == 19 and times[:8] == [0, 20, 40, 80, 120, 140, 160, 220]  # ms: originals at 0, 40, 120, 160, 280


@pytest.mark.serving
def test_the_command_reads_a_cloud_source_and_refuses_a_path_outside(servers, media, tmp_path, capsys):
    url = servers.inference_url
    assert main(["client", "cloud:gops.mp4", "-o", str(tmp_path / "out.mp4"), "--cloud", url, "--edge", url,
                 "--chunk", "8"]) == 0
    assert len(frames_and_times(tmp_path / "out.mp4")) == 2 * 24 - 1
    capsys.readouterr()
    assert main(["client", "cloud:../gops.mp4", "-o", str(tmp_path / "bad.mp4"), "--cloud", url, "--edge", url]) == 2
    error = capsys.readouterr().err
    assert "leaves the media root" in error and "HTTP 403" in error and error.count("\n") == 1
    assert not (tmp_path / "bad.mp4").exists()


@pytest.mark.serving
@pytest.mark.parametrize("codec", [wire.DEFAULT_CODEC, BITSTREAM_CODEC])
@pytest.mark.parametrize("name", ["refused.mkv", "refused within.mkv", "keyless.mkv", "concealed.mkv"])
def test_a_damaged_cloud_source_is_read_on_as_the_local_file(servers, media, tmp_path, name, codec):
    """Before, the client's reading ended at a packet its decoder refused ("cannot decode the
    video"), and a source cut before its first key frame was refused ("frames 0 to 4 do not all
    decode": the client named its first frame 0). Now the same output as the local file's, and the
    same one warning; a chunk the bitstream codec cannot carry goes with the frames codec."""
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    with Client(cloud=url, edge=url, codec=codec) as client:
        with warnings.catch_warnings(record=True) as there:
            warnings.simplefilter("always")
            remote = client.interpolate_clip(f"cloud:{name}", tmp_path / "remote.mkv", **run)
        with warnings.catch_warnings(record=True) as here:
            warnings.simplefilter("always")
            local = client.interpolate_clip(media / name, tmp_path / "local.mkv", **run)
    # The damage's one warning; the bitstream codec's chunks of a concealed GOP go with the frames codec,
    # each said (the edge decodes them on slice threads from the key frame, and conceals otherwise).
    said, said_here = ([str(w.message) for w in caught if ": damaged: " in str(w.message)] for caught in (there, here))
    assert len(said) == len(said_here) == 1 and said[0] == said_here[0].replace(str(media / name), f"cloud:{name}"), (said, said_here)
    assert remote.pairs == local.pairs > 0 and same_video(tmp_path / "remote.mkv", tmp_path / "local.mkv")


@pytest.mark.serving
def test_a_cloud_source_of_which_nothing_decodes_is_refused_in_one_line(servers, tmp_path, capsys):
    url = servers.inference_url
    assert main(["client", "cloud:undecodable.mkv", "-o", str(tmp_path / "out.mkv"), "--cloud", url, "--edge", url]) == 2
    error = capsys.readouterr().err
    assert "none of its video's frames could be decoded: the file is damaged" in error and error.count("\n") == 1, error
    assert "Traceback" not in error and not (tmp_path / "out.mkv").exists()


def stream_types(path) -> list[str]:
    with av.open(str(path)) as container:  # closed here, not when the collector finds it
        return [s.type for s in container.streams]


def audio_of(path) -> tuple[tuple, list[tuple]]:
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        context = stream.codec_context
        packets = [(bytes(p), p.pts * p.time_base, p.duration) for p in container.demux(stream) if p.size]
        return (context.name, context.sample_rate, context.layout.name, stream.start_time * stream.time_base), packets


@pytest.mark.serving
@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_a_cloud_sources_audio_is_copied_as_from_a_local_file(servers, media, tmp_path, suffix):
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1" if suffix == ".mkv" else None)}
    with Client(cloud=url, edge=url) as client:
        client.interpolate_clip("cloud:sine.mp4", tmp_path / f"remote{suffix}", **run)
        client.interpolate_clip(media / "sine.mp4", tmp_path / f"local{suffix}", **run)
    remote, local = audio_of(tmp_path / f"remote{suffix}"), audio_of(tmp_path / f"local{suffix}")
    source = audio_of(media / "sine.mp4")
    assert [p[0] for p in remote[1]] == [p[0] for p in local[1]] == [p[0] for p in source[1]]  # copied, not re-encoded
    assert remote[0][:3] == local[0][:3] == source[0][:3]
    if suffix == ".mp4":  # the same file as a local run makes
        assert remote == local
    else:  # Matroska: the copy declares the AAC priming (CodecDelay) where a local copy shifts every stream by it
        video = frames_and_times(tmp_path / f"remote{suffix}")
        assert all(np.array_equal(f, g) for (_, f), (_, g) in zip(video, frames_and_times(tmp_path / f"local{suffix}")))
        assert [t for t, _ in video] == [20 * k for k in range(len(video))]  # ms: on the source's clock, at 50 fps
        assert all(abs(p[1] - q[1]) <= Fraction(1, 1000) for p, q in zip(remote[1], source[1]))  # Matroska's ms


@pytest.mark.serving
@pytest.mark.parametrize("name, suffix, made", [("sine.mp4", ".webm", "opus"), ("mp3.mp4", ".webm", "opus"), ("sine.mp4", ".ivf", None),
                                               ("flac.mkv", ".mov", "aac"), ("pcm.mkv", ".mp4", "aac"), ("pcm.mkv", ".ts", "mp2")])
def test_a_cloud_sources_audio_the_output_cannot_hold_is_re_encoded_as_from_a_local_file(servers, media, tmp_path, name, suffix, made):
    """As a local file's is: AAC and MP3 into WebM become Opus, packet for packet; IVF leaves it out.
    Before, refused ("cannot hold the source's aac audio as it is"). FLAC into MOV and PCM into MP4
    or MPEG-TS, which the container lists, are tried on a scratch muxer as a local file's: before,
    "cannot write ... Invalid argument" (MOV's header, MP4's end) or PCM written as MPEG-TS data."""
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False}
    with Client(cloud=url, edge=url) as client:
        for src, dst in ((f"cloud:{name}", "remote"), (media / name, "local")):
            with pytest.warns(UserWarning, match="cannot hold the input's (aac|mp3float|flac|pcm_s16le) audio "
                                                 "(as it is: it is re-encoded|.stream 1.; it is left out)"):
                client.interpolate_clip(src, tmp_path / f"{dst}{suffix}", **run)
    remote, local = tmp_path / f"remote{suffix}", tmp_path / f"local{suffix}"
    if suffix == ".ivf":
        assert stream_types(remote) == stream_types(local) == ["video"]
    else:
        assert audio_of(remote) == audio_of(local) and audio_of(remote)[0][0] == made
        assert audio_end(remote) >= audio_end(media / name) - Fraction(1, 1000)


@pytest.mark.serving
@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_a_cloud_sources_title_chapters_and_tags_are_kept_as_from_a_local_file(servers, media, tmp_path, suffix):
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False}
    with Client(cloud=url, edge=url) as client:
        client.interpolate_clip("cloud:labelled.mkv", tmp_path / f"remote{suffix}", **run)
        client.interpolate_clip(media / "labelled.mkv", tmp_path / f"local{suffix}", **run)
    remote, local = labels_of(tmp_path / f"remote{suffix}"), labels_of(tmp_path / f"local{suffix}")
    assert remote == local and remote[0]["title"] == "A film" and [c[2] for c in remote[2]] == ["One", "Two"]
    assert remote[1].get("language") == "fra"


@pytest.mark.serving
@pytest.mark.parametrize("name, named", [("dolby.mkv", "Dolby Vision (profile 8)"), ("hdr10plus.mkv", "HDR10+")])
def test_a_cloud_sources_dynamic_hdr_is_said_to_be_left_out_as_a_local_files(servers, media, tmp_path, name, named):
    """Before, a cloud source's output dropped it with no word: the probe did not say it was there."""
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    said = {}
    with Client(cloud=url, edge=url) as client:
        for where, src in [("remote", f"cloud:{name}"), ("local", media / name)]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                client.interpolate_clip(src, tmp_path / f"{where}.mkv", **run)
            said[where] = [str(w.message) for w in caught if "dynamic HDR metadata" in str(w.message)]
    assert said["remote"] == said["local"] and len(said["remote"]) == 1
    assert named in said["remote"][0] and "left out" in said["remote"][0]


def audio_header(path) -> bytes:
    with av.open(str(path)) as container:
        return bytes(container.streams.audio[0].codec_context.extradata or b"")


@pytest.mark.serving
@pytest.mark.parametrize("name, suffix, codec", [("opus.mkv", ".mkv", "opus"), ("opus.mkv", ".mp4", "opus"),
                                                 ("mp3.mp4", ".mp4", "mp3float")])
def test_a_cloud_sources_audio_of_other_codecs_is_copied_with_its_own_header(servers, media, tmp_path, name, suffix, codec):
    """Opus, whose encoder takes no planar samples (its decoder's), with its header (the pre-skip) the
    source's, not an encoder's; MP3, whose decoder (mp3float, as the cloud names the stream) is no
    encoder's name."""
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1" if suffix == ".mkv" else None)}
    with Client(cloud=url, edge=url) as client:
        client.interpolate_clip(f"cloud:{name}", tmp_path / f"remote{suffix}", **run)
        client.interpolate_clip(media / name, tmp_path / f"local{suffix}", **run)
    remote, local, source = (audio_of(p) for p in (tmp_path / f"remote{suffix}", tmp_path / f"local{suffix}", media / name))
    assert [p[0] for p in remote[1]] == [p[0] for p in local[1]] == [p[0] for p in source[1]]
    assert remote[0][:3] == local[0][:3] == source[0][:3] and source[0][:2] == (codec, 48000)
    assert audio_header(tmp_path / f"remote{suffix}") == audio_header(media / name)
    video, alike = frames_and_times(tmp_path / f"remote{suffix}"), frames_and_times(tmp_path / f"local{suffix}")
    assert len(video) == len(alike) == 19
    if suffix == ".mkv":  # lossless: x264's own output varies from run to run
        assert all(np.array_equal(f, g) for (_, f), (_, g) in zip(video, alike))


@pytest.mark.serving
@pytest.mark.parametrize("suffix, codec", [(".mkv", "subrip"), (".mp4", "mov_text")])
def test_a_cloud_sources_subtitles_are_copied_with_their_language(servers, media, tmp_path, suffix, codec):
    """SRT into MP4 is converted to mov_text, as a local file's is; before, left out with a warning."""
    url = servers.inference_url
    with Client(cloud=url, edge=url) as client, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MP4's: the SRT converted
        client.interpolate_clip("cloud:subtitled.mkv", tmp_path / f"remote{suffix}", chunk=4, inflight=1, progress=False)
        client.interpolate_clip(media / "subtitled.mkv", tmp_path / f"local{suffix}", chunk=4, inflight=1, progress=False)

    def subtitles(path):
        with av.open(str(path)) as container:
            stream = container.streams.subtitles[0]
            assert stream.codec_context.codec.canonical_name == codec
            return stream.metadata.get("language"), [(bytes(p), p.pts, p.duration) for p in container.demux(stream)
                                                     if p.size and bytes(p).strip(b"\0")]  # not MP4's empty fillers

    assert subtitles(tmp_path / f"remote{suffix}") == subtitles(tmp_path / f"local{suffix}")
    assert subtitles(tmp_path / f"remote{suffix}")[0] == "fra" and len(subtitles(tmp_path / f"remote{suffix}")[1]) == 2


@pytest.mark.serving
@pytest.mark.parametrize("codec, options", [(BITSTREAM_CODEC, {}), ("auto", {}), (BITSTREAM_CODEC, {"factor": 4}),
                                            (BITSTREAM_CODEC, {"fps": Fraction(60)})])
def test_a_bitstream_cloud_source_equals_the_frames_codec(servers, tmp_path, codec, options):
    """A retimed run's later levels are uploaded (their frames are middles): they go with the frames
    codec from the start, not refused as bitstream chunks first, each with a warning."""
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1"), **options}
    with warnings.catch_warnings(record=True) as caught, Client(cloud=url, edge=url, codec=codec) as client:
        warnings.simplefilter("always")
        bits = client.interpolate_clip("cloud:gops.mp4", tmp_path / "bits.mkv", **run)
    with Client(cloud=url, edge=url, codec=wire.FRAMES_CODEC) as client:
        frames = client.interpolate_clip("cloud:gops.mp4", tmp_path / "frames.mkv", **run)
    assert not [w for w in caught if "instead" in str(w.message)]
    assert same_video(tmp_path / "bits.mkv", tmp_path / "frames.mkv")
    assert bits.pairs == frames.pairs >= 23 and bits.received_bytes < frames.received_bytes


@pytest.mark.serving
def test_a_matroska_cloud_source_with_b_frames_goes_as_packets_past_its_first_gop(servers, tmp_path):
    """Matroska stores no dts: after the cloud's seek to a chunk's key frame FFmpeg had none for its
    first packets, where the client's pages (read from the start) had them, so every chunk past the
    first GOP fell back to the frames codec, a warning each."""
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    with warnings.catch_warnings(record=True) as caught, Client(cloud=url, edge=url, codec=BITSTREAM_CODEC) as client:
        warnings.simplefilter("always")
        bits = client.interpolate_clip("cloud:gops.mkv", tmp_path / "bits.mkv", **run)
    with Client(cloud=url, edge=url, codec=wire.FRAMES_CODEC) as client:
        frames = client.interpolate_clip("cloud:gops.mkv", tmp_path / "frames.mkv", **run)
    assert not [str(w.message) for w in caught if "instead" in str(w.message)]
    assert same_video(tmp_path / "bits.mkv", tmp_path / "frames.mkv")
    assert bits.pairs == frames.pairs == 15 and bits.received_bytes < frames.received_bytes


@pytest.mark.serving
def test_a_local_file_asked_for_the_bitstream_codec_goes_with_the_frames_codec(servers, media, tmp_path):
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    with warnings.catch_warnings(record=True) as caught, Client(cloud=url, edge=url, codec=BITSTREAM_CODEC) as client:
        warnings.simplefilter("always")
        client.interpolate_clip(media / "gops.mp4", tmp_path / "bits.mkv", **run)
    with Client(cloud=url, edge=url, codec=wire.FRAMES_CODEC) as client:
        client.interpolate_clip(media / "gops.mp4", tmp_path / "frames.mkv", **run)
    assert not [w for w in caught if "instead" in str(w.message)]
    assert same_video(tmp_path / "bits.mkv", tmp_path / "frames.mkv")


@pytest.mark.serving
def test_a_digest_mismatch_falls_back_to_the_frames_codec_for_that_chunk(servers, tmp_path, monkeypatch):
    complete, config, lied = BitstreamKind.complete, preset("tiny"), []

    def lying(self, elided, held):  # as an edge whose decoder gives other pixels would see it: one frame's digest differs
        chunk = wire.decode(complete(self, elided, held), config)
        if not lied:
            chunk.digests[-1] = "f" * len(chunk.digests[-1])
            lied.append(chunk.frames)
        return wire.encode(chunk, config, BITSTREAM_CODEC)

    monkeypatch.setattr(BitstreamKind, "complete", lying)
    url = servers.inference_url
    run = {"chunk": 4, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    with pytest.warns(UserWarning) as caught, Client(cloud=url, edge=url, codec=BITSTREAM_CODEC) as client:
        client.interpolate_clip("cloud:gops.mp4", tmp_path / "bits.mkv", **run)
    monkeypatch.undo()
    with Client(cloud=url, edge=url, codec=wire.FRAMES_CODEC) as client:
        client.interpolate_clip("cloud:gops.mp4", tmp_path / "frames.mkv", **run)
    fallbacks = [str(w.message) for w in caught if "instead" in str(w.message)]
    assert len(fallbacks) == 1 and "\n" not in fallbacks[0] and "other pixels than on the cloud" in fallbacks[0], fallbacks
    assert same_video(tmp_path / "bits.mkv", tmp_path / "frames.mkv")


@pytest.mark.serving
@pytest.mark.parametrize("name", ["vfr.mkv", "sine.mp4"])
def test_auto_on_other_cloud_sources_gives_the_frames_codecs_output(servers, tmp_path, name):
    url = servers.inference_url
    run = {"chunk": 3, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    with Client(cloud=url, edge=url, codec="auto") as client:
        client.interpolate_clip(f"cloud:{name}", tmp_path / "auto.mkv", **run)
    with Client(cloud=url, edge=url, codec=wire.FRAMES_CODEC) as client:
        client.interpolate_clip(f"cloud:{name}", tmp_path / "frames.mkv", **run)
    assert same_video(tmp_path / "auto.mkv", tmp_path / "frames.mkv")


@pytest.mark.serving
def test_a_source_the_cloud_cannot_send_as_packets_is_told_once(servers, tmp_path):
    """A 400 (a decoder the codec does not allow, untimed packets) is the source's, not a chunk's:
    its later chunks go with the frames codec from the start."""
    url = servers.inference_url
    run = {"chunk": 3, "inflight": 1, "progress": False, "encoding": Encoding("ffv1")}
    with pytest.warns(UserWarning) as caught, Client(cloud=url, edge=url, codec=BITSTREAM_CODEC) as client:
        client.interpolate_clip("cloud:mpeg4.mp4", tmp_path / "bits.mkv", **run)
    with Client(cloud=url, edge=url, codec=wire.FRAMES_CODEC) as client:
        frames = client.interpolate_clip("cloud:mpeg4.mp4", tmp_path / "frames.mkv", **run)
    fallbacks = [str(w.message) for w in caught if "instead" in str(w.message)]
    assert len(fallbacks) == 1 and "later chunks" in fallbacks[0], fallbacks
    assert frames.pairs >= 9 and same_video(tmp_path / "bits.mkv", tmp_path / "frames.mkv")


@pytest.mark.serving
def test_a_cloud_source_over_grpc_equals_it_over_http(servers, tmp_path, capsys):
    """The probe, the pages of packets (audio's too) and the bitstream chunks over TorchServe's gRPC
    API: the same output file as over HTTP; a refusal is the same one line and exit 2."""
    urls = {"http": servers.inference_url, "grpc": servers.grpc_url}
    summaries = {}
    for transport, url in urls.items():
        with Client(cloud=url, edge=url, transport=transport, codec="auto") as client:
            summaries[transport] = client.interpolate_clip("cloud:sine.mp4", tmp_path / f"{transport}.mp4", chunk=4,
                                                           inflight=1, progress=False, encoding=Encoding("ffv1"))
    assert summaries["grpc"].pairs == summaries["http"].pairs == 11
    assert summaries["grpc"].payload_bytes == summaries["http"].payload_bytes
    assert same_video(tmp_path / "grpc.mp4", tmp_path / "http.mp4")
    assert audio_of(tmp_path / "grpc.mp4") == audio_of(tmp_path / "http.mp4")
    capsys.readouterr()
    bad = tmp_path / "bad.mp4"
    assert main(["client", "cloud:../sine.mp4", "-o", str(bad), "--cloud", urls["grpc"], "--edge", urls["grpc"],
                 "--transport", "grpc"]) == 2
    error = capsys.readouterr().err
    assert "leaves the media root" in error and urls["grpc"] in error and error.count("\n") == 1
    assert not bad.exists()


@pytest.mark.serving
def test_a_cloud_source_through_the_workflow_is_refused_in_one_line(servers, tmp_path, capsys):
    out = tmp_path / "out.mp4"
    assert main(["client", "cloud:gops.mp4", "-o", str(out), "--server", servers.inference_url]) == 2
    error = capsys.readouterr().err
    assert "--server over --transport grpc" in error and error.count("\n") == 1 and not out.exists()

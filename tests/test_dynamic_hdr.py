"""eden_serve.media.containers.dynamic_hdr: an input's dynamic HDR metadata (HDR10+'s SEI, a Dolby
Vision configuration record) is named, and the output, which cannot keep it honestly (the middles
have none), says in one line that it leaves it out. The inputs are an x265 HDR10 clip made here,
given each kind with PyAV alone: HDR10+ as an SEI NAL unit before each picture, Dolby Vision as the
configuration record FFmpeg's Matroska demuxer reads from a track's BlockAdditionMapping."""

from __future__ import annotations

import io
import warnings

import pytest

from eden_serve.clips.processors import pairwise
from eden_serve.cloud.sources import SourceVideo
from eden_serve.clips.streaming import interpolate_clip
from eden_serve.media import Encoding, inband
from eden_serve.media.colour import LIMITED, Colour
from eden_serve.media.encoding import side_data
from eden_serve.media.frames import to_pixels
from eden_serve.media.mastering import _element, _uint
from eden_serve.media.video import VideoClip
from harness.videos import make_graded_clip

av = pytest.importorskip("av")

SIZE = (48, 64)
HDR10 = Colour(9, 16, 9, LIMITED)


def blend(index, frame0, frame1, seed):
    return to_pixels((frame0.tensor + frame1.tensor) / 2, frame0.depth)


class _Writer:
    """Bits written most significant first."""

    def __init__(self):
        self.bits = []

    def u(self, n: int, value: int) -> _Writer:
        self.bits += [value >> (n - 1 - i) & 1 for i in range(n)]
        return self

    def bytes(self) -> bytes:
        padded = self.bits + [0] * (-len(self.bits) % 8)
        return bytes(int("".join(map(str, padded[i:i + 8])), 2) for i in range(0, len(padded), 8))


def _escaped(rbsp: bytes) -> bytes:
    """An RBSP with emulation prevention bytes, as a NAL unit carries it."""
    out, zeros = bytearray(), 0
    for byte in rbsp:
        if zeros >= 2 and byte <= 3:
            out.append(3)
            zeros = 0
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


def hdr10_plus_t35() -> bytes:
    """HDR10+'s metadata as ITU-T T.35 data (SMPTE ST 2094-40 application 4), from its country code on:
    one window, a 1000 cd/m² target display, its brightest components, one percentile, no curve."""
    payload = _Writer().u(8, 0xB5).u(16, 0x003C).u(16, 0x0001).u(8, 4).u(8, 1)  # USA, Samsung, HDR10+, version 1
    payload.u(2, 1).u(27, 1000).u(1, 0)  # one window; the targeted display's peak; no actual peak luminance
    for value in (4000, 3000, 2000, 1500):  # maxscl of R, G and B, average maxRGB (in 0.00001 units of linear light)
        payload.u(17, value)
    payload.u(4, 1).u(7, 50).u(17, 1000).u(10, 0)  # one percentile (50%); fraction of bright pixels
    payload.u(1, 0).u(1, 0).u(1, 0)  # no mastering display peak, no tone mapping curve, no saturation mapping
    return payload.bytes()


def hdr10_plus_sei(header: bytes = b"\x4e\x01", before: bytes = b"") -> bytes:
    """A prefix SEI NAL unit of HDR10+'s message: HEVC's ``header`` by default (nal_unit_type 39,
    layer 0, temporal id 0), H.264's b"\\x06" (nal_unit_type 6); ``before`` (SEI messages) ahead of it."""
    data = hdr10_plus_t35()
    sei = before + bytes([4, len(data)]) + data + b"\x80"  # user_data_registered_itu_t_t35, its size, the payload, the RBSP's stop bit
    return header + _escaped(sei)


def remuxed(src, dst, template=None, before: bytes = b"", edit=None):
    """``src``'s video packets into ``dst`` (Matroska), the stream made from ``template`` (a Matroska
    header's) where given, else from ``src``'s; ``before`` (length-prefixed NAL units) put in front of
    each, or each made ``edit(packet)``."""
    with av.open(str(src)) as source, av.open(str(dst), "w") as output:
        stream = source.streams.video[0]
        with av.open(io.BytesIO(template), format="matroska") if template else source as made:
            written = output.add_stream_from_template(made.streams.video[0], opaque=True)
            written.time_base = stream.time_base
            for packet in source.demux(stream):
                if not packet.size:
                    continue
                data = edit(bytes(packet)) if edit else before + bytes(packet)
                copy = av.Packet(len(data))
                memoryview(copy)[:] = data
                copy.pts, copy.dts, copy.time_base, copy.is_keyframe = packet.pts, packet.dts, packet.time_base, packet.is_keyframe
                copy.stream = written
                output.mux(copy)
    return dst


def with_dolby_vision(src, dst, profile: int = 8, size: tuple[int, int] = SIZE):
    """``src`` (HEVC) with a Dolby Vision configuration record of ``profile`` (level 6, an RPU, a base
    layer compatible with HDR10: compatibility id 1), but no RPU: what the container states."""
    with av.open(str(src)) as source:
        extradata = bytes(source.streams.video[0].codec_context.extradata)
    record = bytes([1, 0, profile << 1, 6 << 3 | 0b101, 1 << 4]) + bytes(19)  # version 1.0, profile, level, rpu, no el, bl
    kind = b"dvcC" if profile <= 7 else b"dvvC"
    mapping = _element(0x41E4, _uint(0x41F0, 1) + _uint(0x41E7, int.from_bytes(kind, "big")) + _element(0x41ED, record))
    video = _uint(0xB0, size[1]) + _uint(0xBA, size[0])
    track = (_uint(0xD7, 1) + _uint(0x73C5, 1) + _uint(0x83, 1) + _element(0x86, b"V_MPEGH/ISO/HEVC")
             + _element(0x63A2, extradata) + _element(0xE0, video) + mapping)
    header = _element(0x1A45DFA3, _element(0x4282, b"matroska") + _uint(0x4287, 4) + _uint(0x4285, 2))
    segment = _element(0x1549A966, _uint(0x2AD7B1, 1000000)) + _element(0x1654AE6B, _element(0xAE, track))
    return remuxed(src, dst, header + _element(0x18538067, segment + _element(0x1F43B675, _uint(0xE7, 0))))


def with_hdr10_plus(src, dst):
    sei = hdr10_plus_sei()
    return remuxed(src, dst, before=len(sei).to_bytes(4, "big") + sei)  # x265's hvcC: 4-byte lengths


def interpolated(src, out) -> list[str]:
    """The lines said while ``src`` is interpolated into ``out``, of dynamic metadata."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpolate_clip(src, out, pairwise(blend), progress=False, encoding=Encoding("ffv1"))
    return [str(w.message) for w in caught if "dynamic HDR metadata" in str(w.message)]


@pytest.fixture
def hdr10(tmp_path):
    return make_graded_clip(tmp_path / "hdr10.mkv", "libx265", "yuv420p10le", SIZE, 3, HDR10)


def test_dolby_visions_configuration_is_named_and_said_to_be_left_out(tmp_path, hdr10):
    src = with_dolby_vision(hdr10, tmp_path / "dv.mkv")
    clip = VideoClip(src)
    clip.container.close()
    assert clip.dynamic_hdr == ("Dolby Vision (profile 8)",)
    said = interpolated(src, tmp_path / "out.mkv")
    assert len(said) == 1 and "Dolby Vision (profile 8)" in said[0] and "left out" in said[0]
    data = (tmp_path / "out.mkv").read_bytes()  # no record its pictures would not match
    assert b"dvvC" not in data and b"dvcC" not in data


def test_dolby_vision_is_named_on_a_stream_not_tagged_hdr(tmp_path):
    """Profile 8.2's base layer is SDR, profile 5's tags need not say PQ: the record is read all the same."""
    sdr = make_graded_clip(tmp_path / "sdr.mkv", "libx265", "yuv420p", SIZE, 3, Colour(1, 1, 1, LIMITED))
    src = with_dolby_vision(sdr, tmp_path / "dv.mkv")
    said = interpolated(src, tmp_path / "out.mkv")
    assert len(said) == 1 and "Dolby Vision (profile 8)" in said[0]


def test_hdr10_plus_is_named_and_said_to_be_left_out(tmp_path, hdr10):
    src = with_hdr10_plus(hdr10, tmp_path / "hdr10plus.mkv")
    with av.open(str(src)) as container:  # FFmpeg's decoder reads the SEI as HDR10+'s metadata
        assert "DYNAMIC_HDR_PLUS" in {d.type.name for d in side_data(next(container.decode(video=0)))}
    said = interpolated(src, tmp_path / "out.mkv")
    assert len(said) == 1 and "HDR10+" in said[0] and "left out" in said[0]
    with av.open(str(tmp_path / "out.mkv")) as output:
        assert all("DYNAMIC_HDR_PLUS" not in {d.type.name for d in side_data(frame)} for frame in output.decode(video=0))


def test_static_hdr10_alone_is_not_said_to_lose_anything(tmp_path, hdr10):
    assert interpolated(hdr10, tmp_path / "out.mkv") == []


def rpu_nal() -> bytes:
    """A NAL unit as HEVC carries Dolby Vision's RPU: the header 0x7C 0x01 (forbidden_zero_bit 0,
    nal_unit_type 62 in the next six bits, nuh_layer_id 0 across the byte boundary, then
    nuh_temporal_id_plus1 1), the RPU's prefix byte 0x19, then bytes that are no RPU (FFmpeg's
    decoder says it cannot parse them and decodes on) and the RBSP's stop bit. No zero bytes, so
    nothing to escape."""
    return bytes([62 << 1, 0 << 3 | 1, 0x19]) + bytes(range(1, 24)) + b"\x80"


def with_in_band_rpus(src, dst):
    """``src`` (HEVC) as a raw Annex B stream (``.hevc``) or MPEG-TS (``.ts``), an RPU's NAL unit
    last in each access unit, where Dolby Vision puts it and FFmpeg's decoder looks for it; no
    container states a configuration record."""
    raw, times = dst.with_suffix(".raw.hevc"), []
    with av.open(str(src)) as source, av.open(str(raw), "w", format="hevc") as output:
        stream = output.add_stream_from_template(source.streams.video[0])
        for packet in source.demux(video=0):
            if packet.size:
                times.append((packet.pts, packet.dts, packet.time_base))  # which the raw stream loses
                packet.stream = stream
                output.mux(packet)  # FFmpeg's hevc_mp4toannexb filter: start codes, parameter sets in band
    spliced = bytearray()
    with av.open(str(raw)) as source:  # the parser's access units, each with the RPU after its slices
        for packet in source.demux(video=0):
            if packet.size:
                spliced += bytes(packet) + b"\x00\x00\x01" + rpu_nal()
    if dst.suffix == ".hevc":
        dst.write_bytes(spliced)
        return dst
    raw.write_bytes(spliced)
    with av.open(str(raw)) as source, av.open(str(dst), "w", format="mpegts") as output:
        stream = output.add_stream_from_template(source.streams.video[0])
        for packet, (pts, dts, time_base) in zip((p for p in source.demux(video=0) if p.size), times, strict=True):
            packet.stream, packet.pts, packet.dts, packet.time_base = stream, pts, dts, time_base
            output.mux(packet)
    return dst


@pytest.mark.parametrize("suffix", [".hevc", ".ts"])
@pytest.mark.parametrize("colour", [HDR10, Colour()], ids=["hdr10", "untagged"])
def test_dolby_vision_rpus_in_band_alone_are_named_and_said_to_be_left_out(tmp_path, suffix, colour):
    """Profile 8.1's base layer is tagged HDR10, so its first frame was decoded, where FFmpeg's decoder
    hands the RPU on; profile 5's states no colour (its pictures are in Dolby's own colour space), so
    no frame was decoded and the RPUs went unnoticed: the first packets show them whatever the tags."""
    plain = make_graded_clip(tmp_path / "plain.mkv", "libx265", "yuv420p10le", SIZE, 3, colour)
    src = with_in_band_rpus(plain, tmp_path / f"dv{suffix}")
    assert src.read_bytes().count(b"\x00\x00\x01\x7c\x01\x19") >= 3  # each picture's RPU
    with av.open(str(src)) as container:  # FFmpeg decodes every picture all the same
        assert len(list(container.decode(video=0))) == 3
    clip = VideoClip(src)
    clip.container.close()
    assert clip.dynamic_hdr == ("Dolby Vision",)
    said = interpolated(src, tmp_path / "out.mkv")
    assert len(said) == 1 and "Dolby Vision" in said[0] and "left out" in said[0]


def test_a_nal_unit_of_type_62_not_an_rpu_is_not_named(tmp_path, hdr10):
    """Layer 1 (nuh_layer_id in the header's middle bits): not where Dolby Vision's RPU goes."""
    unit = bytearray(rpu_nal())
    unit[1] |= 1 << 3
    assert not inband.is_rpu(bytes(unit)) and inband.is_rpu(rpu_nal())
    assert inband.in_band("hevc", b"\x00\x00\x01" + bytes(unit)) == ()
    assert inband.in_band("hevc", b"\x00\x00\x00\x01" + rpu_nal()) == ("Dolby Vision",)
    assert inband.in_band("h264", b"\x00\x00\x01" + rpu_nal()) == ()
    with av.open(str(hdr10)) as container:  # Matroska's: an hvcC record, 4-byte lengths before each unit
        hvcc = bytes(container.streams.video[0].codec_context.extradata)
        packet = bytes(next(p for p in container.demux(video=0) if p.size))
    assert inband.in_band("hevc", packet, hvcc) == ()
    assert inband.in_band("hevc", packet + len(rpu_nal()).to_bytes(4, "big") + rpu_nal(), hvcc) == ("Dolby Vision",)
    assert inband.in_band("hevc", packet + (99).to_bytes(4, "big") + rpu_nal(), hvcc) == ()  # a length past the end


def av1_metadata_obu(provider: bytes) -> bytes:
    """An AV1 metadata OBU of ITU-T T.35 data: the header byte (obu_type 5 in bits 6..3, no
    extension, obu_has_size_field), its size (LEB128), metadata_type 4 (ITU-T T.35), the country
    0xB5, ``provider`` (terminal provider code and provider oriented code), a few bytes, the stop bit."""
    payload = bytes([4, 0xB5]) + provider + bytes(range(1, 9)) + b"\x80"
    return bytes([5 << 3 | 1 << 1, len(payload)]) + payload


def test_dolby_vision_rpus_in_av1_metadata_are_named(tmp_path):
    """Dolby's T.35 data (provider 0x003B, code 0x00000800) among a real AV1 packet's OBUs (Matroska's:
    no temporal delimiter), before or after the sequence header; HDR10+'s (Samsung's, 0x003C 0x0001,
    application 4) is not Dolby Vision."""
    av1 = make_graded_clip(tmp_path / "av1.mkv", "libsvtav1", "yuv420p10le", SIZE, 1, HDR10)
    with av.open(str(av1)) as container:
        packet = bytes(next(p for p in container.demux(video=0) if p.size))
    obus = list(inband.av1_obus(packet))
    assert [kind for kind, _ in obus][:1] == [1] and 6 in {kind for kind, _ in obus}  # sequence header, ..., frame
    assert inband.in_band("av1", packet) == ()
    dolby, samsung = av1_metadata_obu(bytes([0, 0x3B, 0, 0, 8, 0])), av1_metadata_obu(bytes([0, 0x3C, 0, 1, 4]))
    header = 2 + len(obus[0][1])  # the sequence header OBU: its header byte, a 1-byte size, its payload
    assert inband.in_band("av1", dolby + packet) == ("Dolby Vision",)
    assert inband.in_band("av1", packet[:header] + dolby + packet[header:]) == ("Dolby Vision",)
    assert inband.in_band("av1", packet[:header] + samsung + packet[header:]) == ("HDR10+",)
    assert inband.in_band("av1", packet[:header] + dolby[:5]) == ()  # cut short: no OBU read past the packet


def with_av1_metadata(src, dst, obu: bytes):
    """``src`` (AV1) with ``obu`` in each packet: after the sequence header where one leads it, as
    AV1 orders a temporal unit's OBUs, else first."""
    def edit(packet: bytes) -> bytes:
        kind, payload = next(inband.av1_obus(packet))
        at = 2 + len(payload) if kind == 1 else 0  # SVT-AV1's sequence header: its header byte, a 1-byte size
        return packet[:at] + obu + packet[at:]
    return remuxed(src, dst, edit=edit)


def hdr10_plus_obu() -> bytes:
    """An AV1 metadata OBU of HDR10+'s metadata: metadata_type 4 (ITU-T T.35), the T.35 data, the trailing bits."""
    payload = bytes([4]) + hdr10_plus_t35() + b"\x80"
    return bytes([5 << 3 | 1 << 1, len(payload)]) + payload


@pytest.mark.parametrize("codec, pix_fmt, colour", [
    ("libx265", "yuv420p10le", Colour()), ("libx264", "yuv420p", HDR10), ("libx264", "yuv420p", Colour()),
    ("libsvtav1", "yuv420p10le", Colour())], ids=["hevc-untagged", "h264-hdr10", "h264-untagged", "av1-untagged"])
def test_hdr10_plus_in_band_is_named_whatever_the_tags_and_the_codec(tmp_path, codec, pix_fmt, colour):
    """HEVC's and AV1's HDR10+ on a stream whose tags do not say HDR: its first frame was not decoded,
    so its side data went unread; H.264's SEI FFmpeg's decoder never hands on as side data at all.
    The first packets show it, locally and in the cloud's probe, and the one line names it."""
    plain = make_graded_clip(tmp_path / "plain.mkv", codec, pix_fmt, SIZE, 3, colour)
    if codec == "libsvtav1":
        src = with_av1_metadata(plain, tmp_path / "plus.mkv", hdr10_plus_obu())
    else:
        sei = hdr10_plus_sei(b"\x4e\x01" if codec == "libx265" else b"\x06")
        src = remuxed(plain, tmp_path / "plus.mkv", before=len(sei).to_bytes(4, "big") + sei)  # 4-byte lengths, x264's and x265's
    clip = VideoClip(src)
    clip.container.close()
    assert clip.dynamic_hdr == ("HDR10+",)
    assert SourceVideo(src, 10**7).probe()["dynamic_hdr"] == ["HDR10+"]
    said = interpolated(src, tmp_path / "out.mkv")
    assert len(said) == 1 and "HDR10+" in said[0] and "left out" in said[0]


def test_dolby_vision_rpus_in_an_av1_file_are_named(tmp_path):
    """Through the file, whose AV1 stream's decoder is libdav1d: the codec's name is asked, not the decoder's."""
    plain = make_graded_clip(tmp_path / "plain.mkv", "libsvtav1", "yuv420p10le", SIZE, 2, HDR10)
    src = with_av1_metadata(plain, tmp_path / "dv.mkv", av1_metadata_obu(bytes([0, 0x3B, 0, 0, 8, 0])))
    clip = VideoClip(src)
    clip.container.close()
    assert clip.dynamic_hdr == ("Dolby Vision",)
    assert SourceVideo(src, 10**7).probe()["dynamic_hdr"] == ["Dolby Vision"]


def test_hdr10_plus_sei_is_told_from_other_t35_data_and_read_within_its_unit():
    """HDR10+'s T.35 header whole (country, Samsung, its code, application 4), in a prefix SEI of HEVC
    or H.264, wherever among the unit's messages; the bytes unescaped before the message sizes count."""
    hevc, h264 = hdr10_plus_sei(), hdr10_plus_sei(b"\x06")
    assert inband.in_band("hevc", b"\x00\x00\x01" + hevc) == ("HDR10+",)
    assert inband.in_band("h264", b"\x00\x00\x00\x01" + h264) == ("HDR10+",)
    assert inband.in_band("hevc", b"\x00\x00\x01" + rpu_nal() + b"\x00\x00\x01" + hevc) == ("Dolby Vision", "HDR10+")
    assert inband.in_band("hevc", b"\x00\x00\x01" + h264) == () and inband.in_band("h264", b"\x00\x00\x01" + hevc) == ()
    assert inband.in_band("vp9", b"\x00\x00\x01" + hevc) == ()
    suffix = bytes([40 << 1, 1]) + hevc[2:]  # a suffix SEI: not where HDR10+ goes
    assert inband.in_band("hevc", b"\x00\x00\x01" + suffix) == ()
    unregistered = bytes([5, 20]) + bytes(20)  # user_data_unregistered: a UUID of zeros, escaped where it is carried
    behind = hdr10_plus_sei(before=unregistered)
    assert b"\x00\x00\x03" in behind and inband.in_band("hevc", b"\x00\x00\x01" + behind) == ("HDR10+",)
    t35 = hdr10_plus_t35()
    for other in (t35[:2] + b"\x31" + t35[3:],  # ATSC's provider (captions, A/53)
                  t35[:4] + b"\x02" + t35[5:],  # another of Samsung's codes
                  t35[:5] + b"\x05" + t35[6:]):  # application 5
        unit = b"\x4e\x01" + _escaped(bytes([4, len(other)]) + other + b"\x80")
        assert inband.in_band("hevc", b"\x00\x00\x01" + unit) == ()
    cut = bytes([4, len(t35) + 9]) + t35  # a size past the unit's end
    assert inband.in_band("hevc", b"\x00\x00\x01\x4e\x01" + _escaped(cut)) == ()
    obu = hdr10_plus_obu()
    assert inband.in_band("av1", obu) == ("HDR10+",) and inband.in_band("av1", obu[:6]) == ()

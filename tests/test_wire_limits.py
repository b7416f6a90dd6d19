"""wire.decode's memory against payloads near the edge's limits: refused from the header before
decoding, and decoded without copying the payload."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from eden_serve import wire
from eden_serve.config import preset
from eden_serve.errors import PayloadTooLargeError
from eden_serve.media.frames import DEFAULT_MAX_PIXELS
from eden_serve.model import synthetic
from eden_serve.serving.worker import max_tokens_for

def payload_for(size: tuple[int, int], codec: str = wire.DEFAULT_CODEC, config_name: str = "tiny") -> bytes:
    config = preset(config_name)
    return wire.encode(synthetic.chunk(config, size), config, codec)


def test_a_payload_just_over_the_pixel_limit_is_refused_before_decoding():
    """3841x2160 is one column over 4K UHD, yet within the token cap that 4K implies (the cap allows
    for padding and aspect ratio), so only the frame size in the header can refuse it early."""
    config = preset("tiny")
    payload = payload_for((2160, 3841))
    max_tokens = max_tokens_for(DEFAULT_MAX_PIXELS, config)
    assert wire.decode(payload, config, max_tokens=max_tokens).size == (2160, 3841)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLargeError, match="3841"):
            wire.decode(payload, config, max_tokens=max_tokens, max_pixels=DEFAULT_MAX_PIXELS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(payload) // 4, "decompressed or parsed the body before refusing it"


PEAK = textwrap.dedent("""
    import sys, gc
    from pathlib import Path
    from eden_serve import wire
    from eden_serve.config import preset
    from eden_serve.model import synthetic
    payload = Path(sys.argv[1]).read_bytes()
    # A small decode first: the code and allocator pools a first decode touches (more pages with a
    # larger torch build) are not what a payload costs.
    wire.decode(wire.encode(synthetic.chunk(preset("tiny"), (64, 96)), preset("tiny"), "fp32"), preset("tiny"))
    gc.collect()
    def status(key):
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
    start = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
    wire.decode(payload, preset("tiny"))
    print(status("VmHWM") - start)
""")


def test_decode_peaks_at_one_and_a_half_times_the_payload(tmp_path):
    """In a fresh process, with the payload already in memory: the fp32 codec's conditions take
    as much as its payload, so 1.5x leaves half the payload for everything decode holds meanwhile
    (2.0x before format 2: a copy of the payload and one of its body)."""
    path = tmp_path / "payload"
    path.write_bytes(payload_for((2160, 3840), codec="fp32"))
    result = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    growth = int(result.stdout)
    assert growth <= 1.5 * path.stat().st_size, f"decode grew by {growth / path.stat().st_size:.2f}x the payload"

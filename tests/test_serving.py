"""eden_serve.serving and the two handlers in this process, with TorchServe's own Context,
RequestProcessor and metrics cache (no server; tests/test_deployment.py runs the real one)."""

from __future__ import annotations

import gc
import threading
import time
import importlib.util
import io
import json
import types
import weakref
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import ts
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.metrics.metric_type_enum import MetricTypes

from eden_serve import errors, wire
from eden_serve.config import preset
from eden_serve.edge import middles_of
from eden_serve.errors import BadInputError, UpstreamError, error_from_document
from eden_serve.media.frames import DEFAULT_MAX_PIXELS
from eden_serve.model import synthetic
from eden_serve.model.checkpoint import write_halves
from eden_serve.model.synthetic import state_dict as synthetic_state_dict
from eden_serve.serving import fields, worker
from eden_serve.serving.archive import GLUE
from eden_serve.serving.refusals import request_by_request


def handler_class(name: str, class_name: str):
    spec = importlib.util.spec_from_file_location(name, GLUE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, class_name)


def png(height: int, width: int, seed: int = 0) -> bytes:
    array = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model_dir")
    write_halves(synthetic_state_dict(preset("tiny"), 0), directory, preset("tiny"))
    return directory


def context(model_dir, model_name: str, **settings) -> Context:
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))  # TorchServe's default
    metrics.initialize_cache()
    # The handler sets the process's thread count; keep this test process's.
    yaml_config = {"batchSize": 4, "handler": {"threads": torch.get_num_threads(), **settings}}
    ctx = Context(model_name, str(model_dir), {"model": {"modelName": model_name}}, 4, None, "0.12.0",
                  metrics=metrics, model_yaml_config=yaml_config)
    # TorchServe's worker hands its context the socket to the frontend, where a streamed answer's
    # parts go before the handler returns (ts.handler_utils.utils.send_intermediate_predict_response).
    ctx.cl_socket = FrontendSocket()
    return ctx


class FrontendSocket:
    """The worker's socket to the frontend, as a streamed answer uses it: the bytes sent, kept."""

    def __init__(self):
        self.sent: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))


def handle(handler, ctx: Context, batch: list[dict], headers: dict | None = None) -> list[tuple[int, str, bytes]]:
    """What TorchServe's Service.predict does around the handler (a streamed answer's parts go to
    ``ctx.cl_socket``, a :class:`FrontendSocket`); ``headers``:
    every request's HTTP headers."""
    ctx.request_processor = [RequestProcessor(dict(headers or {})) for _ in batch]
    ctx.request_ids = ctx.metrics.request_ids = {i: f"request-{i}" for i in range(len(batch))}
    bodies = handler.handle(batch, ctx)
    return [(ctx.get_response_status(i)[0], ctx.get_response_content_type(i), body) for i, body in enumerate(bodies)]


@pytest.fixture(scope="module")
def encoder(model_dir):
    ctx = context(model_dir, "eden_encoder")
    handler = handler_class("eden_encoder_handler", "EdenEncoderHandler")()
    handler.initialize(ctx)
    return handler, ctx


@pytest.fixture(scope="module")
def edge(model_dir):
    ctx = context(model_dir, "eden_ditdec")
    handler = handler_class("eden_ditdec_handler", "EdenDitDecHandler")()
    handler.initialize(ctx)
    return handler, ctx


def test_a_batch_is_answered_request_by_request(encoder, edge):
    batch = [
        {"frame0": png(64, 96, 1), "frame1": png(64, 96, 2)},
        {"frame0": png(64, 96, 1)},
        {"frame0": png(70, 100, 3), "frame1": png(70, 100, 4), "seed": "5", "codec": "int8"},
    ]
    replies = handle(*encoder, batch)
    assert [(status, content_type) for status, content_type, _ in replies] == [
        (200, fields.OCTET_STREAM), (400, fields.JSON), (200, fields.OCTET_STREAM)
    ]
    assert json.loads(replies[1][2])["type"] == "bad_input"

    payloads = [replies[0][2], replies[1][2], b"EDENWIRE" + bytes(40), bytearray(replies[2][2])]
    results = handle(*edge, [{"body": payloads[0]}, {"body": payloads[1]}, {"data": payloads[2]}, {"body": payloads[3]}])
    assert [(status, content_type) for status, content_type, _ in results] == [
        (200, fields.PNG), (400, fields.JSON), (400, fields.JSON), (200, fields.PNG)
    ]
    assert results[1][2] == payloads[1]  # the encoder's error document, passed on as it was
    assert Image.open(io.BytesIO(results[0][2])).size == (96, 64)
    assert Image.open(io.BytesIO(results[3][2])).size == (100, 70)


def test_a_frame_wider_than_a_payload_can_say_is_refused_before_encoding(encoder):
    wide = png(1, wire.MAX_SIDE + 4464)
    ((status, _, body),) = handle(*encoder, [{"frame0": wide, "frame1": wide}])
    document = json.loads(body)
    assert (status, document["type"]) == (413, "frame_too_large")
    assert document["message"].startswith("frame0 is 70000x1: a side over 65536 pixels")


def test_handlers_emit_their_metrics(encoder, edge):
    payload = handle(*encoder, [{"frame0": png(64, 96), "frame1": png(64, 96, 1)}])[0][2]
    assert handle(*edge, [{"body": payload}])[0][0] == 200
    for ctx, names in ((encoder[1], ["EdenEncodeMs", "EdenPayloadBytes"]), (edge[1], ["EdenPayloadBytes", "EdenDenoiseMs", "EdenDecodeMs"])):
        for name in names:
            assert ctx.metrics.get_metric(name, MetricTypes.GAUGE).dimension_names == ["ModelName", "Level"]


class Body(bytearray):
    """A request body that can be watched (bytes cannot be weakly referenced)."""


def test_a_refused_body_dies_with_its_batch(encoder, edge):
    """No reference cycle keeps a refused request's body (or what was made from it) alive until the
    garbage collector runs: it is freed as soon as the batch is answered."""
    bodies = {"edge": Body(wire.MAGIC + bytes(4096)), "encoder": Body(png(64, 96))}
    watched = {name: weakref.ref(body) for name, body in bodies.items()}
    gc.disable()
    try:
        (edge_reply,) = handle(*edge, [{"body": bodies.pop("edge")}])
        (encoder_reply,) = handle(*encoder, [{"frame0": bodies.pop("encoder"), "frame1": png(32, 32)}])
        assert (edge_reply[0], encoder_reply[0]) == (400, 400)
        assert {name: ref() for name, ref in watched.items()} == {"edge": None, "encoder": None}
    finally:
        gc.enable()


def test_unexpected_failure_is_a_short_500(edge):
    def broken(idx, item):
        raise RuntimeError("secret internals\nTraceback (most recent call last)")

    ctx = edge[1]
    ctx.request_processor = [RequestProcessor({})]
    (body,) = edge[0].service.postprocess(request_by_request(broken, [{}]))
    assert ctx.get_response_status(0)[0] == 500
    assert json.loads(body) == {"code": 500, "type": "internal_error", "message": "internal error (RuntimeError); see the server log"}


def test_settings_from_model_config():
    assert worker.Settings.from_yaml({}) == worker.Settings()
    settings = worker.Settings.from_yaml({"handler": {"max_pixels": 1000, "codec": "fp32", "precision": "bf16", "threads": 3}})
    assert (settings.max_pixels, settings.codec, settings.precision, settings.threads) == (1000, "fp32", "bf16", 3)
    assert worker.Settings().max_batch_tokens == 0  # the edge's default for its device
    for bad in ({"maxpixels": 5}, {"max_pixels": 0}, {"max_pixels": "4K"}, {"precision": "fp16"}, {"threads": -1},
                {"max_batch_tokens": -1}, {"media_root": "media"}, {"media_root": 5}):
        with pytest.raises(ValueError):
            worker.Settings.from_yaml({"handler": bad})
    with pytest.raises(BadInputError):
        worker.Settings.from_yaml({"handler": {"codec": "fp8"}})


@settings(deadline=None)  # Hypothesis's 200 ms an example: a loaded machine stalled one for 300 ms
@given(st.integers(1, 3000), st.floats(1.0, 4.0), st.booleans())
def test_token_cap_admits_every_frame_within_the_pixel_limit(height, ratio, portrait):
    config = preset("official")
    width = max(1, int(height * ratio))
    height, width = (width, height) if portrait else (height, width)
    pixels = height * width
    ph, pw = config.patch_grid(height, width)
    assert ph * pw <= worker.max_tokens_for(pixels, config)


def test_token_cap_is_tight_for_4k():
    config = preset("official")
    cap = worker.max_tokens_for(DEFAULT_MAX_PIXELS, config)
    four_k = 136 * 240
    assert four_k <= cap < 1.03 * four_k


@pytest.mark.parametrize("value, seed", [(None, 0), ("0", 0), (b" 42\n", 42), (7, 7), (str(2**64 - 1), 2**64 - 1), ("0" * 5000 + "12", 12)])
def test_seed(value, seed):
    assert fields.parse_seed(value) == seed


@pytest.mark.parametrize("value", ["", "-1", "+1", "1e3", "0x10", "1 2", "²", "١", str(2**64), 2**64, -1, True, 1.5, [1], b"\xff",
                                   "9" * 4301, "1" + "0" * 5000])
def test_bad_seed(value):
    with pytest.raises(BadInputError):
        fields.parse_seed(value)


def test_upstream_error_documents():
    document = {"code": 413, "type": "frame_too_large", "message": "frame0 is too large"}
    for body in (json.dumps(document).encode(), json.dumps(document, indent=2).encode(), document):
        error = error_from_document(body)
        assert isinstance(error, UpstreamError) and error.to_json() == document
    not_errors = [
        wire.encode(synthetic.chunk(preset("tiny"), (64, 96)), preset("tiny")),
        b"{not json",
        json.dumps({**document, "extra": 1}).encode(),
        json.dumps({**document, "code": 200}).encode(),
        json.dumps({**document, "code": "413"}).encode(),
        [document],
        b'{"a":' * 5000 + b"1" + b"}" * 5000,  # nested past the parser's recursion limit
        json.dumps({**document, "message": "x" * 20_000}).encode(),  # no document of ours is that large
        {**document, "message": "x" * 20_000},
    ]
    assert all(error_from_document(body) is None for body in not_errors)


def test_a_large_json_body_is_not_parsed(edge, monkeypatch):
    def no_parsing(*args, **kwargs):
        raise AssertionError("a large body was parsed")

    monkeypatch.setattr(errors, "json", types.SimpleNamespace(loads=no_parsing))
    document = json.dumps({"code": 400, "type": "bad_input", "message": "x" * (1 << 20)}).encode()
    ((status, _, body),) = handle(*edge, [{"body": document}])
    assert (status, json.loads(body)["type"]) == (400, "bad_payload")


@pytest.mark.parametrize("body", [
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    b'{"code": 400, "type": "bad_input", "message": ' + b"[" * 3000 + b"]" * 3000 + b"}",
])
def test_deeply_nested_json_is_a_bad_payload(edge, body):
    ((status, _, reply),) = handle(*edge, [{"body": body}])
    assert (status, json.loads(reply)["type"]) == (400, "bad_payload")


def test_the_edge_passes_on_only_what_an_encoder_sends(edge):
    """A workflow hands the encoder's refusal to the edge, which answers with it; any other
    document, which only someone else can have sent, is a bad payload."""
    passed_on = [(400, "bad_input"), (413, "frame_too_large"), (413, "chunk_too_large"), (400, "bad_payload"),
                 (507, "out_of_memory")]
    foreign = [(599, "x"), (503, "unavailable"), (503, "device_failure"), (500, "internal_error"), (404, "bad_input"), (409, "model_mismatch"),
               (413, "payload_too_large"), (400, "InvalidKeyException")]
    documents = [{"code": code, "type": kind, "message": "m"} for code, kind in passed_on + foreign]
    replies = handle(*edge, [{"body": json.dumps(d).encode()} for d in documents] + [{"body": d} for d in documents])
    expected = [(code, kind) for code, kind in passed_on] + [(400, "bad_payload")] * len(foreign)
    assert [(status, json.loads(body)["type"]) for status, _, body in replies] == expected * 2


def test_default_threads_give_the_edge_every_core_and_the_encoder_a_share():
    for cores in (1, 2, 3, 8, 16, 64):
        cloud, edge = worker.default_threads("cloud", cores), worker.default_threads("edge", cores)
        assert edge == cores
        assert 1 <= cloud <= max(1, cores // 8)
    assert (worker.default_threads("cloud", 2), worker.default_threads("edge", 2)) == (1, 2)
    assert (worker.default_threads("cloud", 16), worker.default_threads("edge", 16)) == (2, 16)


# --- chunks ---------------------------------------------------------------------------------------


def scene_png(i: int, height: int = 64, width: int = 96) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(synthetic.scene(height, width, i)).save(buffer, format="PNG")
    return buffer.getvalue()


def chunk_request(first: int, count: int, seed: int, **extra) -> dict:
    return {**{f"frame{i}": scene_png(first + i) for i in range(count)}, "seed": str(seed), **extra}


def unzip(body: bytes) -> list[np.ndarray]:
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        entries = archive.infolist()
        assert all(e.compress_type == zipfile.ZIP_STORED for e in entries)
        return [np.asarray(Image.open(io.BytesIO(archive.read(e)))) for e in entries], [e.filename for e in entries]


def test_a_chunk_is_one_payload_and_a_zip_equal_to_its_pairs(encoder, edge):
    ((status, content_type, payload),) = handle(*encoder, [chunk_request(0, 5, seed=3, codec="bf16+zstd")])
    assert (status, content_type) == (200, fields.OCTET_STREAM)
    chunk = wire.decode(payload, preset("tiny"))
    assert (chunk.frames, chunk.seeds) == (5, [3, 4, 5, 6])
    ((status, content_type, answer),) = handle(*edge, [{"body": payload}])
    assert (status, content_type) == (200, fields.ZIP)
    middles, names = unzip(answer)
    assert names == ["000.png", "001.png", "002.png", "003.png"]
    pair_payloads = [reply[2] for reply in handle(*encoder, [chunk_request(j, 2, seed=3 + j) for j in range(4)])]
    for j, reply in enumerate(handle(*edge, [{"body": p} for p in pair_payloads])):
        assert reply[:2] == (200, fields.PNG)
        single = np.asarray(Image.open(io.BytesIO(reply[2]))).astype(int)
        # Batched and one-at-a-time forwards round differently in the last float bits only.
        assert np.abs(middles[j].astype(int) - single).max() <= 1
        assert (middles[j] != single).mean() < 1e-3


@pytest.mark.parametrize("request_, status, kind, message", [
    (chunk_request(0, 4, 0) | {"frame2": None}, 400, "bad_input", "missing form field 'frame2'"),
    ({k: v for k, v in chunk_request(0, 4, 0).items() if k != "frame1"}, 400, "bad_input", "'frame1'"),
    (chunk_request(0, 18, 0), 413, "chunk_too_large", "18 frames in one request, over this server's 17"),
    (chunk_request(0, 3, 0) | {"frame1": scene_png(1, 64, 64)}, 400, "bad_input", "frames differ in size"),
    (chunk_request(0, 3, 2**64 - 1), 400, "bad_input", "no room for the seeds of 2 pairs"),
])
def test_bad_chunk_requests(encoder, request_, status, kind, message):
    request_ = {k: v for k, v in request_.items() if v is not None}
    ((got, content_type, body),) = handle(*encoder, [request_])
    document = json.loads(body)
    assert (got, content_type, document["type"]) == (status, fields.JSON, kind)
    assert message in document["message"]


def test_chunk_token_budget(model_dir):
    ctx = context(model_dir, "eden_encoder", max_pixels=100 * 100, max_chunk_tokens=100)
    handler = handler_class("eden_encoder_handler", "EdenEncoderHandler")()
    handler.initialize(ctx)
    # 10^4 pixels at aspect ratios up to 4:1 pad to at most 75 tokens per frame (worker.max_tokens_for),
    # and a pair of the largest frames always fits: the budget is max(100, 2 * 75) = 150 tokens.
    assert handle(handler, ctx, [chunk_request(0, 6, 0)])[0][0] == 200  # 6 frames of 24 tokens: 144
    ((status, _, body),) = handle(handler, ctx, [{f"frame{i}": scene_png(i, 96, 96) for i in range(5)}])  # 5 x 36
    document = json.loads(body)
    assert (status, document["type"]) == (413, "chunk_too_large")
    assert "180 tokens, over this server's 150 per request; send at most 4 frames of this size" in document["message"]


def test_the_edge_refuses_chunks_over_its_limits(model_dir, encoder):
    ((_, _, payload),) = handle(*encoder, [chunk_request(0, 6, 0)])
    ctx = context(model_dir, "eden_ditdec", max_chunk_frames=5)
    handler = handler_class("eden_ditdec_handler", "EdenDitDecHandler")()
    handler.initialize(ctx)
    ((status, _, body),) = handle(handler, ctx, [{"body": payload}])
    assert (status, json.loads(body)["type"]) == (413, "chunk_too_large")
    ((status, _, body),) = handle(handler, ctx, [{"body": payload[:-100]}])
    assert (status, json.loads(body)["type"]) == (400, "bad_payload")


@pytest.mark.parametrize("max_batch_tokens", [0, 24, 10**6])
def test_a_batch_of_requests_is_grouped_by_size(model_dir, encoder, max_batch_tokens):
    """Requests of one size share batched forwards, whatever the budget cuts them into; another size
    and a bad request in the same batch keep their own answers."""
    ctx = context(model_dir, "eden_ditdec", max_batch_tokens=max_batch_tokens)
    handler = handler_class("eden_ditdec_handler", "EdenDitDecHandler")()
    handler.initialize(ctx)
    requests = [chunk_request(0, 3, 0), {"frame0": scene_png(0, 70, 100), "frame1": scene_png(1, 70, 100)},
                chunk_request(1, 3, 1)]
    payloads = [reply[2] for reply in handle(*encoder, requests)]
    replies = handle(handler, ctx, [{"body": payloads[0]}, {"body": payloads[1]}, {"body": b"EDENWIRE" + bytes(40)},
                                    {"body": payloads[2]}])
    assert [r[:2] for r in replies] == [(200, fields.ZIP), (200, fields.PNG), (400, fields.JSON), (200, fields.ZIP)]
    assert Image.open(io.BytesIO(replies[1][2])).size == (100, 70)
    first, _ = unzip(replies[0][2])
    last, _ = unzip(replies[3][2])
    # Pair 1 of the first request is pair 0 of the last: the same frames and seed.
    assert np.abs(first[1].astype(int) - last[0].astype(int)).max() <= 1 and len(first) == len(last) == 2


# --- scene cuts -----------------------------------------------------------------------------------

CUT_CLIP = sorted((Path(__file__).parent / "data" / "scene_cut").glob("*.png"))


def test_a_pair_across_a_scene_cut_is_a_copy_of_its_earlier_frame(encoder, edge):
    before, after = CUT_CLIP[3].read_bytes(), CUT_CLIP[4].read_bytes()  # 05.png -> 06.png
    requests = [{"frame0": before, "frame1": after}, {"frame0": before, "frame1": after, "scene_threshold": "off"},
                {"frame0": before, "frame1": after, "scene_threshold": "2.5"}]
    payloads = [reply[2] for reply in handle(*encoder, requests)]
    middles = [np.asarray(Image.open(io.BytesIO(reply[2]))) for reply in handle(*edge, [{"body": p} for p in payloads])]
    original = np.asarray(Image.open(CUT_CLIP[3]))
    assert [np.array_equal(middle, original) for middle in middles] == [True, False, False]


@pytest.mark.parametrize("value", ["", "-0.1", "3.5", "nan", "maybe", "0x1"])
def test_bad_scene_thresholds(encoder, value):
    ((status, _, body),) = handle(*encoder, [{"frame0": scene_png(0), "frame1": scene_png(1), "scene_threshold": value}])
    assert (status, json.loads(body)["type"]) == (400, "bad_input")
    assert "scene_threshold" in json.loads(body)["message"]


def test_scene_threshold_setting():
    assert worker.Settings.from_yaml({"handler": {"scene_threshold": None}}).scene_threshold is None
    assert worker.Settings.from_yaml({}).scene_threshold == 0.9
    for bad in ("off", -1, 4, True):
        with pytest.raises(ValueError, match="scene_threshold"):
            worker.Settings.from_yaml({"handler": {"scene_threshold": bad}})


@pytest.mark.parametrize("name", ["eden_encoder", "eden_ditdec"])
def test_the_archives_model_configs_are_valid_settings(name):
    document = yaml.safe_load((GLUE / f"{name}-config.yaml").read_text())
    settings = worker.Settings.from_yaml(document)
    assert settings.max_pixels == 3840 * 2160 and settings.max_chunk_frames == 17


# --- device failures, retries and timing (CUDA's behaviour injected: no GPU here) -------------------


@pytest.fixture
def fresh_edge(model_dir):
    """An edge handler of its own, whose model a test may rewire; batches of up to 16 pairs."""
    ctx = context(model_dir, "eden_ditdec", max_batch_tokens=16 * 24)
    handler = handler_class("eden_ditdec_handler", "EdenDitDecHandler")()
    handler.initialize(ctx)
    return handler, ctx


def test_a_sticky_device_error_answers_503_and_the_worker_leaves(fresh_edge, encoder, monkeypatch):
    handler, ctx = fresh_edge
    service = handler.service
    left = []
    monkeypatch.setattr(service, "leave", lambda: left.append(True))

    def broken(inputs, *args, **kwargs):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(service.model, "forward", broken)
    payload = handle(*encoder, [chunk_request(0, 2, 0)])[0][2]
    replies = handle(handler, ctx, [{"body": payload}, {"body": b"EDENWIRE" + bytes(40)}])
    assert [(status, json.loads(body)["type"]) for status, _, body in replies] == [(503, "device_failure"), (400, "unsupported_version")]
    assert left == [True]
    monkeypatch.undo()
    monkeypatch.setattr(service, "leave", lambda: left.append(True))
    forged = json.dumps({"code": 503, "type": "device_failure", "message": "m"}).encode()
    # Neither a healthy answer nor a document claiming a device failure makes it leave.
    assert [r[0] for r in handle(handler, ctx, [{"body": payload}, {"body": forged}])] == [200, 400]
    assert left == [True]


def test_a_sticky_device_error_is_logged_as_met_and_what_its_frames_hold_is_never_freed(fresh_edge, encoder, monkeypatch, caplog):
    """On a GPU, freeing a tensor after a sticky error can end the process in C++ before it answers
    (an H200's worker did, as the request's traceback was let go). So the worker says it is leaving
    as it meets the failure, before any answer or exit, and keeps the failure (its frames, their
    tensors) for the rest of its life."""
    from eden_serve.serving import refusals

    handler, ctx = fresh_edge
    service = handler.service
    events = []
    monkeypatch.setattr(service, "leave", lambda: events.append("leave"))
    monkeypatch.setattr(refusals, "_KEPT", [])
    held = []

    def broken(inputs, *args, **kwargs):
        scratch = torch.ones(4)  # a tensor of the failing forward, held only by its frame
        held.append(weakref.ref(scratch))
        raise torch.AcceleratorError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(service.model, "forward", broken)
    payload = handle(*encoder, [chunk_request(0, 2, 0)])[0][2]
    with caplog.at_level("CRITICAL", logger=refusals.__name__):
        caplog.handler.emit = lambda record, emit=caplog.handler.emit: (events.append("logged"), emit(record))
        replies = handle(handler, ctx, [{"body": payload}])
    assert [status for status, _, _ in replies] == [503]
    assert events == ["logged", "leave"] and refusals.LEAVING in caplog.text
    gc.collect()
    assert held and all(ref() is not None for ref in held)
    # Any other failure lets its frames go.
    monkeypatch.setattr(service.model, "forward", lambda *a, **k: (held.append(weakref.ref(torch.ones(4))), 1 / 0))
    handle(handler, ctx, [{"body": payload}])
    gc.collect()
    assert held[-1]() is None and len(refusals._KEPT) == 1


def test_the_edge_side_holds_the_packet_decoder_the_settings_and_key_choose(fresh_edge):
    """The service gives its edge side the decoder when it makes it (no call goes back up into the
    service): without a wire key the sandbox, or a refusal; with one, this process. The work is
    bounded before anything is decoded."""
    from eden_serve.edge.conditions import PacketDecoder
    from eden_serve.serving.bitstreams import packet_decoder

    service = fresh_edge[0].service
    assert service.edge_side.decoder.where == "sandbox"
    service.wire_key = b"k" * 32
    assert service.edge_side.decoder == packet_decoder(service.settings, keyed=True) and service.edge_side.decoder.where == "process"
    three_frames = types.SimpleNamespace(size=(64, 96), packets=[b""] * 3)
    with pytest.raises(errors.UnauthenticPayloadError):
        packet_decoder(worker.Settings(unkeyed_bitstream="refuse"), keyed=False).decode(three_frames)
    with pytest.raises(errors.TooMuchWorkError):
        PacketDecoder(max_decoded_pixels=3 * 64 * 96 - 1).decode(three_frames)


def test_leaving_exits_the_process_after_the_answers(fresh_edge, monkeypatch):
    exits = []

    class Timer:
        def __init__(self, delay, function, args):
            self.delay, self.call = delay, lambda: function(*args)
            self.daemon = False

        def start(self):
            exits.append((self.delay, self.daemon))
            self.call()

    from eden_serve.serving import services
    monkeypatch.setattr(services.threading, "Timer", Timer)
    monkeypatch.setattr(services.os, "_exit", lambda code: exits.append(code))
    fresh_edge[0].service.leave()
    assert exits == [(services.EXIT_GRACE_S, True), services.DEVICE_FAILURE_EXIT]


def test_a_batch_out_of_memory_is_tried_again_in_halves(fresh_edge, encoder, monkeypatch):
    handler, ctx = fresh_edge
    model = handler.service.model
    requests = [chunk_request(0, 4, 0), chunk_request(3, 2, 3)]  # 3 + 1 pairs of one size: one batch
    payloads = [reply[2] for reply in handle(*encoder, requests)]
    expected = [body for _, _, body in handle(handler, ctx, [{"body": p} for p in payloads])]
    sizes = []
    real = model.forward

    def small_batches_only(inputs, *args, **kwargs):
        sizes.append(inputs.batch)
        if inputs.batch > 1:
            raise RuntimeError("CUDA error: out of memory")  # not a torch.OutOfMemoryError: cuBLAS and others
        return real(inputs, *args, **kwargs)

    monkeypatch.setattr(model, "forward", small_batches_only)
    replies = handle(handler, ctx, [{"body": p} for p in payloads])
    assert [status for status, _, _ in replies] == [200, 200]
    assert sizes == [4, 2, 1, 1, 2, 1, 1]
    middles = [unzip(replies[0][2])[0] + [np.asarray(Image.open(io.BytesIO(replies[1][2])))]]
    before = [unzip(expected[0])[0] + [np.asarray(Image.open(io.BytesIO(expected[1])))]]
    assert len(middles[0]) == 4
    assert all(np.abs(a.astype(int) - b.astype(int)).max() <= 1 for a, b in zip(middles[0], before[0]))

    monkeypatch.setattr(model, "forward", lambda inputs, *args, **kwargs: (_ for _ in ()).throw(torch.OutOfMemoryError("out of memory")))
    replies = handle(handler, ctx, [{"body": payloads[1]}])
    assert [(status, json.loads(body)["type"]) for status, _, body in replies] == [(507, "out_of_memory")]


def test_the_cache_is_emptied_once_the_failed_batch_is_freed(fresh_edge, encoder, monkeypatch):
    """torch.cuda.empty_cache cannot return blocks that the failure's traceback still holds."""
    handler, ctx = fresh_edge
    held, alive_at_release = [], []

    def runs_out(inputs, *args, **kwargs):
        activations = torch.ones(1 << 16)
        held.append(weakref.ref(activations))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(handler.service.model, "forward", runs_out)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: alive_at_release.append(held[-1]() is not None))
    payload = handle(*encoder, [chunk_request(0, 2, 0)])[0][2]
    assert handle(handler, ctx, [{"body": payload}])[0][0] == 507
    assert alive_at_release == [False]


def test_stage_metrics_come_from_the_forwards_clock(fresh_edge, encoder, monkeypatch):
    """Each stage is charged its own time, as the forward's clock marks it (on a GPU by events on
    the stream, which wait for its kernels): here a clock that only G_DiT's stage moves, by 300 s
    for the request's one forward of its two pairs."""
    from eden_serve.edge import forward as forward_module

    handler, ctx = fresh_edge
    model, recorded, clock = handler.service.model, {}, types.SimpleNamespace(now=0.0)
    runner = model.runner

    def slow_sample(name, inputs):
        clock.now += 300.0 if name == "sample" else 0.0
        return runner(name, inputs)

    monkeypatch.setattr(model, "runner", slow_sample)
    monkeypatch.setattr(forward_module, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(handler.service, "time_metric", lambda name, seconds, idx: recorded.setdefault(name, seconds))
    payload = handle(*encoder, [chunk_request(0, 2, 0)])[0][2]
    assert handle(handler, ctx, [{"body": payload}])[0][0] == 200
    assert (recorded["EdenDenoiseMs"], recorded["EdenDecodeMs"]) == (300.0, 0.0)


def test_pngs_of_a_batch_are_encoded_while_the_next_batch_computes(fresh_edge, encoder, monkeypatch):
    """The first batch's PNG encoding waits until the second batch is being denoised: on the worker
    thread, before the second batch, it would wait in vain."""
    from eden_serve.serving import answer_formats

    handler, ctx = fresh_edge
    model = handler.service.model
    second_batch = threading.Event()
    waited = []
    real_forward, real_png = model.forward, answer_formats.png_of

    def forward(inputs, *args, **kwargs):
        if len(waited) or model.calls:
            second_batch.set()
        model.calls += 1
        return real_forward(inputs, *args, **kwargs)

    def png_of(pixels):
        waited.append(second_batch.wait(timeout=60))
        return real_png(pixels)

    model.calls = 0
    monkeypatch.setattr(model, "forward", forward)
    monkeypatch.setattr(answer_formats, "png_of", png_of)
    requests = [chunk_request(0, 2, 0), {"frame0": scene_png(0, 70, 100), "frame1": scene_png(1, 70, 100)}]
    payloads = [reply[2] for reply in handle(*encoder, requests)]
    replies = handle(handler, ctx, [{"body": p} for p in payloads])
    assert [r[:2] for r in replies] == [(200, fields.PNG), (200, fields.PNG)]
    assert waited and all(waited)


@pytest.mark.parametrize("where", ["middle", "cut"])
def test_a_request_whose_answer_fails_to_encode_fails_alone(fresh_edge, encoder, monkeypatch, where):
    """An unexpected failure while one request's middles (or its cut pair's copy) are encoded is
    that request's 500; it was raised out of the handler, and TorchServe failed every request of
    the batch with 503 "Prediction failed" (which clients retry)."""
    from eden_serve.serving import answer_formats

    handler, ctx = fresh_edge
    real_png = answer_formats.png_of

    def png_of(pixels):
        if pixels.shape[:2] == (70, 100):
            raise RuntimeError("an encoder's bug")
        return real_png(pixels)

    def copy(png):
        raise RuntimeError("an encoder's bug")

    failing = {"frame0": scene_png(0, 70, 100), "frame1": scene_png(1, 70, 100)}
    if where == "cut":  # the copy of a cut pair's earlier frame, made as the answer begins
        monkeypatch.setattr(answer_formats, "RAW_ANSWER", answer_formats.RAW_ANSWER._replace(copy=copy))
        failing |= {"scene_threshold": "0"}
    else:
        monkeypatch.setattr(answer_formats, "png_of", png_of)
    payloads = [reply[2] for reply in handle(*encoder, [chunk_request(0, 2, 0), failing])]
    asked = {"answer": "raw"} if where == "cut" else {}  # a PNG copies the payload's own PNG of the cut: no encoding
    replies = handle(handler, ctx, [{"body": payloads[0]}, {"body": payloads[1], **asked}], {"Host": "127.0.0.1:8080"})
    assert replies[0][:2] == (200, fields.PNG)
    assert (replies[1][0], json.loads(replies[1][2])["type"]) == (500, "internal_error")
    assert handle(handler, ctx, [{"body": payloads[0]}])[0][:2] == (200, fields.PNG)  # the worker goes on


# --- the frames codec -----------------------------------------------------------------------------


def test_frames_payloads_answer_what_fp32_payloads_answer(encoder, edge):
    """The edge re-derives the conditions with the cloud half its model directory holds: the same
    middles, bit for bit, as the fp32 codec's, a scene cut's copy included."""
    request_ = {f"frame{i}": path.read_bytes() for i, path in enumerate(CUT_CLIP[:6])} | {"seed": "4"}
    fp32, frames = (handle(*encoder, [request_ | {"codec": codec}])[0] for codec in ("fp32", "frames"))
    assert fp32[:2] == frames[:2] == (200, fields.OCTET_STREAM)
    assert isinstance(wire.decode(frames[2], preset("tiny")), wire.FramesChunk)
    answers = handle(*edge, [{"body": fp32[2]}, {"body": frames[2]}])
    assert [a[:2] for a in answers] == [(200, fields.ZIP)] * 2
    (expected, _), (got, _) = unzip(answers[0][2]), unzip(answers[1][2])
    assert all(np.array_equal(a, b) for a, b in zip(got, expected)) and len(got) == 5
    assert np.array_equal(got[3], np.asarray(Image.open(CUT_CLIP[3])))
    assert edge[1].metrics.get_metric("EdenConditionsMs", MetricTypes.GAUGE).dimension_names == ["ModelName", "Level"]


def test_16_bit_frames_cross_the_frames_codec_at_16_bits_and_float_ones_are_refused(encoder):
    levels = np.arange(64 * 96, dtype=np.uint16).reshape(64, 96) * 7
    grey = io.BytesIO()
    Image.fromarray(levels).save(grey, format="PNG")
    ((status, _, body),) = handle(*encoder, [{"frame0": grey.getvalue(), "frame1": grey.getvalue(), "codec": "frames"}])
    assert status == 200
    chunk = wire.decode(body, preset("tiny"))
    assert chunk.depth == 16 and np.array_equal(chunk.pixels[0], np.repeat(levels[..., None], 3, axis=2))
    floats = io.BytesIO()
    Image.fromarray(levels.astype(np.float32) / 65535 + 1e-6).save(floats, format="TIFF")
    ((status, _, body),) = handle(*encoder, [{"frame0": floats.getvalue(), "frame1": floats.getvalue(), "codec": "frames"}])
    document = json.loads(body)
    assert (status, document["type"]) == (400, "bad_input") and "more than 8 bits" in document["message"]


def test_an_edge_without_the_cloud_half_refuses_frames_payloads(tmp_path, model_dir, encoder):
    (tmp_path / "eden_edge.safetensors").symlink_to(model_dir / "eden_edge.safetensors")
    ctx = context(tmp_path, "eden_ditdec")
    handler = handler_class("eden_ditdec_handler", "EdenDitDecHandler")()
    handler.initialize(ctx)
    ((_, _, payload),) = handle(*encoder, [chunk_request(0, 3, 0, codec="frames")])
    ((status, _, body),) = handle(handler, ctx, [{"body": payload}])
    document = json.loads(body)
    assert (status, document["type"]) == (409, "model_mismatch") and "no cloud weights" in document["message"]


# --- the edge's pace: requests opened ahead, shared forwards, raw answers ---------------------------


def test_requests_opened_ahead_answer_what_requests_opened_in_turn(fresh_edge, encoder):
    """The preparation thread changes no answer, a bad payload among good ones is refused alone, and
    the answers come in the batch's order whatever order the pairs computed in."""
    from eden_serve.edge.streams import HostStreams
    from eden_serve.serving.overlap import Preparation

    handler, ctx = fresh_edge
    service = handler.service
    requests = [chunk_request(4, 3, 4), {"frame0": scene_png(0, 70, 100), "frame1": scene_png(1, 70, 100)}, chunk_request(0, 3, 0)]
    payloads = [reply[2] for reply in handle(*encoder, requests)]
    batch = [{"body": payloads[0]}, {"body": payloads[1][:-3]}, {"body": payloads[1]}, {"body": payloads[2]}]
    ahead = handle(handler, ctx, batch)
    assert service.preparation.ahead == 1
    service.preparation = Preparation(HostStreams(), ahead=0)
    try:
        in_turn = handle(handler, ctx, batch)
    finally:
        service.preparation = Preparation(HostStreams())
    assert [r[:2] for r in ahead] == [(200, fields.ZIP), (400, fields.JSON), (200, fields.PNG), (200, fields.ZIP)]
    assert json.loads(ahead[1][2])["type"] == "bad_payload"
    assert [r[:2] for r in in_turn] == [r[:2] for r in ahead] and ahead[1:3] == in_turn[1:3]
    for n in (0, 3):  # a zip's entries carry the time they were written
        assert all(np.array_equal(a, b) for a, b in zip(unzip(ahead[n][2])[0], unzip(in_turn[n][2])[0], strict=True))


def test_requests_of_one_batch_share_a_forward_and_get_its_middles(fresh_edge, encoder, monkeypatch):
    """Two chunks in one worker call go through one forward (a budget of 16 pairs), which gives each
    pair the middle of that forward in process bit for bit (fp32, CPU). A pair computed alone rounds
    its last float bits otherwise: within one 8-bit level, as docs/performance.md says."""
    handler, ctx = fresh_edge
    model = handler.service.model
    payloads = [reply[2] for reply in handle(*encoder, [chunk_request(0, 3, 0), chunk_request(5, 4, 9)])]
    sizes = []
    real = model.prepare
    monkeypatch.setattr(model, "prepare", lambda batch: sizes.append(len(batch)) or real(batch))
    replies = handle(handler, ctx, [{"body": p} for p in payloads])
    assert sizes == [5] and [r[:2] for r in replies] == [(200, fields.ZIP)] * 2
    served = unzip(replies[0][2])[0] + unzip(replies[1][2])[0]
    chunks = [wire.decode(p, model.config) for p in payloads]
    pairs = [chunk.pair(j) for chunk in chunks for j in range(chunk.pairs)]
    together = middles_of(model, pairs).numpy()
    assert all(np.array_equal(got, expected) for got, expected in zip(served, together, strict=True))
    alone = [middles_of(model, [p])[0].numpy() for p in pairs]
    assert all(np.abs(a.astype(int) - b.astype(int)).max() <= 1 for a, b in zip(alone, together))


def test_raw_answers_carry_the_pngs_pixels(fresh_edge, encoder):
    from eden_serve.wire.raw import RAW, decode_raw, whole_raw

    handler, ctx = fresh_edge
    cut = {f"frame{i}": path.read_bytes() for i, path in enumerate(CUT_CLIP[2:6])}  # pair 1 crosses the cut
    payloads = [reply[2] for reply in handle(*encoder, [cut | {"seed": "3"}, chunk_request(0, 2, 0)])]
    pngs = handle(handler, ctx, [{"body": p} for p in payloads])
    raw = handle(handler, ctx, [{"body": p, "answer": "raw"} for p in payloads], {"Host": "127.0.0.1:8080"})
    afar = handle(handler, ctx, [{"body": payloads[1], "answer": "raw"}, {"body": payloads[1], "answer": "jpeg"}],
                  {"Host": "edge.example:443"})
    # Whom a request is addressed to is its Host header's word alone, never a field of that name.
    claimed = handle(handler, ctx, [{"body": payloads[1], "answer": "raw", "host": "127.0.0.1"}], {"Host": "edge.example:443"})
    assert claimed[0][:2] == (200, fields.PNG)
    assert [r[:2] for r in raw] == [(200, RAW), (200, RAW)]
    sizes = Image.open(CUT_CLIP[2]).size, Image.open(io.BytesIO(pngs[1][2])).size
    got = whole_raw(raw[0][2], 3, sizes[0], "") + [decode_raw(raw[1][2], sizes[1], "")]
    expected = unzip(pngs[0][2])[0] + [np.asarray(Image.open(io.BytesIO(pngs[1][2])))]
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert afar[0][:2] == (200, fields.PNG) and afar[0][2] == pngs[1][2]
    assert (afar[1][0], json.loads(afar[1][2])["type"]) == (400, "bad_input")


def test_a_streamed_raw_answer_sends_each_middle_once_in_order(fresh_edge, encoder):
    from eden_serve.wire.answers import END, STREAMED, StreamedAnswer, record

    handler, ctx = fresh_edge
    service = handler.service
    payload = handle(*encoder, [chunk_request(0, 5, 2)])[0][2]
    parts = []
    service.send_part = lambda idx, body, content_type: parts.append((idx, body, content_type))
    try:
        ((status, content_type, body),) = handle(handler, ctx, [{"body": payload, "stream": "http", "first": "1", "answer": "raw"}],
                                                   {"Host": "localhost:8080"})
    finally:
        service.send_part = None
    assert (status, content_type, body) == (200, STREAMED, record(END, 0))
    assert {(idx, kind) for idx, _, kind in parts} == {(0, STREAMED)}
    answer = StreamedAnswer(1, 4, (96, 64), "", raw=True)
    middles = answer.feed(b"".join(part for _, part, _ in parts) + body)
    assert [j for j, _ in middles] == [1, 2, 3] and answer.finish()
    whole = unzip(handle(handler, ctx, [{"body": payload, "first": "1"}])[0][2])[0]  # the same pairs in one forward
    assert all(np.array_equal(np.asarray(image), whole[j - 1]) for j, image in middles)


def test_a_streamed_answer_ends_after_its_parts_however_slowly_they_are_sent(fresh_edge, encoder, monkeypatch):
    """A middle encoded and set, its part still being sent by the encoding thread: the answer waits
    for that part, then ends with the end record (answering the middles whole behind a part sent
    later broke the stream: a race the real client met)."""
    from eden_serve.wire.answers import END, STREAMED, record

    handler, ctx = fresh_edge
    service = handler.service
    payload = handle(*encoder, [chunk_request(0, 2, 0)])[0][2]
    parts = []

    def slow_part(idx, body, content_type):
        time.sleep(0.5)
        parts.append(body)

    def late_reply(idx, answer):  # the worker thread comes to answer while the part is on its way
        time.sleep(0.2)
        return reply(idx, answer)

    reply = service.reply
    monkeypatch.setattr(service, "reply", late_reply)
    service.send_part = slow_part
    try:
        ((status, content_type, body),) = handle(handler, ctx, [{"body": payload, "stream": "http", "answer": "raw"}],
                                                   {"Host": "127.0.0.1"})
    finally:
        service.send_part = None
    assert (status, content_type, body) == (200, STREAMED, record(END, 0)) and len(parts) == 1

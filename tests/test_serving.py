"""eden_serve.serving and the two handlers in this process, with TorchServe's own Context,
RequestProcessor and metrics cache (no server; tests/test_deployment.py runs the real one)."""

from __future__ import annotations

import gc
import importlib.util
import io
import json
import types
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
import ts
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image
from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.metrics.metric_type_enum import MetricTypes

from eden_serve import errors, wire
from eden_serve.serving import fields, worker
from eden_serve.serving.services import each
from eden_serve.checkpoint import write_halves
from eden_serve.synthetic import state_dict as synthetic_state_dict
from eden_serve.config import preset
from eden_serve.errors import BadInputError, UpstreamError, error_from_document
from eden_serve.frames import DEFAULT_MAX_PIXELS
from eden_serve.serving.launcher import REPO as ROOT


def handler_class(name: str, class_name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "handlers" / f"{name}.py")
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


def context(model_dir, model_name: str) -> Context:
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))  # TorchServe's default
    metrics.initialize_cache()
    # The handler sets the process's thread count; keep this test process's.
    yaml_config = {"batchSize": 4, "handler": {"threads": torch.get_num_threads()}}
    return Context(model_name, str(model_dir), {"model": {"modelName": model_name}}, 4, None, "0.12.0",
                   metrics=metrics, model_yaml_config=yaml_config)


def handle(handler, ctx: Context, batch: list[dict]) -> list[tuple[int, str, bytes]]:
    """What TorchServe's Service.predict does around the handler, minus the socket."""
    ctx.request_processor = [RequestProcessor({}) for _ in batch]
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
    (body,) = edge[0].service.postprocess(each(broken, [{}]))
    assert ctx.get_response_status(0)[0] == 500
    assert json.loads(body) == {"code": 500, "type": "internal_error", "message": "internal error (RuntimeError); see the server log"}


def test_settings_from_model_config():
    assert worker.Settings.from_yaml({}) == worker.Settings()
    settings = worker.Settings.from_yaml({"handler": {"max_pixels": 1000, "codec": "fp32", "precision": "bf16", "threads": 3}})
    assert (settings.max_pixels, settings.codec, settings.precision, settings.threads) == (1000, "fp32", "bf16", 3)
    for bad in ({"maxpixels": 5}, {"max_pixels": 0}, {"max_pixels": "4K"}, {"precision": "fp16"}, {"threads": -1}):
        with pytest.raises(ValueError):
            worker.Settings.from_yaml({"handler": bad})
    with pytest.raises(BadInputError):
        worker.Settings.from_yaml({"handler": {"codec": "fp8"}})


def test_device_without_cuda_is_the_cpu():
    assert worker.choose_device(None) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert worker.choose_device(1) == torch.device("cpu")


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
    cond = wire.Conditions(torch.zeros(2, 24, 64), torch.zeros(2, 24, 64), 0.5, 0.25, 0.0, (4, 6), (64, 96))
    not_errors = [
        wire.encode(cond, preset("tiny")),
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
    passed_on = [(400, "bad_input"), (413, "frame_too_large"), (400, "bad_payload"), (507, "out_of_memory")]
    foreign = [(599, "x"), (503, "unavailable"), (500, "internal_error"), (404, "bad_input"), (409, "model_mismatch"),
               (413, "payload_too_large"), (400, "InvalidKeyException")]
    documents = [{"code": code, "type": kind, "message": "m"} for code, kind in passed_on + foreign]
    replies = handle(*edge, [{"body": json.dumps(d).encode()} for d in documents] + [{"body": d} for d in documents])
    expected = [(code, kind) for code, kind in passed_on] + [(400, "bad_payload")] * len(foreign)
    assert [(status, json.loads(body)["type"]) for status, _, body in replies] == expected * 2


def test_default_threads_share_the_cores_without_oversubscribing():
    for cores in (1, 2, 3, 8, 16, 64):
        cloud, edge = worker.default_threads("cloud", cores), worker.default_threads("edge", cores)
        assert cloud >= 1 and edge >= 1
        assert cloud + edge <= max(2, cores)
        assert edge >= cloud
    assert (worker.default_threads("cloud", 16), worker.default_threads("edge", 16)) == (2, 14)

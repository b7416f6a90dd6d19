"""eden_serve.serving.worker: the device a worker takes and its threads, on either kind of device
(CUDA's answers monkeypatched: no GPU here)."""

from __future__ import annotations

import pytest
import torch
import yaml

from eden_serve.edge import Acceleration
from eden_serve.edge.acceleration import Compile
from eden_serve.errors import DeviceUnavailableError
from eden_serve.serving import worker
from harness.servers import REPO


@pytest.fixture
def threads():
    """configure_torch sets process-wide threads: the test process keeps its own."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def fake_cuda(monkeypatch, count: int) -> list:
    """CUDA with ``count`` GPUs as far as the worker asks; the devices made current, recorded."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    return current


def test_a_worker_without_a_gpu_runs_on_the_cpu():
    assert worker.choose_device(None) == torch.device("cpu")


def test_a_worker_given_a_gpu_it_cannot_use_fails_to_load(monkeypatch):
    fake_cuda(monkeypatch, 0)
    with pytest.raises(DeviceUnavailableError, match="assigned GPU 1 to this worker.*number_of_gpu=0"):
        worker.choose_device(1)


def test_a_worker_takes_the_gpu_it_was_given(monkeypatch):
    fake_cuda(monkeypatch, 2)
    assert worker.choose_device(1) == torch.device("cuda:1")
    fake_cuda(monkeypatch, 1)  # CUDA_VISIBLE_DEVICES narrower than TorchServe's count
    assert worker.choose_device(1) == torch.device("cuda:0")


def test_a_gpu_another_process_holds_exclusively_fails_the_load_saying_why(monkeypatch, threads):
    fake_cuda(monkeypatch, 2)

    def exclusive(device):  # what the CUDA runtime answers in exclusive-process mode
        raise torch.AcceleratorError("CUDA error: CUDA-capable device(s) is/are busy or unavailable")

    monkeypatch.setattr(torch.cuda, "set_device", exclusive)
    with pytest.raises(DeviceUnavailableError, match=r"GPU 1 is busy or unavailable.*exclusive-process.*deviceIds"):
        worker.configure_torch(torch.device("cuda:1"), 3, "edge")


@pytest.mark.parametrize("side", ["cloud", "edge"])
def test_threads_are_set_on_a_gpu_too(monkeypatch, threads, side):
    current = fake_cuda(monkeypatch, 2)
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda _: None)
    worker.configure_torch(torch.device("cuda:1"), 3, side)
    assert torch.get_num_threads() == 3
    assert current == [torch.device("cuda:1")]
    monkeypatch.setattr(worker, "usable_cores", lambda: 16)
    worker.configure_torch(torch.device("cuda:1"), 0, side)
    assert torch.get_num_threads() == worker.default_threads(side, 16, "cuda") == 4


def test_threads_are_set_on_the_cpu(monkeypatch, threads):
    monkeypatch.setattr(worker, "usable_cores", lambda: 16)
    worker.configure_torch(torch.device("cpu"), 0, "cloud")
    assert torch.get_num_threads() == 2
    worker.configure_torch(torch.device("cpu"), 1, "edge")
    assert torch.get_num_threads() == 1


def test_a_gpu_worker_needs_few_host_threads():
    for cores in (1, 2, 8, 64):
        assert 1 <= worker.default_threads("edge", cores, "cuda") <= min(4, cores)
        assert worker.default_threads("cloud", cores, "cuda") == worker.default_threads("edge", cores, "cuda")


@pytest.mark.parametrize("text, cores", [("200000 100000\n", 2), ("150000 100000", 2), ("50000 100000", 1),
                                         ("max 100000\n", None), ("", None)])
def test_the_cpu_limit_of_a_container(tmp_path, text, cores):
    (tmp_path / "cpu.max").write_text(text)
    assert worker.cpu_quota(tmp_path) == cores
    assert worker.cpu_quota(tmp_path / "absent") is None


def test_the_edge_archive_switches_graphs_in_its_handler_section_and_compile_in_pt2():
    """What TorchServe users write in the edge archive's model-config.yaml (handlers/eden_ditdec-config.yaml)."""
    assert worker.Settings.from_yaml({}).acceleration() == Acceleration("auto", "auto")  # graphs on a GPU; compiled only from prepared artefacts
    assert worker.Settings.from_yaml({"pt2": {"compile": {"enable": False}}}).acceleration() == Acceleration("auto", None)
    settings = worker.Settings.from_yaml({"handler": {"cuda_graphs": "off"},
                                          "pt2": {"compile": {"enable": True, "backend": "inductor", "mode": "max-autotune"}}})
    assert settings.acceleration() == Acceleration("off", Compile("inductor", "max-autotune"))
    shipped = yaml.safe_load((REPO / "handlers" / "eden_ditdec-config.yaml").read_text())
    assert worker.Settings.from_yaml(shipped).acceleration() == Acceleration()
    for bad in ({"handler": {"cuda_graphs": "yes"}}, {"handler": {"compile": True}}, {"pt2": "inductor"},
                {"pt2": {"compile": {"enable": True, "mode": "fastest"}}}):
        with pytest.raises(ValueError, match="model-config.yaml"):
            worker.Settings.from_yaml(bad)

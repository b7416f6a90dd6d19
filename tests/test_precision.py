"""--precision auto and the bf16 warning, with the hardware check injected."""

from types import SimpleNamespace

import pytest
import torch

from eden_serve.config import PRESETS
from eden_serve.edge import EdgeModel, precision
from eden_serve.edge.precision import (
    Bf16Check,
    SlowPrecisionWarning,
    cpu_bf16_capable,
    probe_speedup,
    resolve,
)
from eden_serve.errors import BadInputError
from eden_serve.model.checkpoint import module_from_state

CPU = torch.device("cpu")
AVX2 = {"architecture": "x86_64", "avx2": True, "avx512_bf16": False, "amx_bf16": False}
SAPPHIRE_RAPIDS = {"architecture": "x86_64", "avx2": True, "avx512_bf16": True, "amx_bf16": True}


def slow(device):
    return Bf16Check(False, "CPU AVX2, without AVX512-BF16 or AMX", speedup=0.25)


def fast(device):
    return Bf16Check(True, "CPU AVX512 with amx_bf16", speedup=3.0)


def test_capability_flags_decide_the_cpu_candidates():
    assert cpu_bf16_capable(AVX2, aten="AVX2", onednn=False)[0] is False
    assert cpu_bf16_capable(SAPPHIRE_RAPIDS, aten="AVX512", onednn=True)[0] is True
    # Native bf16 in the CPU, but PyTorch's kernels capped below it (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA).
    capable, reason = cpu_bf16_capable(SAPPHIRE_RAPIDS, aten="AVX2", onednn=False)
    assert capable is False and "AVX2" in reason
    assert cpu_bf16_capable({"architecture": "aarch64", "bf16": True}, aten="DEFAULT", onednn=True)[0] is True
    assert cpu_bf16_capable({"architecture": "aarch64"}, aten="DEFAULT", onednn=True)[0] is False


def test_auto_resolves_to_fp32_without_native_bf16():
    assert resolve("auto", CPU, slow) == ("fp32", str(slow(CPU)))
    assert resolve("auto", CPU, fast)[0] == "bf16"


def test_auto_on_an_edge_without_native_bf16_runs_fp32(tiny_state):
    config = PRESETS["tiny"]
    edge = EdgeModel(module_from_state(tiny_state, "edge", config), config, precision="auto", bf16_check=slow)
    assert edge.precision == "fp32"
    assert all(p.dtype == torch.float32 for p in edge.weights.parameters())


def test_explicit_bf16_on_slow_hardware_runs_and_warns_with_the_slowdown():
    with pytest.warns(SlowPrecisionWarning, match=r"bf16 is slow on this device: CPU AVX2.*took 4\.0x as long as in fp32"):
        assert resolve("bf16", CPU, slow) == ("bf16", "asked for")


def test_explicit_bf16_on_fast_hardware_does_not_warn(recwarn):
    assert resolve("bf16", CPU, fast)[0] == "bf16"
    assert not [w for w in recwarn if issubclass(w.category, SlowPrecisionWarning)]


def test_fp32_needs_no_check():
    def fail(device):
        raise AssertionError("fp32 must not probe the hardware")

    assert resolve("fp32", CPU, fail) == ("fp32", "asked for")


def test_unknown_precision_is_refused():
    with pytest.raises(BadInputError, match="fp16"):
        resolve("fp16", CPU, fast)


def test_probe_measures_both_precisions():
    assert probe_speedup((16, 32, 32), rounds=2) > 0


@pytest.mark.parametrize("capability, chosen", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp32")])
def test_auto_on_a_gpu_follows_its_compute_capability(monkeypatch, capability, chosen):
    """handler.precision auto on CUDA: bf16 where tensor cores take it, without a timed probe."""
    properties = SimpleNamespace(name="NVIDIA", major=capability[0], minor=capability[1])
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    monkeypatch.setattr(precision, "probe_speedup", lambda *a, **k: pytest.fail("no CPU probe for a GPU"))
    assert precision.resolve("auto", torch.device("cuda:0"))[0] == chosen


@pytest.mark.parametrize("arch, chosen", [("gfx906:sramecc+:xnack-", "fp32"), ("gfx1030", "fp32"), ("gfx908:sramecc+:xnack-", "bf16"),
                                          ("gfx90a:sramecc+:xnack-", "bf16"), ("gfx942:sramecc+:xnack-", "bf16"), ("gfx1100", "bf16")])
def test_auto_on_an_amd_gpu_follows_its_arch_not_its_capability(monkeypatch, arch, chosen):
    """Under ROCm the compute capability is not NVIDIA's (an MI50 reports 9.0): its arch says
    whether the matrix units take bf16."""
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    properties = SimpleNamespace(name="AMD Instinct", major=9, minor=0, gcnArchName=arch)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    monkeypatch.setattr(precision, "probe_speedup", lambda *a, **k: pytest.fail("no CPU probe for a GPU"))
    used, why = precision.resolve("auto", torch.device("cuda:0"))
    assert used == chosen and arch.split(":")[0] in why

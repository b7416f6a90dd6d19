"""The edge's compute precision: ``fp32``, ``bf16``, or ``auto`` (bf16 only where it runs fast).

bf16 is fast only where the hardware multiplies bf16 matrices natively: NVIDIA GPUs of compute
capability 8.0 and newer, AMD GPUs from CDNA and RDNA 3 on, and CPUs with AVX512-BF16 or AMX (x86)
or BF16 (Arm). Elsewhere PyTorch emulates it, and a bf16 matrix product runs several times slower
than fp32. ``auto`` decides in two steps, each enough to say no: the capability flags, then a
measured check at load (a small matrix product timed in both precisions, 10-30 ms of one core). An
explicit ``bf16`` is obeyed, with one warning where it is slow.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from ..errors import BadInputError

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "auto")
# bf16 must beat fp32 by this factor on the probe to be chosen. Measured on this probe: about 3x
# faster with AVX512-BF16 and 3.5x slower on AVX2 (docs/performance.md), so the threshold sits far from both.
MIN_PROBE_SPEEDUP = 1.5
PROBE_SHAPE = (64, 768, 256)  # tokens x inputs -> outputs: 15-25 ms of one core in all, on either kind
PROBE_ROUNDS = 5
# AMD GPUs whose matrix instructions take bf16: CDNA 1-4 (MI100 gfx908, MI200 gfx90a, MI300 gfx94x,
# MI350 gfx950) and RDNA 3-4 (gfx11xx, gfx12xx). Older ones (MI50/MI60 gfx906, MI25 gfx900, RDNA 2
# gfx103x) emulate it, slower than fp32.
ROCM_BF16_ARCHS = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


@dataclass(frozen=True)
class Bf16Check:
    fast: bool
    reason: str  # the capability, in words
    speedup: float | None = None  # fp32 time / bf16 time on the probe; None where not measured

    def __str__(self) -> str:
        if self.speedup is None:
            return self.reason
        if self.speedup >= 1:
            measured = f"ran {self.speedup:.1f}x as fast as in fp32"
        else:
            measured = f"took {1 / self.speedup:.1f}x as long as in fp32"
        return f"{self.reason}; a bf16 matrix product {measured} in a check at load"


def cpu_bf16_capable(
    capabilities: Mapping[str, object] | None = None,
    aten: str | None = None,
    onednn: bool | None = None,
) -> tuple[bool, str]:
    """Whether this CPU has native bf16 matrix instructions that PyTorch's kernels will use.

    The flags come from cpuinfo; ``aten`` (the ATen kernel level) and ``onednn`` (oneDNN's bf16
    support) follow the ISA limits a deployment may set (``ATEN_CPU_CAPABILITY``,
    ``ONEDNN_MAX_CPU_ISA``), which cpuinfo ignores. All are injectable for tests.
    """
    caps = torch.cpu.get_capabilities() if capabilities is None else capabilities
    aten = torch.backends.cpu.get_cpu_capability() if aten is None else aten
    onednn = torch.ops.mkldnn._is_mkldnn_bf16_supported() if onednn is None else onednn
    if caps.get("architecture") == "x86_64":
        native = [name for name in ("amx_bf16", "avx512_bf16") if caps.get(name)]
        if not native:
            return False, f"CPU {aten}, without AVX512-BF16 or AMX"
        if aten != "AVX512" or not onednn:
            return False, f"CPU has {'+'.join(native)} but PyTorch's kernels are limited to {aten}"
        return True, f"CPU {aten} with {'+'.join(native)}"
    native = [name for name in ("bf16", "sve_bf16") if caps.get(name)]
    if native and onednn:
        return True, f"CPU {caps.get('architecture')} with {'+'.join(native)}"
    return False, f"CPU {caps.get('architecture')} ({aten}) without native bf16"


def gpu_bf16_capable(major: int, minor: int, arch: str | None = None) -> tuple[bool, str]:
    """Whether a GPU multiplies bf16 matrices natively: an NVIDIA GPU from compute capability 8.0
    (its tensor cores), an AMD GPU (``arch``, its ``gcnArchName`` under ROCm, where the capability
    is not NVIDIA's) whose matrix units take bf16 (:data:`ROCM_BF16_ARCHS`)."""
    if arch is None:
        if major < 8:
            return False, f"CUDA compute capability {major}.{minor} has no bf16 tensor cores"
        return True, f"CUDA device with bf16 support (compute capability {major}.{minor})"
    name = arch.split(":")[0]  # "gfx90a:sramecc+:xnack-": the features do not matter here
    if name.startswith(ROCM_BF16_ARCHS):
        return True, f"ROCm device {name} with bf16 matrix instructions"
    return False, f"ROCm device {name} has no bf16 matrix instructions"


def probe_speedup(shape: tuple[int, int, int] = PROBE_SHAPE, rounds: int = PROBE_ROUNDS) -> float:
    """fp32 time / bf16 time of one linear layer of ``shape`` on the CPU, the best of a few
    interleaved runs each.

    It runs on one thread and counts that thread's CPU time, so that other processes on a busy
    machine (which take the cores away, not the instructions) do not sway it.
    """
    tokens, inputs, outputs = shape
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, inputs, generator=generator)
    w = torch.randn(outputs, inputs, generator=generator)
    operands = {dtype: (x.to(dtype), w.to(dtype)) for dtype in (torch.float32, torch.bfloat16)}
    best = dict.fromkeys(operands, math.inf)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for xd, wd in operands.values():
            F.linear(xd, wd)  # first call: kernel choice and code generation
        for _ in range(rounds):
            for dtype, (xd, wd) in operands.items():
                start = time.thread_time()
                F.linear(xd, wd)
                best[dtype] = min(best[dtype], time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    return best[torch.float32] / best[torch.bfloat16]


def check_bf16(device: torch.device) -> Bf16Check:
    """Does ``device`` run bf16 matrix products fast? Capability first, then the measured probe."""
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        arch = getattr(properties, "gcnArchName", None) if torch.version.hip is not None else None
        return Bf16Check(*gpu_bf16_capable(properties.major, properties.minor, arch))
    capable, reason = cpu_bf16_capable()
    speedup = probe_speedup()  # also where not capable: the warning for an explicit bf16 states it
    return Bf16Check(capable and speedup >= MIN_PROBE_SPEEDUP, reason, speedup)


def default_precision(device: torch.device) -> str:
    """The precision to use where none is asked for: ``auto`` on a GPU (bf16 from compute capability
    8.0, on the tensor cores; docs/gpu.md "Precision on a GPU"), ``fp32`` on a CPU, where bf16 runs
    fast only on some CPUs and changes the output: there it stays the user's choice."""
    return "auto" if device.type == "cuda" else "fp32"


def resolve(
    requested: str, device: torch.device, check: Callable[[torch.device], Bf16Check] = check_bf16
) -> tuple[str, str]:
    """``requested`` precision -> (the precision to run, why). Logs the choice; warns once when an
    explicit bf16 is slow here."""
    if requested not in PRECISIONS:
        raise BadInputError(f"unknown precision {requested!r}; use {', '.join(PRECISIONS)}")
    if requested == "fp32":
        return "fp32", "asked for"
    result = check(device)
    if requested == "bf16":
        if not result.fast:
            warnings.warn(
                f"bf16 is slow on this device: {result}; use --precision fp32 or auto (handler.precision in model-config.yaml)",
                SlowPrecisionWarning,
                stacklevel=2,
            )
        return "bf16", "asked for"
    chosen = "bf16" if result.fast else "fp32"
    logger.info("precision auto -> %s: %s", chosen, result)
    return chosen, str(result)


class SlowPrecisionWarning(UserWarning):
    """An explicit precision runs slower here than fp32 would."""

"""ISA level, CPU features and the kernel report."""

from __future__ import annotations

import os

from ._native import ffi, lib

ISA_NAMES = ("scalar", "avx2", "avx512")
CPU_FEATURES = {
    "sse4.1": lib.TnCpuSse41,
    "avx": lib.TnCpuAvx,
    "avx2": lib.TnCpuAvx2,
    "fma": lib.TnCpuFma,
    "f16c": lib.TnCpuF16c,
    "avx512f": lib.TnCpuAvx512f,
    "avx512bw": lib.TnCpuAvx512bw,
    "avx512vl": lib.TnCpuAvx512vl,
    "avx512dq": lib.TnCpuAvx512dq,
    "avx512vnni": lib.TnCpuAvx512vnni,
    "avx512bf16": lib.TnCpuAvx512bf16,
    "avx512fp16": lib.TnCpuAvx512fp16,
    "avxvnni": lib.TnCpuAvxVnni,
    "os-avx": lib.TnCpuOsAvx,
    "os-avx512": lib.TnCpuOsAvx512,
}


def check_isa_environment() -> None:
    """Refuse an unknown TENSOROPS_ISA before any kernel runs (the C dispatcher would
    otherwise ignore it silently)."""
    value = os.environ.get("TENSOROPS_ISA", "")
    if value and value not in ISA_NAMES:
        raise ValueError(f"TENSOROPS_ISA: expected one of {', '.join(ISA_NAMES)} (or unset), got {value!r}")


def isa() -> str:
    """The active ISA level: 'scalar', 'avx2' or 'avx512'."""
    return ISA_NAMES[lib.TnActiveIsa()]


def cpu_features() -> list[str]:
    mask = lib.TnCpuFeatures()
    return [name for name, bit in CPU_FEATURES.items() if mask & bit]


def kernels() -> dict[str, str]:
    """Each dispatched C kernel and the ISA level of the variant it resolved to."""
    report = {}
    for i in range(lib.TnKernelCount()):
        level = lib.TnKernelIsa(i)
        report[ffi.string(lib.TnKernelName(i)).decode()] = ISA_NAMES[level] if level >= 0 else "missing"
    return report


def set_isa_for_testing(level: str) -> str:
    """For the test suite only: re-resolve every kernel at `level` in this process (as
    TENSOROPS_ISA would at import) and return the level that was active. Refuses a level
    this CPU cannot run. Not for use while any kernel runs in another thread; a
    QuantizedInnerProduct keeps the implementation chosen when it was made."""
    if level not in ISA_NAMES:
        raise ValueError(f"level: expected one of {', '.join(ISA_NAMES)}, got {level!r}")
    previous = isa()
    if lib.TnSetIsaForTesting(ISA_NAMES.index(level)) != 0:  # the dispatcher's own check
        raise ValueError(f"level: this CPU cannot run {level!r} (best: {ISA_NAMES[lib.TnSupportedIsa()]})")
    return previous

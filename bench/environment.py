"""What a benchmark ran on: package versions, the machine, and the CPU's SIMD flags (a peer's
speed depends on which kernels it took), recorded beside every figure."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in (
        "omnidraft",
        "torch",
        "transformers",
        "onnxruntime",
        "onnxruntime-genai",
        "executorch",
        "llama-cpp-python",
        "numpy",
        "tokenizers",
    ):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def machine() -> dict:
    import torch

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": mem,
        "torch_default_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpu_flags": simd_flags(),
    }


# The instruction sets the engines' kernels choose between (a peer's speed depends on which it took).
SIMD = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "neon", "asimd")


def simd_flags() -> list[str] | None:
    """The CPU's SIMD flags from /proc/cpuinfo (None where there is none, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags |= set(line.split(":", 1)[1].split())
    return sorted(f for f in flags if f in SIMD or f.startswith("avx512"))

"""The known-GPU table: datasheet peaks matched by a device's name (private to regime)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownGpu:
    """A datasheet row: ``tokens`` must all appear in the lower-cased device name, each
    as a whole word (so ``l4`` does not match ``L40S``)."""

    name: str
    tokens: tuple[str, ...]
    flops_per_s: float  # dense BF16/FP16 tensor-core peak (no 2:4 sparsity)
    bytes_per_s: float  # memory bandwidth


# Most specific first: the first row whose tokens all match wins.
KNOWN_GPUS: tuple[KnownGpu, ...] = (
    # NVIDIA H100 datasheet: BF16 tensor 989 TFLOPS SXM / 756 PCIe / 835 NVL (dense; the
    # sheet's 1,979 / 1,513 / 1,671 are with sparsity); HBM 3.35 / 2.0 / 3.9 TB/s.
    KnownGpu("H100 PCIe", ("h100", "pcie"), 756e12, 2.0e12),
    KnownGpu("H100 NVL", ("h100", "nvl"), 835e12, 3.9e12),
    KnownGpu("H100 SXM", ("h100",), 989e12, 3.35e12),
    # NVIDIA H200 datasheet: BF16 tensor 989 TFLOPS SXM / 835 NVL (dense); HBM3e 4.8 TB/s.
    KnownGpu("H200 NVL", ("h200", "nvl"), 835e12, 4.8e12),
    KnownGpu("H200", ("h200",), 989e12, 4.8e12),
    # NVIDIA A100 datasheet: BF16 tensor 312 TFLOPS; 80GB SXM 2,039 GB/s (PCIe 1,935),
    # 40GB 1,555 GB/s.
    KnownGpu("A100 80GB", ("a100", "80gb"), 312e12, 2.039e12),
    KnownGpu("A100 40GB", ("a100",), 312e12, 1.555e12),
    # NVIDIA L40S datasheet: BF16 tensor 362 TFLOPS (dense), 864 GB/s.
    KnownGpu("L40S", ("l40s",), 362e12, 864e9),
    # NVIDIA L4 datasheet: BF16 tensor 121 TFLOPS (dense; 242 with sparsity), 300 GB/s.
    KnownGpu("L4", ("l4",), 121e12, 300e9),
    # A10G (AWS G5): no NVIDIA datasheet; AWS/Baseten give 70 TFLOPS FP16 tensor, 600 GB/s.
    KnownGpu("A10G", ("a10g",), 70e12, 600e9),
    # NVIDIA A10 datasheet: BF16 tensor 125 TFLOPS (dense), 600 GB/s.
    KnownGpu("A10", ("a10",), 125e12, 600e9),
    # NVIDIA Ada whitepaper, RTX 4090: FP16/BF16 tensor with FP32 accumulate 165.2 TFLOPS
    # (dense), GDDR6X 1,008 GB/s.
    KnownGpu("RTX 4090", ("4090",), 165.2e12, 1.008e12),
)


def known_gpu(name: str) -> KnownGpu | None:
    """The first `KNOWN_GPUS` row matching a device name (case-insensitive), or None."""
    low = name.lower()
    for gpu in KNOWN_GPUS:
        if all(re.search(rf"(?<![a-z0-9]){re.escape(t)}(?![a-z0-9])", low) for t in gpu.tokens):
            return gpu
    return None

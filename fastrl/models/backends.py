"""Which attention backend a device gets: fastrl's paged kernel where one runs, else PyTorch's (`PagedSdpa`)."""

from __future__ import annotations

import torch

from fastrl.models.attention import AttentionBackend
from fastrl.models.cpu_attention import PagedCpuAttention


def attention_backend(
    device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int, int]], page_size: int
) -> AttentionBackend | None:
    """The C++ kernel's backend on a CPU, the Triton kernel's on a CUDA device (checked there on the attention
    `shapes` it will see: (heads, kv heads, head size) per model, at `page_size`), or None (`PagedSdpa`) where the
    kernel cannot be built or fails its check (each says why in a warning) and on other devices."""
    if device.type == "cpu":
        return PagedCpuAttention.load()
    if device.type == "cuda":
        from fastrl.models.gpu_attention import PagedTritonAttention

        return PagedTritonAttention.load(device, dtype, shapes, page_size)
    return None

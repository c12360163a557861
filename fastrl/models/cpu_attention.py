"""The CPU attention backend: decode-sized forwards read each row's pages in place, over the row's own keys.

`scaled_dot_product_attention` on a CPU attends every row over the batch's longest row (the mask pads the rest),
through a kernel made for long query blocks: at one query per row it runs at a few GFLOP/s, and a ragged batch pays
for its longest row in every row. `PagedCpuAttention` hands forwards of at most `MAX_QUERIES` new tokens per row
(plain decode, a chain's verify, drafter steps), and of up to `RAGGED_MAX_QUERIES` on a ragged batch, to fastrl's
paged attention kernel (`fastrl/models/kernels/paged_attention.cpp`, built at first use): it follows the page table
itself (no gather, no view), stops at each row's extent and skips what the mask hides. Other forwards (prefill, wide
trees), dtypes and head sizes the kernel has no instance for, and machines where it cannot be built go to
`PagedSdpa`, whose result it matches to rounding (tests/models/test_cpu_attention.py).
"""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fastrl.models.attention import AttentionMetadata, PagedSdpa
from fastrl.models.kernel_build import load_kernel

if TYPE_CHECKING:
    from fastrl.models.kv_cache import KVCache

# Measured with `python -m fastrl.bench.attention`: at 1 new token per row the kernel is 1.2-1.7x PyTorch on equal
# rows and ~5x on long-tail ones; at 4 (a 3_1_4 verify) 0.73-1.05x on equal 100-token rows and ~3x on long-tail ones.
MAX_QUERIES = 4  # new tokens per row up to which every forward goes to the kernel
RAGGED_MAX_QUERIES = 32  # up to this many on ragged batches: the keys the rows reach, at most
RAGGED_DENSITY = 0.5  # this fraction of rows x the longest row (dense, SDPA is ~2x faster per key from 6 queries)
HEAD_DIMS = (16, 32, 64, 80, 96, 128, 256)  # the kernel's instances
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGS = [_P] * 7 + [_I] * 8 + [_P, _P, ctypes.c_double, _P]


class PagedCpuAttention:
    """The paged attention kernel where it applies, `PagedSdpa` elsewhere (see the module's docstring)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.fallback = PagedSdpa()
        self._entry = {}
        for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64")):
            fn = getattr(library, f"fastrl_paged_attention_{suffix}")
            fn.argtypes, fn.restype = _ARGS, ctypes.c_int
            self._entry[dtype] = fn
        self.tile = int(library.fastrl_paged_attention_tile())

    @classmethod
    def load(cls) -> PagedCpuAttention | None:
        """The backend, or None where the kernel cannot be built (a warning says why)."""
        library = load_kernel("paged_attention")
        return None if library is None else cls(library)

    def applies(self, cache: KVCache, q: Tensor, meta: AttentionMetadata) -> bool:
        """Whether this forward goes to the kernel: a few new tokens per row, or a few more on a ragged batch (the
        extents are read as host memory: on a CPU no device sync).  # q [B,h,S,hd]"""
        if q.device.type != "cpu" or meta.extents is None:
            return False
        queries = q.shape[2]
        if queries > MAX_QUERIES and (
            queries > RAGGED_MAX_QUERIES
            or meta.extents.numpy().sum() > RAGGED_DENSITY * q.shape[0] * meta.mask.shape[-1]
        ):
            return False
        return (
            q.dtype in self._entry
            and cache.k.dtype == q.dtype
            and q.shape[-1] in HEAD_DIMS
            and q.stride(-1) == 1
            and meta.pages.stride(-1) == 1
        )

    def attend(
        self, cache: KVCache, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: AttentionMetadata, gqa: bool
    ) -> Tensor:
        """# q [B,h,S,hd], k/v [B,kvh,S,hd] -> [B,h,S,hd]"""
        if not self.applies(cache, q, meta):
            return self.fallback.attend(cache, layer, q, k, v, meta, gqa)
        cache.store(layer, meta.write, k, v)
        b, h, s, hd = q.shape
        mask = meta.mask.view(torch.uint8).contiguous()  # [B,1,S,L]
        out = torch.empty(b, s, h, hd, dtype=q.dtype).transpose(1, 2)  # what o_proj reads after its transpose
        scores = torch.empty(self.tile, mask.shape[-1], dtype=q.dtype)
        strides = torch.tensor([*q.stride()[:3], *out.stride()[:3]], dtype=torch.long)
        failed = self._entry[q.dtype](
            q.data_ptr(),
            cache.k[layer].data_ptr(),
            cache.v[layer].data_ptr(),
            meta.pages.data_ptr(),
            mask.data_ptr(),
            meta.extents.data_ptr(),
            out.data_ptr(),
            b,
            h,
            cache.num_kv_heads,
            s,
            hd,
            mask.shape[-1],
            meta.pages.stride(0),
            cache.page_size,
            strides.data_ptr(),
            strides.data_ptr() + 3 * strides.element_size(),
            1 / math.sqrt(hd),
            scores.data_ptr(),
        )
        if failed:
            raise RuntimeError(f"paged attention kernel: no instance for head size {hd}")
        return out

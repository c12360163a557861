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
from dataclasses import dataclass, replace
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
_ARGS = [_P] * 7 + [_I] * 14 + [ctypes.c_double, _P]


@dataclass(frozen=True)
class KernelPlan:
    """What every layer of a forward the kernel takes hands it: the mask as bytes, each row's extent (1 + the last
    key its queries may attend: the kernel reads no further) and the score scratch.

    mask [B,1,S,L] uint8 contiguous; extents [B] long; scores [tile, L]
    """

    mask: Tensor
    extents: Tensor
    scores: Tensor


class PagedCpuAttention:
    """The paged attention kernel where it applies, `PagedSdpa` elsewhere (see the module's docstring). Where it
    applies is decided once per forward (`plan`), from the queries per row and, past `MAX_QUERIES`, from how far
    the rows reach."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.fallback = PagedSdpa()
        self._entry = {}
        for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64")):
            fn = getattr(library, f"fastrl_paged_attention_{suffix}")
            fn.argtypes, fn.restype = _ARGS, ctypes.c_int
            self._entry[dtype] = fn
        self._extents = library.fastrl_mask_extents
        self._extents.argtypes, self._extents.restype = [_P, _I, _I, _I, _P], ctypes.c_int64
        self.tile = int(library.fastrl_paged_attention_tile())

    @classmethod
    def load(cls) -> PagedCpuAttention | None:
        """The backend, or None where the kernel cannot be built (a warning says why)."""
        library = load_kernel("paged_attention")
        return None if library is None else cls(library)

    def plan(self, cache: KVCache, meta: AttentionMetadata) -> AttentionMetadata:
        """`meta` with a `KernelPlan` when this forward goes to the kernel (a few new tokens per row, or a few more
        on a ragged batch), else with what `PagedSdpa` prepares.  # meta.mask [B,1,S,L] bool"""
        kernel = self.kernel_plan(cache, meta, dense=False)
        return self.fallback.plan(cache, meta) if kernel is None else replace(meta, kernel=kernel)

    def kernel_plan(self, cache: KVCache, meta: AttentionMetadata, dense: bool = True) -> KernelPlan | None:
        """The kernel's inputs for this forward, or None where it has no instance (device, dtype, head size, more
        than `RAGGED_MAX_QUERIES` new tokens per row); `dense=False` also declines what `PagedSdpa` runs faster:
        more than `MAX_QUERIES` new tokens per row on rows reaching more than `RAGGED_DENSITY` of the padded keys.
        # meta.mask [B,1,S,L] bool"""
        rows, _, queries, length = meta.mask.shape
        if (
            cache.device.type != "cpu"
            or cache.dtype not in self._entry
            or cache.head_dim not in HEAD_DIMS
            or queries > RAGGED_MAX_QUERIES
            or meta.pages.stride(-1) != 1
        ):
            return None
        mask = meta.mask.view(torch.uint8).contiguous()
        extents = torch.empty(rows, dtype=torch.long)
        reach = self._extents(mask.data_ptr(), rows, queries, length, extents.data_ptr())
        if not dense and queries > MAX_QUERIES and reach > RAGGED_DENSITY * rows * length:
            return None
        return KernelPlan(mask, extents, torch.empty(self.tile, length, dtype=cache.dtype))

    def attend(
        self, cache: KVCache, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: AttentionMetadata, gqa: bool
    ) -> Tensor:
        """# q [B,h,S,hd], k/v [B,kvh,S,hd] -> [B,h,S,hd]"""
        plan = meta.kernel
        if plan is None or q.stride(-1) != 1 or q.dtype != cache.dtype:
            return self.fallback.attend(cache, layer, q, k, v, meta, gqa)
        cache.store(layer, meta.write, k, v)
        b, h, s, hd = q.shape
        out = torch.empty(b, s, h, hd, dtype=q.dtype).transpose(1, 2)  # what o_proj reads after its transpose
        failed = self._entry[q.dtype](
            q.data_ptr(),
            cache.k[layer].data_ptr(),
            cache.v[layer].data_ptr(),
            meta.pages.data_ptr(),
            plan.mask.data_ptr(),
            plan.extents.data_ptr(),
            out.data_ptr(),
            b,
            h,
            cache.num_kv_heads,
            s,
            hd,
            plan.mask.shape[-1],
            meta.pages.stride(0),
            cache.page_size,
            *q.stride()[:3],
            *out.stride()[:3],
            1 / math.sqrt(hd),
            plan.scores.data_ptr(),
        )
        if failed:
            raise RuntimeError(f"paged attention kernel: no instance for head size {hd}")
        return out

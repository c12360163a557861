"""The GPU attention backend: decode-sized forwards read each row's pages in place, in a Triton kernel.

`PagedSdpa` gathers every row's pages into `[B, kvh, L, hd]` at every layer and attends over the batch's longest row
(on a CUDA-graph round, over the whole context length the graph was captured for). `PagedTritonAttention` hands
forwards of at most `MAX_QUERIES` new tokens per row (plain decode, tree verify, drafter steps) to
`fastrl.models.triton_kernels.paged_attention`, which follows the page table itself, stops at each row's extent and
skips blocks of keys none of the row's queries may attend (a drafter step's gap between the row's prefix and the
tree area at the end of the context), both computed on the device once per forward (no host sync: a CUDA graph
captures them and each replay reads the lengths of its own batch). Prefill and what Triton cannot run go to
`PagedSdpa`. Few rows over many keys split each row's keys over several programs (flash-decoding), so the GPU stays
busy at batch 1.

With `TRITON_INTERPRET=1` set before Triton is imported, Triton's interpreter runs the same kernels on CPU tensors:
how the tests check them on a machine without a GPU (tests/models/test_gpu_attention.py; on a GPU the same tests
check the compiled kernels).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fastrl.models.attention import AttentionMetadata, PagedSdpa
from fastrl.models.kernel_check import passes_check

if TYPE_CHECKING:
    from fastrl.models.kv_cache import KVCache

log = logging.getLogger(__name__)

MAX_QUERIES = 64  # new tokens per row up to which a forward goes to the kernel (the widest tree verify)
MAX_BLOCK_M = 64  # query heads x new tokens per program
TARGET_PROGRAMS = 264  # split rows' keys until a forward has this many programs (2 per SM of an H100)
MIN_SPLIT_KEYS = 256  # ... but never below this many keys a split
MAX_SPLITS = 64
COMBINE_VALUES = 4096  # values of the splits' outputs one merging program holds (its rows x SPLITS x DIM_BLOCK)
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Compiled for a GPU, float64 products do not lower to its matrix units (Triton 3.6: "fp64 don't support largeK
# MMA"): float64 caches there go to PagedSdpa; Triton's interpreter (CPU tensors) runs every type in DTYPES.
GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Keys per block and software-pipelining stages by element size: 64 x 128 tiles of K and V fit shared memory
# three deep in 16 bits, two in 32; float64 takes blocks of 32, one deep.
TILING = {2: (64, 3), 4: (64, 2), 8: (32, 1)}
CHECK_QUERIES = (1, 4, MAX_QUERIES)  # new tokens per row of the load-time check's forwards


def kernel_dtypes(device: torch.device) -> tuple[torch.dtype, ...]:
    """The cache types the kernel takes on `device`."""
    return GPU_DTYPES if device.type == "cuda" else DTYPES


def block_keys(dtype: torch.dtype) -> int:
    """Keys per block of the kernel for cache entries of `dtype` (the plan's block flags use the same)."""
    return TILING[dtype.itemsize][0]


@dataclass(frozen=True)
class TritonPlan:
    """What every layer of a forward the kernel takes reads, computed on the device: the mask as bytes, each row's
    extent (1 + the last key its queries may attend; the kernel reads no further) and, per block of `block_keys`
    keys, whether any of its queries may attend one (the kernel skips the others).

    mask [B,1,S,L] uint8; extents [B] int32; blocks [B,ceil(L/block_keys)] uint8
    """

    mask: Tensor
    extents: Tensor
    blocks: Tensor


class PagedTritonAttention:
    """The Triton paged attention kernel for forwards of a few new tokens per row, `PagedSdpa` for the rest (see
    the module's docstring)."""

    def __init__(self, target_programs: int = TARGET_PROGRAMS) -> None:
        import triton

        from fastrl.models import triton_kernels

        self.target_programs = target_programs
        self.fallback = PagedSdpa()
        self._attention = triton.jit(triton_kernels.paged_attention)
        self._combine = triton.jit(triton_kernels.combine_splits)
        self._next_power_of_2 = triton.next_power_of_2
        self._tl_dtype = {torch.float32: triton.language.float32, torch.float64: triton.language.float64}

    @classmethod
    def load(
        cls, device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int, int]], page_size: int
    ) -> PagedTritonAttention | None:
        """The backend for a CUDA `device` and cache `dtype`, or None (a warning says why) where Triton is missing,
        or the kernel does not compile or does not match `PagedSdpa` there, on forwards of every attention shape
        it will see (`shapes`: (heads, kv heads, head size) of the policy and the drafter) at `page_size`, with 1, 4
        and 64 new tokens per row and keys split as far as they go."""
        try:
            import triton  # noqa: F401
        except ImportError:
            log.warning("Triton is not installed: GPU attention gathers each row's pages (PagedSdpa)")
            return None
        if dtype not in kernel_dtypes(torch.device(device)):
            return None
        programs = 2 * torch.cuda.get_device_properties(device).multi_processor_count
        backend = cls(target_programs=programs)
        keys = 2 * MAX_SPLITS * MIN_SPLIT_KEYS
        shapes = list(dict.fromkeys(shapes))

        def check() -> str | None:
            return next(
                (e for shape in shapes if (e := backend.self_check(device, dtype, shape, page_size, keys))), None
            )

        if not passes_check("the Triton paged attention kernel", check, "using PagedSdpa"):
            return None
        return backend

    def self_check(
        self,
        device: torch.device | str,
        dtype: torch.dtype = torch.float32,
        shape: tuple[int, int, int] = (6, 2, 32),
        page_size: int = 16,
        keys: int = 600,
    ) -> str | None:
        """Forwards of 1, 4 and 64 new tokens per row over three ragged rows (one of ~`keys` keys, a shuffled page
        table, a tree among the new tokens) in `dtype` at `shape` (heads, kv heads, head size), against `PagedSdpa`
        in float64 on the same values: what differs, or None."""
        from fastrl.models.kv_cache import KVCache, PageTable
        from fastrl.models.masks import attention_mask

        heads, kv_heads, dim = shape
        gen = torch.Generator().manual_seed(0)
        bound = 1e-9 if dtype == torch.float64 else 1e-4 if dtype == torch.float32 else 3e-2
        for queries in CHECK_QUERIES:
            rows, width = 3, keys + queries + page_size
            columns = -(-width // page_size)
            table = PageTable(rows, width, page_size, rows * columns + 5, page_size, device)
            pages = torch.randperm(rows * columns + 5, generator=gen)[: rows * columns]
            table.map([r for r in range(rows) for _ in range(columns)], list(range(columns)) * rows, pages.tolist())
            pair = ((torch.float64, None), (dtype, self))
            caches = [KVCache(1, rows, width, kv_heads, dim, t, device, table, b) for t, b in pair]
            for name in ("k", "v"):
                values = torch.randn(getattr(caches[0], name).shape, generator=gen).to(device, dtype)
                for cache in caches:
                    getattr(cache, name).copy_(values)
            lengths = torch.tensor([[3], [keys], [90]])
            index = (lengths + torch.arange(queries)).to(device)
            raw = (torch.arange(width).view(1, 1, -1) < lengths.unsqueeze(-1)).expand(rows, queries, -1).clone()
            new = torch.arange(queries)
            tree = (new.unsqueeze(0) <= new.unsqueeze(1)) & ~(
                (new.unsqueeze(1) % 3 == 2) & (new == new.unsqueeze(1) - 1)
            )
            for b in range(rows):
                raw[b, :, lengths[b, 0] : lengths[b, 0] + queries] = tree
            mask = attention_mask(index, index, raw.to(device))
            q = torch.randn(rows, heads, queries, dim, generator=gen).to(device, dtype)
            k, v = (torch.randn(rows, kv_heads, queries, dim, generator=gen).to(device, dtype) for _ in range(2))
            slots = torch.arange(rows, device=device)
            meta = caches[1].metadata(slots, index, mask)
            if not isinstance(meta.kernel, TritonPlan):
                return f"the kernel did not take a {queries}-token forward"
            gqa = heads != kv_heads
            got = caches[1].attend(0, q, k, v, meta, gqa).double()
            meta64 = caches[0].metadata(slots, index, mask)
            want = caches[0].attend(0, q.double(), k.double(), v.double(), meta64, gqa)
            diff = (got - want).abs().max().item()
            if not diff <= bound:
                return f"max |difference| {diff:.2e} from PagedSdpa in {dtype}, shape {shape}, {queries} new tokens"
        return None

    def plan(self, cache: KVCache, meta: AttentionMetadata) -> AttentionMetadata:
        """`meta` with a `TritonPlan` when this forward goes to the kernel, else with what `PagedSdpa` prepares.
        # meta.mask [B,1,S,L] bool"""
        rows, _, queries, length = meta.mask.shape
        if cache.dtype not in kernel_dtypes(meta.mask.device) or queries > MAX_QUERIES or meta.pages.stride(-1) != 1:
            return self.fallback.plan(cache, meta)
        seen = meta.mask.any(dim=2).squeeze(1)  # [B,L]
        keys = torch.arange(1, length + 1, device=meta.mask.device, dtype=torch.int32)
        extents = (seen * keys).amax(dim=-1).to(torch.int32)
        block = block_keys(cache.dtype)
        padded = torch.nn.functional.pad(seen, (0, -length % block))
        blocks = padded.view(rows, -1, block).any(dim=-1).to(torch.uint8)
        return replace(meta, kernel=TritonPlan(meta.mask.view(torch.uint8).contiguous(), extents, blocks))

    def launch_shape(self, rows: int, heads: int, kv_heads: int, queries: int, length: int) -> tuple[int, int, int]:
        """(BLOCK_M, query tiles, SPLITS) for a forward: tiles of query heads x new tokens; splits of each row's
        keys (a power of two) while the programs fall short of `target_programs` and a split keeps
        `MIN_SPLIT_KEYS` keys.  # host"""
        group = heads // kv_heads
        block_m = min(MAX_BLOCK_M, max(16, self._next_power_of_2(group * queries)))
        if group > block_m:
            block_m = self._next_power_of_2(group)
        tiles = -(-queries // (block_m // group))
        splits = 1
        while (
            splits < MAX_SPLITS
            and rows * kv_heads * tiles * splits * 2 <= self.target_programs
            and length >= 2 * splits * MIN_SPLIT_KEYS
        ):
            splits *= 2
        return block_m, tiles, splits

    def attend(
        self, cache: KVCache, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: AttentionMetadata, gqa: bool
    ) -> Tensor:
        """# q [B,h,S,hd], k/v [B,kvh,S,hd] -> [B,h,S,hd]"""
        plan = meta.kernel
        if not isinstance(plan, TritonPlan) or q.stride(-1) != 1 or q.dtype != cache.dtype:
            return self.fallback.attend(cache, layer, q, k, v, meta, gqa)
        cache.store(layer, meta.write, k, v)
        b, h, s, hd = q.shape
        kvh = cache.num_kv_heads
        block_m, tiles, splits = self.launch_shape(b, h, kvh, s, plan.mask.shape[-1])
        block_n, stages = TILING[q.dtype.itemsize]
        dim_block = max(16, self._next_power_of_2(hd))
        out = torch.empty(b, s, h, hd, dtype=q.dtype, device=q.device).transpose(1, 2)  # what o_proj reads
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        part = stats = out  # unused when SPLITS is 1
        if splits > 1:
            part = torch.empty(b * s * h * splits * dim_block, dtype=acc, device=q.device)
            stats = torch.empty(b * s * h * splits * 2, dtype=acc, device=q.device)
        self._attention[(b, kvh, tiles * splits)](
            q,
            cache.k[layer],
            cache.v[layer],
            meta.pages,
            plan.mask,
            plan.extents,
            plan.blocks,
            out,
            part,
            stats,
            s,
            *q.stride()[:3],
            *out.stride()[:3],
            meta.pages.stride(0),
            plan.mask.stride(0),
            plan.mask.stride(2),
            plan.blocks.stride(0),
            kvh * hd,
            SCALE=hd**-0.5,
            GROUP=h // kvh,
            HEAD_DIM=hd,
            DIM_BLOCK=dim_block,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            PAGE_SIZE=cache.page_size,
            SPLITS=splits,
            ACC=self._tl_dtype[acc],
            PRECISION="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",  # 16-bit: Triton's default
            num_stages=stages,
        )
        if splits > 1:
            triples = b * s * h
            block_r = max(1, COMBINE_VALUES // (splits * dim_block))  # powers of two: so is this
            self._combine[(-(-triples // block_r),)](
                part,
                stats,
                out,
                triples,
                h,
                s,
                *out.stride()[:3],
                HEAD_DIM=hd,
                DIM_BLOCK=dim_block,
                SPLITS=splits,
                BLOCK_R=block_r,
            )
        return out

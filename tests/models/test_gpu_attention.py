"""The Triton paged attention kernel against scaled_dot_product_attention over the same pages, on randomised
batches (ragged rows, shuffled page tables, trees, padding rows, GQA shapes, split keys, every float type): compiled
on a GPU where there is one, else in Triton's interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.attention import PagedSdpa
from fastrl.models.gpu_attention import (
    MAX_QUERIES,
    MAX_SPLITS,
    PagedTritonAttention,
    TritonPlan,
    block_keys,
    kernel_dtypes,
)
from fastrl.models.kv_cache import KVCache, PageTable
from fastrl.models.masks import attention_mask
from fastrl.strategy.strategy import Strategy
from tests.helpers import kernel_test_setup, random_tree_mask, triton_or_skip

triton_or_skip()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(6, 2, 32), (4, 4, 64), (9, 3, 64), (8, 1, 128), (2, 2, 16), (4, 2, 80), (12, 2, 64)]  # h, kvh, hd
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _random_forward(rng: random.Random, dtype: torch.dtype, queries: int, device: str, long_rows: bool):
    """Two caches over one shuffled page table holding the same entries, `PagedSdpa`'s in float64 (the reference)
    and the kernel's in `dtype`, and one forward's inputs in `dtype`: ragged rows, `queries` new tokens per row
    under a random tree, some rows padding."""
    heads, kv_heads, dim = rng.choice(SHAPES)
    rows, page_size = rng.randint(1, 5), rng.choice([1, 4, 16])
    lengths = [rng.randint(1, 90) for _ in range(rows)]
    if long_rows:
        lengths[rng.randrange(rows)] = rng.randint(600, 1500)
    width = max(lengths) + queries
    columns = math.ceil(width / page_size)
    table = PageTable(rows, width, page_size, rows * columns + 3, page_size, device)
    pages = torch.randperm(rows * columns + 3)[: rows * columns]
    table.map([r for r in range(rows) for _ in range(columns)], list(range(columns)) * rows, pages.tolist())
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    caches = [
        KVCache(2, rows, width, kv_heads, dim, t, device, table, b)
        for t, b in ((torch.float64, PagedSdpa()), (dtype, None))
    ]
    for name in ("k", "v"):
        values = torch.randn(getattr(caches[0], name).shape, generator=gen, dtype=torch.float64).to(device, dtype)
        for cache in caches:
            getattr(cache, name).copy_(values)
    index, raw = random_tree_mask(rng, lengths, queries, width)
    index, raw = index.to(device), raw.to(device)
    mask = attention_mask(index, index, raw)
    q = torch.randn(rows, queries, heads, dim, generator=gen, dtype=torch.float64).to(device, dtype).transpose(1, 2)
    k, v = (torch.randn(rows, kv_heads, queries, dim, generator=gen).to(device, dtype) for _ in range(2))
    return caches, torch.arange(rows, device=device), index, mask, q, k, v, raw


def _check_against_sdpa(backend: PagedTritonAttention, rng: random.Random, dtype, queries, device, long_rows=False):
    """One random forward through both backends: the same stored entries, outputs within the dtype's rounding."""
    (sdpa, mine), slots, index, mask, q, k, v, raw = _random_forward(rng, dtype, queries, device, long_rows)
    mine.backend = backend
    gqa = q.shape[1] != k.shape[1]
    reference = sdpa.attend(1, q.double(), k.double(), v.double(), sdpa.metadata(slots, index, mask), gqa)
    meta = mine.metadata(slots, index, mask)
    assert isinstance(meta.kernel, TritonPlan)
    extents = (mask.any(dim=2).squeeze(1) * torch.arange(1, mask.shape[-1] + 1, device=device)).amax(-1)
    assert torch.equal(meta.kernel.extents.long(), extents)
    got = mine.attend(1, q, k, v, meta, gqa)
    assert got.dtype == dtype and got.shape == q.shape and torch.isfinite(got).all()
    seen = raw.any(-1)  # [B,S]: padding queries' outputs are meaningless
    diff = (got.double() - reference).abs().transpose(1, 2)[seen]
    if diff.numel():
        assert diff.max().item() <= TOLERANCE[dtype] * max(1.0, reference.abs().max().item())
    assert torch.equal(mine.k[1].double(), sdpa.k[1].double())  # the new entries stored where PagedSdpa stores them
    return backend.launch_shape(q.shape[0], q.shape[1], k.shape[1], queries, mask.shape[-1])


CASES = 60 if DEVICE == "cuda" else 12  # the interpreter runs a program at a time in NumPy


@pytest.fixture(scope="module")
def backend() -> PagedTritonAttention:
    return PagedTritonAttention(target_programs=64)


# Triton's interpreter casts bfloat16 as float16 (its NumPy has no bfloat16): that dtype is checked compiled only.
DTYPES = [
    t for t in (torch.float32, torch.float64, torch.float16, torch.bfloat16) if t in kernel_dtypes(torch.device(DEVICE))
]
DTYPES = DTYPES if DEVICE == "cuda" else DTYPES[:3]  # bfloat16 in the interpreter: as float16, four times slower
ENGINE_DTYPE = "float32" if DEVICE == "cuda" else "float64"  # the widest type the kernel takes there


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernel_matches_sdpa_on_random_batches(backend, dtype):
    rng = random.Random({torch.float32: 1, torch.float64: 2, torch.bfloat16: 3, torch.float16: 4}[dtype])
    splits, tiles = set(), set()
    for case in range(CASES):
        queries = [1, 1, 2, 4, rng.randint(5, 13), rng.randint(33, MAX_QUERIES)][case % 6]
        _, tile_count, split = _check_against_sdpa(backend, rng, dtype, queries, DEVICE, case % 3 == 0)
        splits.add(split > 1)
        tiles.add(tile_count > 1)
    assert splits == {True, False} and True in tiles  # split keys and several query tiles were both exercised


@pytest.mark.parametrize("dtype", DTYPES[:2])
def test_blocks_no_query_may_attend_are_never_read(backend, dtype):
    """A drafter step's rows: keys [1, n_b] and a tree area past the longest row, with a gap between them. The gap's
    whole blocks hold NaN for the kernel (any of them read would make the output NaN: 0 x NaN) and zeros for the
    reference (masked keys in a block that is read must be finite, as the cache's are)."""
    rng = random.Random(9)
    for _ in range(4):
        heads, kv_heads, dim = rng.choice(SHAPES)
        rows, page_size, nodes = rng.randint(1, 4), rng.choice([4, 16]), rng.randint(1, 6)
        lengths = [rng.randint(1, 60) for _ in range(rows)]
        base = max(lengths) + rng.randint(200, 400)  # a graph's base: far past every row
        width = base + 1 + nodes
        columns = math.ceil(width / page_size)
        table = PageTable(rows, width, page_size, rows * columns, page_size, DEVICE)
        pages = torch.randperm(rows * columns)
        table.map([r for r in range(rows) for _ in range(columns)], list(range(columns)) * rows, pages.tolist())
        pair = ((torch.float64, PagedSdpa()), (dtype, backend))
        reference, mine = (KVCache(1, rows, width, kv_heads, dim, t, DEVICE, table, b) for t, b in pair)
        keys = torch.arange(width)
        index = torch.tensor([[base + 1 + i for i in range(nodes)] for _ in lengths], device=DEVICE)
        raw = torch.stack([(keys >= 1) & (keys <= n) for n in lengths]).unsqueeze(1).expand(rows, nodes, width).clone()
        for i in range(nodes):
            raw[:, i, base + 1 : base + 2 + i] = True  # a chain in the tree area
        mask = attention_mask(index, index, raw.to(DEVICE))
        block = block_keys(dtype)
        seen = torch.nn.functional.pad(raw.any(1), (0, -width % block)).view(rows, -1, block).any(-1)
        gap = ~seen.repeat_interleave(block, dim=1)[:, :width]  # [B,L]: keys in blocks no query of the row attends
        for name in ("k", "v"):
            values = torch.randn(getattr(reference, name).shape, dtype=torch.float64).to(DEVICE, dtype)
            getattr(reference, name).copy_(values)
            getattr(mine, name).copy_(values)
            for b in range(rows):  # the gap's physical entries
                gapped = keys[gap[b]].to(DEVICE)  # the mask's keys are built on the CPU, the table is on DEVICE
                entries = table.table[b, gapped // page_size] * page_size + gapped % page_size
                getattr(reference, name)[0, entries] = 0.0
                getattr(mine, name)[0, entries] = float("nan")
        q = torch.randn(rows, heads, nodes, dim, dtype=torch.float64).to(DEVICE, dtype)
        k, v = (torch.randn(rows, kv_heads, nodes, dim, dtype=torch.float64).to(DEVICE, dtype) for _ in range(2))
        slots, gqa = torch.arange(rows, device=DEVICE), heads != kv_heads
        meta = mine.metadata(slots, index, mask)
        assert not meta.kernel.blocks.all()  # the gap holds whole blocks
        got = mine.attend(0, q, k, v, meta, gqa).double()
        want = reference.attend(0, q.double(), k.double(), v.double(), reference.metadata(slots, index, mask), gqa)
        assert torch.isfinite(got).all() and (got - want).abs().max().item() <= TOLERANCE[dtype]
        assert meta.kernel.blocks.shape[-1] == -(-width // block_keys(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_self_check_passes(backend, dtype):
    assert backend.self_check(DEVICE, dtype) is None


def test_launch_shapes_split_keys_only_where_programs_are_few():
    backend = PagedTritonAttention(target_programs=264)
    assert backend.launch_shape(256, 6, 2, 1, 4096) == (16, 1, 1)  # 512 programs: no split
    block_m, tiles, splits = backend.launch_shape(1, 6, 2, 1, 4096)
    assert (tiles, splits) == (1, 16)  # 2 programs over 4096 keys: 16 splits of 256 keys
    assert backend.launch_shape(1, 6, 2, 1, 1024)[2] == 4  # 4 splits of 256 keys
    assert backend.launch_shape(1, 6, 2, 1, 10**6)[2] == MAX_SPLITS
    assert backend.launch_shape(1, 6, 2, 1, 300)[2] == 1  # too few keys to split
    assert backend.launch_shape(4, 32, 8, 13, 8192) == (64, 1, 8)  # 4 heads x 13 tokens in one tile
    assert backend.launch_shape(4, 32, 8, 20, 8192) == (64, 2, 4)  # 4 heads x 20 tokens: two tiles of 16 tokens
    assert backend.launch_shape(1, 64, 2, 1, 100)[0] == 32  # a head group wider than 16 fills one tile


def test_what_the_kernel_does_not_take_goes_to_sdpa(backend):
    rng = random.Random(5)
    (sdpa, mine), slots, index, mask, q, k, v, _ = _random_forward(rng, torch.float64, MAX_QUERIES + 1, DEVICE, False)
    mine.backend = backend
    meta = mine.metadata(slots, index, mask)
    assert meta.kernel is None
    expected = sdpa.attend(0, q, k, v, sdpa.metadata(slots, index, mask), q.shape[1] != k.shape[1])
    assert torch.equal(mine.attend(0, q, k, v, meta, q.shape[1] != k.shape[1]), expected)


@pytest.mark.gpu
def test_the_kernel_loads_on_a_gpu():
    backend = PagedTritonAttention.load(
        torch.device("cuda"), torch.bfloat16, [(16, 4, 64), (9, 3, 64), (32, 8, 128)], 16
    )
    assert backend is not None, "the kernel failed its load-time check on this GPU"
    assert backend.target_programs == 2 * torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.parametrize("strategy", ["disable", "3_1_4", "2_2_4"])
def test_an_engine_attending_with_the_kernel_generates_what_it_does_with_pytorch(backend, tmp_path, strategy):
    """Prefill (prompts of <= 64 tokens go to the kernel too), plain rounds, drafter steps and tree verifies: the
    same tokens as the same engine on `PagedSdpa`, log-probs to float64 rounding (to float32's on a GPU)."""
    model, drafter, inputs = kernel_test_setup(tmp_path, strategy, seed=6, requests=5, max_new=20)
    outputs = []
    for use in (True, False):
        config = EngineConfig(3, 80, DEVICE, ENGINE_DTYPE, cuda_graphs=False, attention_kernel=False)  # PagedSdpa
        engine = Engine(model, config, drafter=drafter, selector=FixedSelector(Strategy.parse(strategy)))
        calls: list[int] = []
        if use:
            attention = backend._attention
            counted = PagedTritonAttention(backend.target_programs)
            counted._attention = _Counted(attention, calls)
            for cache in engine.runner.caches:
                cache.backend = counted
        outputs.append(engine.generate(inputs))
        assert not use or len(calls) > 20
    for with_kernel, without in zip(*outputs, strict=True):
        assert with_kernel.token_ids == without.token_ids
        bound = 1e-9 if ENGINE_DTYPE == "float64" else 1e-4
        assert max(abs(a - b) for a, b in zip(with_kernel.logprobs, without.logprobs, strict=True)) < bound


class _Counted:
    """A kernel launcher that counts its launches."""

    def __init__(self, kernel, calls: list[int]) -> None:
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        self.calls.append(1)
        return self.kernel[grid]

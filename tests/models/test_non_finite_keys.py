"""Keys and values that are not finite reach only the queries that may see them, in every attention backend.

In the products of attention a masked key enters as 0 x its value, and 0 x NaN is NaN: a drafted token whose
values are not finite (a NaN or an overflow in the policy's forward of a token it will reject) would make every node
of its tree NaN, and the request would end in an error that plain decoding, which never computes that token, does
not have. Random paged forwards (ragged rows, trees, padding rows, GQA): some new nodes' keys or values and some
stale entries past a row's keys are NaN or infinite; a query that sees none of them gets what it gets with them
finite, one that sees one gets NaN.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from fastrl.models.attention import PagedSdpa
from fastrl.models.cpu_attention import PagedCpuAttention
from fastrl.models.kv_cache import KVCache, PageTable
from fastrl.models.masks import attention_mask
from tests.helpers import random_tree_mask, triton_or_skip

SHAPES = [(6, 2, 32), (4, 4, 64), (9, 3, 64), (2, 2, 16)]  # heads, kv heads, head size
BAD = [float("nan"), float("inf"), float("-inf")]


def _forward(rng: random.Random, queries: int):
    """A random forward's inputs and where its poison lies.  # -> dict"""
    heads, kv_heads, dim = rng.choice(SHAPES)
    rows, page_size = rng.randint(1, 4), rng.choice([1, 4, 16])
    lengths = [rng.randint(1, 60) for _ in range(rows)]
    width = max(lengths) + queries + rng.randint(0, 20)
    columns = math.ceil(width / page_size)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    index, raw = random_tree_mask(rng, lengths, queries, width)
    q = torch.randn(rows, queries, heads, dim, generator=gen, dtype=torch.float64).transpose(1, 2)
    k, v = (torch.randn(rows, kv_heads, queries, dim, generator=gen, dtype=torch.float64) for _ in range(2))
    new_bad = [(b, i) for b in range(rows) for i in range(queries) if rng.random() < 0.25]
    stale_bad = [(b, j) for b, n in enumerate(lengths) for j in range(n + queries, width) if rng.random() < 0.3]
    return dict(
        shape=(rows, kv_heads, dim, width, page_size, columns),
        pool_seed=rng.randrange(2**31),
        index=index,
        mask=attention_mask(index, index, raw),
        raw=raw,
        qkv=(q, k, v),
        new_bad=new_bad,
        stale_bad=stale_bad,
    )


def _attend(case: dict, backend, poisoned: bool, rng: random.Random, with_cache: bool = False):
    """One layer's attention of ``case`` through ``backend`` (None: `PagedSdpa`), with or without its poison; with
    ``with_cache``, also each row's keys and values after the write.  # -> [B,h,S,hd] (, [B,kvh,W,hd] x 2)"""
    rows, kv_heads, dim, width, page_size, columns = case["shape"]
    table = PageTable(rows, width, page_size, rows * columns, page_size, "cpu")
    table.map(
        [r for r in range(rows) for _ in range(columns)], list(range(columns)) * rows, list(range(rows * columns))
    )
    cache = KVCache(1, rows, width, kv_heads, dim, torch.float64, "cpu", table, backend or PagedSdpa())
    gen = torch.Generator().manual_seed(case["pool_seed"])
    for pool in (cache.k[0], cache.v[0]):
        pool.copy_(torch.randn(pool.shape, generator=gen, dtype=torch.float64))
    q, k, v = (t.clone() for t in case["qkv"])
    if poisoned:
        for b, i in case["new_bad"]:
            target = rng.choice([k, v])
            target[b, rng.randrange(kv_heads), i, rng.randrange(dim)] = rng.choice(BAD)
        for b, j in case["stale_bad"]:
            entry = b * columns * page_size + j  # the identity page table: row b's pages follow each other
            rng.choice([cache.k, cache.v])[0, entry, rng.randrange(kv_heads), rng.randrange(dim)] = rng.choice(BAD)
    meta = cache.metadata(torch.arange(rows), case["index"], case["mask"])
    if isinstance(backend, PagedCpuAttention):  # the kernel itself, also where the backend would hand it on
        from dataclasses import replace

        meta = replace(meta, kernel=backend.kernel_plan(cache, meta))
    out = cache.attend(0, q, k, v, meta, q.shape[1] != k.shape[1]).double()
    if not with_cache:
        return out
    return (out, *cache.gather(0, meta.pages, width))


def _by_hand(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """What the products give over the keys a query sees, and those alone.  # [hd], [L,hd] x 2, [L] -> [hd]"""
    scores = keys[visible] @ q / math.sqrt(q.shape[0])
    return scores.softmax(0) @ values[visible]


def _check(backend, seed: int, queries: int, nan_for_values: bool = False) -> int:
    """Poisoned against clean outputs of one random forward; returns the number of queries that saw poison.
    ``nan_for_values``: a query that sees a value that is not finite may be all NaN (the Triton kernel's products
    are matrix products over blocks of keys: it keeps such values out and makes the query NaN instead)."""
    rng = random.Random(seed)
    case = _forward(rng, queries)
    clean = _attend(case, backend, False, random.Random(0))
    got, keys, values = _attend(case, backend, True, random.Random(seed), with_cache=True)
    rows, kv_heads = case["shape"][:2]
    bad = torch.zeros(rows, case["shape"][3], dtype=torch.bool)  # [B,width] entries poisoned (some kv head)
    for b, i in case["new_bad"]:
        bad[b, case["index"][b, i]] = True
    for b, j in case["stale_bad"]:
        bad[b, j] = True
    sees = (case["raw"] & bad[:, None, :]).any(-1)  # [B,S]: the query's mask opens an entry that holds poison
    real = case["raw"].any(-1)
    out, ref = got.transpose(1, 2), clean.transpose(1, 2)  # [B,S,h,hd]
    assert torch.allclose(out[~sees & real], ref[~sees & real], atol=1e-12, rtol=0), seed
    q = case["qkv"][0]
    group = q.shape[1] // kv_heads
    for b, s in sees.nonzero().tolist():
        for h in range(q.shape[1]):
            visible = case["raw"][b, s]
            want = _by_hand(q[b, h, s], keys[b, h // group], values[b, h // group], visible)
            have = got[b, h, s]
            if nan_for_values and not values[b, h // group][visible].isfinite().all():
                assert have.isnan().all(), seed
                continue
            assert torch.equal(want.isfinite(), have.isfinite()), (seed, b, s, h, want, have)
            assert torch.allclose(have[want.isfinite()], want[want.isfinite()], atol=1e-12, rtol=0), seed
    return int(sees.sum())


@pytest.mark.parametrize("queries", [1, 2, 3, 5, 9, 13])
def test_sdpa_keeps_poison_to_the_queries_that_see_it(queries):
    seen = sum(_check(None, seed, queries) for seed in range(30))
    assert seen > 0


@pytest.mark.parametrize("queries", [1, 2, 4, 7, 13])
def test_the_cpu_kernel_keeps_poison_to_the_queries_that_see_it(queries):
    backend = PagedCpuAttention.load()
    if backend is None:
        pytest.skip("the C++ attention kernel cannot be built here")
    seen = sum(_check(backend, 100 + seed, queries) for seed in range(30))
    assert seen > 0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy on the values kept out
@pytest.mark.parametrize("queries", [1, 3, 13])
def test_the_triton_kernel_keeps_poison_to_the_queries_that_see_it(queries):
    """In Triton's interpreter on a CPU (tests/conftest.py), compiled on a GPU."""
    triton_or_skip()
    from fastrl.models.gpu_attention import PagedTritonAttention

    if torch.cuda.is_available():
        pytest.skip("the cases build CPU caches; on a GPU the kernel's own tests run it compiled")
    seen = sum(_check(PagedTritonAttention(target_programs=8), 200 + seed, queries, True) for seed in range(6))
    assert seen > 0

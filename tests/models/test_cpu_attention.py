"""The CPU paged attention kernel against scaled_dot_product_attention over the same pages, on randomised batches
(ragged rows, shuffled page tables, trees, padding rows, GQA shapes, both float types), its fallbacks, its build
cache, and engines with and without it."""

from __future__ import annotations

import logging
import math
import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.attention import PagedSdpa
from fastrl.models.checkpoint import load_model
from fastrl.models.cpu_attention import MAX_QUERIES, RAGGED_DENSITY, PagedCpuAttention
from fastrl.models.kernel_build import load_kernel
from fastrl.models.kv_cache import KVCache, PageTable
from fastrl.models.masks import attention_mask
from fastrl.strategy.strategy import Strategy
from tests.helpers import kernel_test_setup, make_hf_model, random_tree_mask

SHAPES = [
    (6, 2, 32),
    (4, 4, 64),
    (9, 3, 64),
    (8, 1, 128),
    (2, 2, 16),
    (4, 2, 80),
    (2, 1, 256),
]  # heads, kv heads, head size


@pytest.fixture(scope="module")
def kernel() -> PagedCpuAttention:
    backend = PagedCpuAttention.load()
    if backend is None:
        pytest.skip("no C++ compiler on this machine: the kernel cannot be built")
    return backend


def _random_forward(rng: random.Random, dtype: torch.dtype, queries: int):
    """Two caches over one shuffled page table (one per backend) holding the same entries, and a forward's inputs:
    ragged rows, S new tokens per row under a random tree mask over them, some rows padding."""
    heads, kv_heads, dim = rng.choice(SHAPES)
    rows, page_size = rng.randint(1, 6), rng.choice([1, 4, 16])
    lengths = [rng.randint(1, 90) for _ in range(rows)]
    if rng.random() < 0.5:  # a long-tail batch: one long row
        lengths[rng.randrange(rows)] = rng.randint(200, 400)
    width = max(lengths) + queries
    columns = math.ceil(width / page_size)
    table = PageTable(rows, width, page_size, num_pages=rows * columns + 3, scratch_len=page_size)
    pages = torch.randperm(rows * columns + 3)[: rows * columns].view(rows, columns)
    table.map([r for r in range(rows) for _ in range(columns)], list(range(columns)) * rows, pages.reshape(-1).tolist())
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    caches = []
    for backend in (PagedSdpa(), None):
        caches.append(KVCache(2, rows, width, kv_heads, dim, dtype=dtype, table=table, backend=backend))
    for layer in range(2):
        for part in ("k", "v"):
            values = torch.randn(getattr(caches[0], part)[layer].shape, generator=gen, dtype=dtype)
            for cache in caches:
                getattr(cache, part)[layer].copy_(values)
    index, raw = random_tree_mask(rng, lengths, queries, width)  # causal, then a random tree among the new tokens
    mask = attention_mask(index, index, raw)
    q = torch.randn(rows, queries, heads, dim, generator=gen, dtype=dtype).transpose(1, 2)
    k, v = (torch.randn(rows, kv_heads, queries, dim, generator=gen, dtype=dtype) for _ in range(2))
    return caches, torch.arange(rows), index, mask, q, k, v, raw


def _extents(mask: torch.Tensor) -> torch.Tensor:
    """The reference: 1 + the last key any query of each row may attend.  # [B,1,S,L] bool -> [B] long"""
    seen = mask.any(dim=2).squeeze(1)  # [B,L]
    return (seen * torch.arange(1, mask.shape[-1] + 1)).amax(dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_matches_sdpa_over_the_same_pages_on_random_batches(kernel, dtype):
    rng = random.Random(7 if dtype == torch.float32 else 8)
    tolerance = 2e-5 if dtype == torch.float32 else 1e-12
    ragged = 0
    for _ in range(80):
        queries = rng.randint(1, MAX_QUERIES) if rng.random() < 0.6 else rng.randint(MAX_QUERIES + 1, 32)
        (sdpa, mine), slots, index, mask, q, k, v, raw = _random_forward(rng, dtype, queries)
        mine.backend = kernel
        expected = sdpa.attend(1, q, k, v, sdpa.metadata(slots, index, mask), q.shape[1] != k.shape[1])
        meta = mine.metadata(slots, index, mask)
        extents = _extents(mask)
        reach = int(extents.sum()) / (q.shape[0] * mask.shape[-1])  # the keys rows reach / the padded keys
        taken = queries <= MAX_QUERIES or reach <= RAGGED_DENSITY
        assert (meta.kernel is not None) == taken and (meta.bias is None) == taken  # no bias made for the kernel
        if taken:
            assert torch.equal(meta.kernel.extents, extents)
        ragged += queries > MAX_QUERIES and reach <= RAGGED_DENSITY
        got = mine.attend(1, q, k, v, meta, q.shape[1] != k.shape[1])
        assert torch.isfinite(got).all()
        seen = raw.any(-1)  # [B,S]: padding queries' outputs are meaningless
        diff = (got - expected).abs().transpose(1, 2)[seen]  # [queries seen, h, hd]
        if diff.numel():
            assert diff.max().item() <= tolerance * max(1.0, expected.abs().max().item())
        assert torch.equal(mine.k, sdpa.k) and torch.equal(mine.v, sdpa.v)  # the same new entries stored
    assert ragged >= 5  # ragged batches of 5-32 new tokens per row went to the kernel too


def test_what_the_kernel_does_not_cover_goes_to_sdpa(kernel):
    rng = random.Random(3)
    for queries, dtype in ((33, torch.float32), (2, torch.bfloat16)):
        (sdpa, mine), slots, index, mask, q, k, v, _ = _random_forward(rng, dtype, queries)
        mine.backend = kernel
        meta = mine.metadata(slots, index, mask)
        assert meta.kernel is None
        expected = sdpa.attend(0, q, k, v, sdpa.metadata(slots, index, mask), q.shape[1] != k.shape[1])
        assert torch.equal(mine.attend(0, q, k, v, meta, q.shape[1] != k.shape[1]), expected)


def test_the_kernel_is_built_once_per_source_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTRL_CACHE", str(tmp_path))
    load_kernel.cache_clear()
    try:
        assert load_kernel("paged_attention") is not None
        (built,) = (tmp_path / "kernels").glob("paged_attention-*.so")
        stamp = built.stat().st_mtime_ns
        load_kernel.cache_clear()
        assert load_kernel("paged_attention") is not None
        sidecar = built.with_name(built.name + ".sum")  # its size and sha256, checked before each load
        assert sorted((tmp_path / "kernels").glob("*")) == [built, sidecar] and built.stat().st_mtime_ns == stamp
    finally:
        load_kernel.cache_clear()


def test_without_a_working_compiler_the_engine_says_so_and_uses_sdpa(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FASTRL_CACHE", str(tmp_path))
    broken = tmp_path / "broken-cxx"
    broken.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo broken 1.0 && exit 0\necho 'no such flag' >&2\nexit 3\n"
    )
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    load_kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert PagedCpuAttention.load() is None
        assert "paged_attention kernel failed" in caplog.text and "exited 3" in caplog.text
        model = load_model(_model_dir(tmp_path))
        engine = Engine(model, EngineConfig(max_batch_size=2, max_model_len=64))
        assert isinstance(engine.runner.cache.backend, PagedSdpa)
    finally:
        load_kernel.cache_clear()


def _model_dir(tmp_path):
    path = tmp_path / "llama"
    make_hf_model("llama", seed=4).save_pretrained(path)
    return path


@pytest.mark.parametrize("strategy", ["disable", "3_1_4", "2_2_4"])
def test_engines_with_and_without_the_kernel_generate_the_same(kernel, tmp_path, strategy):
    model, drafter, inputs = kernel_test_setup(tmp_path, strategy, seed=5, requests=7, max_new=30)
    outputs = []
    for use in (True, False):
        config = EngineConfig(max_batch_size=4, max_model_len=96, dtype="float64", attention_kernel=use)
        engine = Engine(model, config, drafter=drafter, selector=FixedSelector(Strategy.parse(strategy)))
        backend = engine.runner.cache.backend
        assert isinstance(backend, PagedCpuAttention) == use
        calls: list[int] = []
        if use:  # count the kernel's calls
            entry = backend._entry[torch.float64]
            backend._entry = {torch.float64: lambda *args, entry=entry, calls=calls: calls.append(1) or entry(*args)}
        outputs.append(engine.generate(inputs))
        assert not use or len(calls) > 30  # the policy's forwards (drafter steps run in the drafter-step kernel)
    for with_kernel, without in zip(*outputs, strict=True):
        assert with_kernel.token_ids == without.token_ids
        assert max(abs(a - b) for a, b in zip(with_kernel.logprobs, without.logprobs, strict=True)) < 1e-9

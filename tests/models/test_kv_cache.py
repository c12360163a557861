"""KVCache write / read / move semantics."""

from __future__ import annotations

import pytest
import torch

from fastrl.models import KVCache


def filled_cache() -> KVCache:
    """2 layers, 3 slots, 8 positions, 2 kv heads, head_dim 4; every entry distinct."""
    cache = KVCache(2, 3, 8, 2, 4)
    cache.k.copy_(torch.arange(cache.k.numel(), dtype=torch.float32).view_as(cache.k))
    cache.v.copy_(-cache.k)
    return cache


def test_write_at_arbitrary_indices_then_read():
    cache = KVCache(2, 3, 8, 2, 4)
    slots = torch.tensor([2, 0])
    index = torch.tensor([[5, 1, 3], [0, 7, 2]])
    k = torch.randn(2, 2, 3, 4)
    v = torch.randn(2, 2, 3, 4)
    cache.write(1, slots, index, k, v)
    for b in range(2):
        for s in range(3):
            assert torch.equal(cache.k[1, slots[b], :, index[b, s]], k[b, :, s])
            assert torch.equal(cache.v[1, slots[b], :, index[b, s]], v[b, :, s])
    assert cache.k[0].abs().sum() == 0 and cache.k[1, 1].abs().sum() == 0  # nothing else touched
    rk, rv = cache.read(1, slots, 6)
    assert rk.shape == (2, 2, 6, 4)
    assert torch.equal(rk[0, :, 5], k[0, :, 0]) and torch.equal(rv[1, :, 0], v[1, :, 0])


def test_read_contiguous_slots_is_a_view_and_other_slots_a_copy():
    cache = filled_cache()
    k, v = cache.read(1, torch.tensor([1, 2]), 5)
    assert k.untyped_storage().data_ptr() == cache.k.untyped_storage().data_ptr()
    assert torch.equal(k, cache.k[1, 1:3, :, :5]) and torch.equal(v, cache.v[1, 1:3, :, :5])
    k, v = cache.read(0, torch.tensor([2, 0]), 3)
    assert torch.equal(k, torch.stack([cache.k[0, 2, :, :3], cache.k[0, 0, :, :3]]))
    assert torch.equal(v, torch.stack([cache.v[0, 2, :, :3], cache.v[0, 0, :, :3]]))
    rows = cache.rows(torch.tensor([0, 1, 2]))
    assert rows.span == slice(0, 3) and cache.rows(torch.tensor([1, 0])).span is None


def test_move_overlapping_ranges_reads_all_sources_first():
    cache = filled_cache()
    before_k, before_v = cache.k.clone(), cache.v.clone()
    slots = torch.tensor([2, 0])
    src = torch.tensor([[3, 4, 5], [2, 4, 6]])
    dst = torch.tensor([[2, 3, 4], [1, 2, 3]])
    cache.move(slots, src, dst)
    want_k, want_v = before_k.clone(), before_v.clone()
    for b in range(2):
        for m in range(3):
            want_k[:, slots[b], :, dst[b, m]] = before_k[:, slots[b], :, src[b, m]]
            want_v[:, slots[b], :, dst[b, m]] = before_v[:, slots[b], :, src[b, m]]
    assert torch.equal(cache.k, want_k) and torch.equal(cache.v, want_v)
    assert torch.equal(cache.k[:, 1], before_k[:, 1])  # untouched slot


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="max_len"):
        KVCache(2, 3, 0, 2, 4)
    with pytest.raises(ValueError, match="src"):
        filled_cache().move(torch.tensor([0]), torch.tensor([[1, 2]]), torch.tensor([[0]]))
    cache = KVCache(1, 2, 8, 1, 2, dtype=torch.bfloat16)
    assert cache.k.shape == (1, 2, 1, 8, 2) and cache.k.dtype == torch.bfloat16
    assert cache.max_len == 8 and cache.num_slots == 2

"""KVCache write / read / move semantics, dense and over a paged table."""

from __future__ import annotations

import pytest
import torch

from fastrl.models import KVCache
from fastrl.models.kv_cache import PageTable


def entry(cache: KVCache, layer: int, slot: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K/V stored at one (slot, cache index), read through the public read()."""
    k, v = cache.read(layer, torch.tensor([slot]), index + 1)
    return k[0, :, index], v[0, :, index]


def filled(cache: KVCache) -> KVCache:
    """Every stored entry distinct."""
    cache.k.copy_(torch.arange(cache.k.numel(), dtype=torch.float32).view_as(cache.k))
    cache.v.copy_(-cache.k)
    return cache


def paged_cache() -> KVCache:
    """2 layers, 3 slots, 16 entries each over pages of 4; pool of 8 pages, scratch for 5 entries per slot."""
    table = PageTable(3, 16, page_size=4, num_pages=8, scratch_len=5)
    return KVCache(2, 3, 16, 2, 4, table=table)


def test_write_at_arbitrary_indices_then_read():
    cache = KVCache(2, 3, 8, 2, 4)
    slots = torch.tensor([2, 0])
    index = torch.tensor([[5, 1, 3], [0, 7, 2]])
    k = torch.randn(2, 2, 3, 4)
    v = torch.randn(2, 2, 3, 4)
    cache.write(1, slots, index, k, v)
    for b in range(2):
        for s in range(3):
            got_k, got_v = entry(cache, 1, int(slots[b]), int(index[b, s]))
            assert torch.equal(got_k, k[b, :, s]) and torch.equal(got_v, v[b, :, s])
    assert cache.k[0].abs().sum() == 0 and entry(cache, 1, 1, 3)[0].abs().sum() == 0  # nothing else touched
    rk, rv = cache.read(1, slots, 6)
    assert rk.shape == (2, 2, 6, 4)
    assert torch.equal(rk[0, :, 5], k[0, :, 0]) and torch.equal(rv[1, :, 0], v[1, :, 0])


def test_move_overlapping_ranges_reads_all_sources_first():
    for cache in (filled(KVCache(2, 3, 8, 2, 4)), filled(paged_cache())):
        slots = torch.tensor([2, 0])
        before = {(layer, s): cache.read(layer, torch.tensor([s]), 8) for layer in range(2) for s in range(3)}
        src = torch.tensor([[3, 4, 5], [2, 4, 6]])
        dst = torch.tensor([[2, 3, 4], [1, 2, 3]])
        cache.move(slots, src, dst)
        for layer in range(2):
            for b in range(2):
                s = int(slots[b])
                want_k, want_v = before[(layer, s)][0].clone(), before[(layer, s)][1].clone()
                want_k[0, :, dst[b]] = before[(layer, s)][0][0, :, src[b]]
                want_v[0, :, dst[b]] = before[(layer, s)][1][0, :, src[b]]
                got_k, got_v = cache.read(layer, torch.tensor([s]), 8)
                assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
            untouched = cache.read(layer, torch.tensor([1]), 8)
            assert torch.equal(untouched[0], before[(layer, 1)][0])


def test_paged_table_maps_pool_pages_and_sends_the_rest_to_distinct_scratch():
    cache = paged_cache()
    table = cache.table
    assert table.scratch_pages == 3 and table.total_pages == 8 + 3 * 3
    table.map([0, 0, 1], [0, 1, 0], [5, 2, 2])  # slots 0 and 1 share pool page 2 (at different columns)
    rows = cache.rows(torch.tensor([0, 1]))
    assert rows.pages[0, :2].tolist() == [5, 2] and rows.pages[1, 0] == 2
    k = torch.randn(1, 2, 1, 4)
    cache.write(0, torch.tensor([1]), torch.tensor([[3]]), k, -k)
    assert torch.equal(entry(cache, 0, 0, 7)[0], k[0, :, 0])  # slot 0 sees it at its column 1, offset 3
    # Unmapped columns of a slot: any 3 consecutive ones are distinct scratch pages of that slot only.
    scratch = cache.rows(torch.tensor([2])).pages[0].tolist()
    assert all(len(set(scratch[c : c + 3])) == 3 for c in range(len(scratch) - 2))
    assert all(8 + 6 <= p < 8 + 9 for p in scratch)
    table.unmap([0], [1])
    assert cache.rows(torch.tensor([0])).pages[0, 1] >= 8


def test_copy_and_clear_pages():
    cache = filled(paged_cache())
    before_k = cache.k.clone()
    cache.copy_pages([1], [6])
    assert torch.equal(cache.k[:, 24:28], before_k[:, 4:8]) and torch.equal(cache.v[:, 24:28], -before_k[:, 4:8])
    cache.clear_pages([0, 6])
    assert cache.k[:, :4].abs().sum() == 0 and cache.v[:, 24:28].abs().sum() == 0
    assert torch.equal(cache.k[:, 4:24], before_k[:, 4:24])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="max_len"):
        KVCache(2, 3, 0, 2, 4)
    with pytest.raises(ValueError, match="src"):
        filled(KVCache(2, 3, 8, 2, 4)).move(torch.tensor([0]), torch.tensor([[1, 2]]), torch.tensor([[0]]))
    with pytest.raises(ValueError, match="dense table"):
        KVCache(2, 3, 8, 2, 4).table.map([0], [0], [1])
    with pytest.raises(ValueError, match="table has 3 slots"):
        KVCache(2, 4, 16, 2, 4, table=PageTable(3, 16, 4, 8, 5))
    with pytest.raises(ValueError, match="page_size"):
        PageTable(3, 16, 0)
    cache = KVCache(1, 2, 8, 1, 2, dtype=torch.bfloat16)
    assert cache.k.dtype == torch.bfloat16 and cache.max_len == 8 and cache.num_slots == 2
    assert cache.page_bytes == 2 * 1 * 8 * 1 * 2 * 2

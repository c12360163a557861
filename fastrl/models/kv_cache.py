"""Paged KV cache addressed by (slot, cache index): a page table maps each slot's index range to fixed-size pages."""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.models.attention import AttentionBackend, AttentionMetadata, PagedSdpa


class PageTable:
    """Which physical page holds entries `[c * page_size, (c + 1) * page_size)` of each slot: `table[slot, c]`.

    Dense (`num_pages` None): every slot owns `columns` pages of its own, mapped once (a slot-per-sequence cache).
    Paged (`num_pages` given): pages `[0, num_pages)` are the shared pool, mapped into columns by `map` as tokens
    arrive and unmapped at finish (`fastrl.engine.page_pool.PagePool` decides which); every slot also owns
    `scratch_pages` pages `[num_pages + slot * scratch_pages, ...)`, and a column not mapped to a pool page reads
    and writes scratch page `column % scratch_pages` of its slot. Scratch takes what is written past a row's own
    pages (a speculative round's tree nodes, prefill padding): any `scratch_pages` consecutive columns hit distinct
    scratch pages, so a round's tree of up to `(scratch_pages - 1) * page_size` entries never collides with itself.

    `home_stride` R (paged, with `num_pages >= num_slots * R`): the pool hands column c of slot s page
    `s * R + c` when it can (`PagePool.home_stride`), so rows whose pages are all at home are read as a view.

    The policy and the drafter caches of an engine share one PageTable (entry p of both belongs to position p).
    `table` is updated in place, so a CUDA graph that read it at capture reads the current mapping at replay.
    """

    def __init__(
        self,
        num_slots: int,
        max_len: int,
        page_size: int = 16,
        num_pages: int | None = None,
        scratch_len: int = 0,
        device: torch.device | str = "cpu",
        home_stride: int | None = None,
    ) -> None:
        for name, value in {"num_slots": num_slots, "max_len": max_len, "page_size": page_size}.items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"PageTable: {name} must be a positive int, got {value!r}")
        if num_pages is not None and num_pages < 1:
            raise ValueError(f"PageTable: num_pages must be >= 1 or None, got {num_pages}")
        if home_stride is not None and (num_pages is None or home_stride < 1 or home_stride * num_slots > num_pages):
            raise ValueError(f"PageTable: home_stride {home_stride} x {num_slots} slots exceeds the pool ({num_pages})")
        self.home_stride = home_stride
        self.num_slots = num_slots
        self.page_size = page_size
        self.columns, paged_scratch = PageTable.layout(max_len, page_size, scratch_len)
        self.max_len = self.columns * page_size
        self.device = torch.device(device)
        self.paged = num_pages is not None
        cols = torch.arange(self.columns)
        slots = torch.arange(num_slots).unsqueeze(1)
        if num_pages is None:
            self.num_pages = num_slots * self.columns
            self.scratch_pages = 0
            self._default = slots * self.columns + cols
        else:
            self.num_pages = num_pages
            self.scratch_pages = paged_scratch
            self._default = num_pages + slots * self.scratch_pages + cols % self.scratch_pages
        self.total_pages = self.num_pages + num_slots * self.scratch_pages
        self._default = self._default.to(self.device)
        self.table = self._default.clone()  # [num_slots, columns] long

    @staticmethod
    def layout(max_len: int, page_size: int, scratch_len: int = 0) -> tuple[int, int]:
        """The columns of a slot of `max_len` entries, and the scratch pages a paged table gives each slot."""
        return math.ceil(max_len / page_size), math.ceil(scratch_len / page_size) + 1

    def map(self, slots: list[int], columns: list[int], pages: list[int]) -> None:
        """Point `table[slots[i], columns[i]]` at pool page `pages[i]` (one indexed write for all of them)."""
        if not self.paged:
            raise ValueError("PageTable.map: a dense table (num_pages None) maps every slot once, at construction")
        if slots:
            s = torch.tensor(slots, dtype=torch.long, device=self.device)
            c = torch.tensor(columns, dtype=torch.long, device=self.device)
            self.table[s, c] = torch.tensor(pages, dtype=torch.long, device=self.device)

    def unmap(self, slots: list[int], columns: list[int]) -> None:
        """Point the given columns back at their slot's scratch pages."""
        if slots:
            s = torch.tensor(slots, dtype=torch.long, device=self.device)
            c = torch.tensor(columns, dtype=torch.long, device=self.device)
            self.table[s, c] = self._default[s, c]


@dataclass(frozen=True)
class SlotRows:
    """A resolved selection of slots, computed once per forward by `KVCache.rows` and reused by every layer.

    index: [B] long slot ids; column: the same as [B,1]; pages: [B,C] their page-table rows.
    """

    index: Tensor
    column: Tensor
    pages: Tensor


@dataclass(frozen=True)
class KvShape:
    """One KV cache's shape over a page table: its layers and its key/value heads of `head_dim`."""

    layers: int
    kv_heads: int
    head_dim: int

    def entry_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of K and V one cache entry (one token's position) holds over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype.itemsize


class KVCache:
    """Per-layer K/V pages `[num_layers, total_pages * page_size, kv_heads, head_dim]` behind a `PageTable`.

    Entries are addressed by (slot, cache index), the index normally the token's absolute position: nothing is ever
    rolled back; stale entries past a sequence's length are never attended to and are overwritten later. Reads
    gather whole pages of the table's columns `[0, ceil(L / page_size))`: attention covers each row's own pages
    (and, past them, its scratch pages, which its mask leaves out unless they hold this round's tree).

    Without `table` the cache is dense (every slot owns `max_len` entries), as a standalone model or drafter needs.
    `slots` arguments accept a LongTensor [B] or a `SlotRows` from `rows()` (cheaper when reused across layers).
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        table: PageTable | None = None,
        backend: AttentionBackend | None = None,
    ) -> None:
        sizes = {
            "num_layers": num_layers,
            "num_slots": num_slots,
            "max_len": max_len,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
        self.device = torch.device(device)
        if table is None:
            table = PageTable(num_slots, max_len, min(16, max_len), None, 0, self.device)
        elif table.num_slots != num_slots or table.max_len < max_len:
            raise ValueError(
                f"KVCache: table has {table.num_slots} slots x {table.max_len} entries, need {num_slots} x {max_len}"
            )
        self.table = table
        self.backend: AttentionBackend = backend or PagedSdpa()
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.max_len = table.max_len
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.page_size = table.page_size
        self.k, self.v = self._allocate()
        self._gathered: tuple[Tensor, Tensor] | None = None

    def _allocate(self) -> tuple[Tensor, Tensor]:
        """K and V, all zeros.  # -> 2 x [num_layers, total_pages * page_size, kv_heads, head_dim]"""
        table = self.table
        shape = (self.num_layers, table.total_pages * table.page_size, self.num_kv_heads, self.head_dim)
        # A home view reads pages nobody holds (masked), so nothing in the cache may be junk. On a CPU the pool is
        # zero memory the OS maps only when written (resident memory follows the most pages ever handed out: a
        # freed page is zeroed by `clear_pages`, not returned); elsewhere (and dense caches) all is zeroed at once.
        if table.paged and self.device.type == "cpu":
            self._maps = [mmap.mmap(-1, math.prod(shape) * self.dtype.itemsize) for _ in range(2)]
            k, v = (torch.frombuffer(m, dtype=self.dtype).view(shape) for m in self._maps)
            return k, v
        # on an accelerator the memory is held anyway: all zeros
        return tuple(torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2))

    @property
    def released(self) -> bool:
        """True between `release` and `restore`: the cache holds no memory and cannot be read or written."""
        return self.k.dim() == 1

    def release(self) -> None:
        """Give the cache's memory back (every entry is dropped): K and V become empty tensors until `restore`.
        Whoever kept raw addresses of the old tensors (a CUDA graph) must not run before it is rebuilt."""
        empty = torch.empty(0, dtype=self.dtype, device=self.device)
        self.k, self.v, self._gathered, self._maps = empty, empty, None, []

    def restore(self) -> None:
        """Allocate the cache again after `release`, all zeros (at new addresses); a no-op when it holds memory."""
        if self.released:
            self.k, self.v = self._allocate()

    @property
    def page_bytes(self) -> int:
        """Bytes of K and V one page holds over every layer."""
        return KvShape(self.num_layers, self.num_kv_heads, self.head_dim).entry_bytes(self.k.dtype) * self.page_size

    def rows(self, slots: Tensor | SlotRows) -> SlotRows:
        """Resolves slot ids and their page-table rows once.  # [B] -> SlotRows"""
        if isinstance(slots, SlotRows):
            return slots
        index = slots.to(device=self.device, dtype=torch.long)
        return SlotRows(index=index, column=index.unsqueeze(1), pages=self.table.table.index_select(0, index))

    def entries(self, rows: SlotRows, index: Tensor) -> Tensor:
        """Physical entry of each (row, cache index).  # rows [B], index [B,S] -> [B,S] long"""
        ps = self.page_size
        return rows.pages.gather(1, torch.div(index, ps, rounding_mode="floor")) * ps + index.remainder(ps)

    def metadata(
        self, slots: Tensor | SlotRows, index: Tensor, mask: Tensor, first_slot: int | None = None
    ) -> AttentionMetadata:
        """One forward's attention over this cache: new entries at `index`, keys [0, L) under `mask`.

        `first_slot` (the caller vouches for it): row b is slot first_slot + b and every page it holds is its
        home page, so its keys are read in place (`home_view`).
        # slots [B], index [B,S], mask [B,1,S,L] bool -> AttentionMetadata
        """
        rows = self.rows(slots)
        kv_len = mask.shape[-1]
        if kv_len > self.max_len:
            raise ValueError(f"attention over {kv_len} cache entries exceeds max_len {self.max_len}")
        stride = self.table.home_stride
        if first_slot is not None and (stride is None or kv_len > stride * self.page_size):
            first_slot = None  # no home pages, or the keys run past them: gather
        pages = rows.pages[:, : math.ceil(kv_len / self.page_size)]
        entries = self.entries(rows, index).reshape(-1)
        return self.backend.plan(self, AttentionMetadata(rows.index, entries, pages, kv_len, mask, first_slot))

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: AttentionMetadata, gqa: bool) -> Tensor:
        """Store this layer's new K/V and attend over the cache (the backend's work).

        # q [B,h,S,hd], k/v [B,kvh,S,hd] -> [B,h,S,hd]
        """
        return self.backend.attend(self, layer, q, k, v, meta, gqa)

    def store(self, layer: int, entries: Tensor, k: Tensor, v: Tensor) -> None:
        """Writes new K/V at physical entries (row-major over [B,S]).  # entries [B*S], k/v [B,kvh,S,hd]"""
        n, kvh = entries.shape[0], self.num_kv_heads
        self.k[layer].index_copy_(0, entries, k.transpose(1, 2).reshape(n, kvh, self.head_dim))
        self.v[layer].index_copy_(0, entries, v.transpose(1, 2).reshape(n, kvh, self.head_dim))

    def gather(self, layer: int, pages: Tensor, length: int, reuse: bool = False) -> tuple[Tensor, Tensor]:
        """Entries [0, length) of each row, one indexed copy of whole pages.  # pages [B,C] -> 2 x [B,kvh,L,hd]

        `reuse` (attention, which consumes the result before the next gather) copies into buffers this cache keeps
        on a CPU, overwritten by the next reusing gather.
        """
        b, c = pages.shape
        flat = pages.reshape(-1)
        shape = (b, c * self.page_size, self.num_kv_heads, self.head_dim)
        # index_select over [pages, page_entries] rows: whole-page copies (faster than advanced indexing on a CPU).
        k_pages = self.k[layer].view(self.table.total_pages, -1)
        v_pages = self.v[layer].view(self.table.total_pages, -1)
        if reuse and self.device.type == "cpu":  # into reused buffers: no allocation (and page faults) per layer
            k_out, v_out = self._gather_buffers(flat.shape[0])
            k = torch.index_select(k_pages, 0, flat, out=k_out).view(shape)
            v = torch.index_select(v_pages, 0, flat, out=v_out).view(shape)
        else:  # a CUDA graph keeps the addresses it captured: allocate from its pool
            k, v = k_pages.index_select(0, flat).view(shape), v_pages.index_select(0, flat).view(shape)
        return k[:, :length].transpose(1, 2), v[:, :length].transpose(1, 2)

    def home_view(self, layer: int, first_slot: int, rows: int, length: int) -> tuple[Tensor, Tensor]:
        """Entries [0, length) of slots first_slot .. first_slot + rows - 1 read in place from their home pages
        (a view, no copy).  # -> 2 x [rows,kvh,L,hd]"""
        width = self.table.home_stride * self.page_size
        start = first_slot * width
        shape = (rows, width, self.num_kv_heads, self.head_dim)
        k = self.k[layer, start : start + rows * width].view(shape)
        v = self.v[layer, start : start + rows * width].view(shape)
        return k[:, :length].transpose(1, 2), v[:, :length].transpose(1, 2)

    def _gather_buffers(self, pages: int) -> tuple[Tensor, Tensor]:
        """Two [pages, page_entries] buffers, grown when a forward needs more (a gather's result lives only until
        the layer's attention has run).  # -> 2 x [pages, ps*kvh*hd]"""
        if self._gathered is None or self._gathered[0].shape[0] < pages:
            width = self.page_size * self.num_kv_heads * self.head_dim
            self._gathered = tuple(torch.empty(pages, width, dtype=self.dtype, device=self.device) for _ in range(2))
        return self._gathered[0][:pages], self._gathered[1][:pages]

    def write(self, layer: int, slots: Tensor | SlotRows, index: Tensor, k: Tensor, v: Tensor) -> None:
        """Stores new entries at per-row cache indices.  # slots [B], index [B,S], k/v [B,kvh,S,hd] -> in place"""
        self.store(layer, self.entries(self.rows(slots), index).reshape(-1), k, v)

    def read(self, layer: int, slots: Tensor | SlotRows, length: int) -> tuple[Tensor, Tensor]:
        """The first `length` entries of each slot, gathered page by page.  # [B] -> 2 x [B,kvh,L,hd]"""
        pages = self.rows(slots).pages[:, : math.ceil(length / self.page_size)]
        return self.gather(layer, pages, length)

    def move(self, slots: Tensor | SlotRows, src: Tensor, dst: Tensor) -> None:
        """Copies entries src -> dst in every layer; all sources are read before any write, so overlapping ranges
        are safe (duplicate dst indices within a row are not).  # slots [B], src/dst [B,M] long -> in place"""
        if src.shape != dst.shape or src.dim() != 2:
            raise ValueError(f"KVCache.move: src {tuple(src.shape)} and dst {tuple(dst.shape)} must both be [B,M]")
        rows = self.rows(slots)
        src_flat, dst_flat = self.entries(rows, src).reshape(-1), self.entries(rows, dst).reshape(-1)
        for layer in (*self.k, *self.v):  # per layer, entries as rows: much faster than indexing dim 1 of [L,E,..]
            entries = layer.view(layer.shape[0], -1)
            entries.index_copy_(0, dst_flat, entries.index_select(0, src_flat))

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copies whole pages src[i] -> dst[i] in every layer (a shared prompt's partial last page).  # in place"""
        if len(src) != len(dst):
            raise ValueError(f"KVCache.copy_pages: {len(src)} sources for {len(dst)} destinations")
        if src:
            ps = self.page_size
            offsets = torch.arange(ps, device=self.device)
            s = (torch.tensor(src, device=self.device).unsqueeze(1) * ps + offsets).reshape(-1)
            d = (torch.tensor(dst, device=self.device).unsqueeze(1) * ps + offsets).reshape(-1)
            self.k.index_copy_(1, d, self.k.index_select(1, s))
            self.v.index_copy_(1, d, self.v.index_select(1, s))

    def clear_pages(self, pages: list[int]) -> None:
        """Zeroes pages (freed ones, before anyone holds them again), so nothing attended past a row's tokens is
        non-finite."""
        if pages:
            ps = self.page_size
            idx = torch.tensor(pages, device=self.device).unsqueeze(1) * ps + torch.arange(ps, device=self.device)
            self.k.index_fill_(1, idx.reshape(-1), 0)
            self.v.index_fill_(1, idx.reshape(-1), 0)

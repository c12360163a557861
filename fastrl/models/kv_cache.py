"""Slot-based KV cache addressed by absolute position (gpt-fast style)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SlotRows:
    """A resolved selection of cache slots, computed once per forward by `KVCache.rows` and reused by every layer.

    index: [B] long slot ids on the cache device; column: the same as [B,1]; span: `slice(a, a + B)` when the slots
    are the contiguous ascending range a..a+B-1 (reads are then free views), else None.
    """

    index: Tensor
    column: Tensor
    span: slice | None


class KVCache:
    """Per-layer K/V storage `[num_slots, kv_heads, max_len, head_dim]`, one slot per sequence.

    Entries are addressed by cache index (normally the token's absolute position): nothing is ever rolled back;
    stale entries past a sequence's length are simply never attended to, and are overwritten later. All layers
    live in two tensors `k`, `v` of shape `[num_layers, num_slots, kv_heads, max_len, head_dim]`, so `k[layer]`
    is the per-layer tensor and `move` touches every layer in one index copy.

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
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.max_len = max_len
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)

    def rows(self, slots: Tensor | SlotRows) -> SlotRows:
        """Resolves slot ids once. Contiguity is detected only for CPU `slots` (no device sync).  # [B] -> SlotRows"""
        if isinstance(slots, SlotRows):
            return slots
        span = None
        if slots.device.type == "cpu" and slots.dim() == 1 and slots.numel() > 0:
            ids = slots.tolist()
            if ids == list(range(ids[0], ids[0] + len(ids))) and ids[0] >= 0:
                span = slice(ids[0], ids[0] + len(ids))
        index = slots.to(device=self.device, dtype=torch.long)
        return SlotRows(index=index, column=index.unsqueeze(1), span=span)

    def write(self, layer: int, slots: Tensor | SlotRows, index: Tensor, k: Tensor, v: Tensor) -> None:
        """Stores new entries at per-row cache indices.  # slots [B], index [B,S], k/v [B,kvh,S,hd] -> in place"""
        rows = self.rows(slots)
        self.k[layer][rows.column, :, index] = k.transpose(1, 2)
        self.v[layer][rows.column, :, index] = v.transpose(1, 2)

    def read(self, layer: int, slots: Tensor | SlotRows, length: int) -> tuple[Tensor, Tensor]:
        """The first `length` entries of each slot (a view for contiguous slots).  # [B] -> 2 x [B,kvh,L,hd]"""
        rows = self.rows(slots)
        if rows.span is not None:
            return self.k[layer, rows.span, :, :length], self.v[layer, rows.span, :, :length]
        return self.k[layer, rows.index, :, :length], self.v[layer, rows.index, :, :length]

    def move(self, slots: Tensor | SlotRows, src: Tensor, dst: Tensor) -> None:
        """Copies entries src -> dst in every layer; all sources are read before any write, so overlapping ranges
        are safe (duplicate dst indices within a row are not).  # slots [B], src/dst [B,M] long -> in place"""
        if src.shape != dst.shape or src.dim() != 2:
            raise ValueError(f"KVCache.move: src {tuple(src.shape)} and dst {tuple(dst.shape)} must both be [B,M]")
        rows = self.rows(slots)
        self.k[:, rows.column, :, dst] = self.k[:, rows.column, :, src]
        self.v[:, rows.column, :, dst] = self.v[:, rows.column, :, src]

    def copy_slots(self, src: Tensor, dst: Tensor, length: int) -> None:
        """Copies the first `length` entries of slots `src` into slots `dst` in every layer (prefix sharing).

        # src/dst [M] long slot ids -> in place
        """
        if src.shape != dst.shape or src.dim() != 1:
            raise ValueError(f"KVCache.copy_slots: src {tuple(src.shape)} and dst {tuple(dst.shape)} must both be [M]")
        if not 0 < length <= self.max_len:
            raise ValueError(f"KVCache.copy_slots: length must be in [1, {self.max_len}], got {length}")
        src, dst = src.to(self.device), dst.to(self.device)
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]

"""The drafter's keys and values across the unrolled steps of a training-time test, kept for autograd."""

from __future__ import annotations

import torch
from torch import Tensor


class UnrolledKV:
    """A one-layer K/V store the drafter's attention writes to and reads from in place of a `KVCache`.

    Step k of the unroll writes its S new entries after the (k)·S entries of steps 0..k-1: entry (k, j) sits at
    key index k·S + j, so a step's mask [B,S,(k+1)·S] addresses every earlier step. Entries are appended (a list
    of step tensors concatenated on read), never written in place, so gradients reach the keys and values of every
    step; a `KVCache` would overwrite tensors autograd saved. It answers the calls `Attention` makes on a cache
    (`rows`, `write`, `read`) and ignores the cache index: the order of writes is the layout.
    """

    def __init__(self) -> None:
        self._k: list[Tensor] = []
        self._v: list[Tensor] = []

    def rows(self, slots: Tensor) -> Tensor:
        """Rows are the batch rows in order.  # [B] -> [B]"""
        return slots

    def write(self, layer: int, slots: Tensor, index: Tensor, k: Tensor, v: Tensor) -> None:
        """Appends one step's entries.  # k/v [B,kvh,S,hd]"""
        if layer != 0:
            raise ValueError(f"UnrolledKV holds one layer (the drafter's), got layer {layer}")
        self._k.append(k)
        self._v.append(v)

    def read(self, layer: int, slots: Tensor, length: int) -> tuple[Tensor, Tensor]:
        """The first `length` entries of all steps written so far.  # -> 2 x [B,kvh,L,hd]"""
        k = self._k[0] if len(self._k) == 1 else torch.cat(self._k, dim=2)
        v = self._v[0] if len(self._v) == 1 else torch.cat(self._v, dim=2)
        if length > k.shape[2]:
            raise ValueError(f"UnrolledKV.read: {length} entries asked, {k.shape[2]} written")
        return k[:, :, :length], v[:, :, :length]

"""The drafter's keys and values across the unrolled steps of a training-time test, kept for autograd."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fastrl.models.attention import AttentionMetadata


class UnrolledKV:
    """A one-layer K/V store the drafter's attention uses in place of a `KVCache`.

    Step k of the unroll adds its S new entries after the k·S entries of steps 0..k-1: entry (k, j) sits at key
    index k·S + j, so a step's mask [B,S,(k+1)·S] addresses every earlier step. Entries are appended (a list of step
    tensors concatenated when attended), never written in place, so gradients reach the keys and values of every
    step; a `KVCache` would overwrite tensors autograd saved. It answers the two calls a decoder layer makes on a
    cache (`metadata`, `attend`) and ignores the cache index: the order of writes is the layout.
    """

    def __init__(self) -> None:
        self._k: list[Tensor] = []
        self._v: list[Tensor] = []

    def metadata(self, slots: Tensor, index: Tensor, mask: Tensor, first_slot: int | None = None) -> AttentionMetadata:
        """One step's attention: its rows in batch order over the first mask.shape[-1] entries of all steps
        (`first_slot`, for `KVCache.metadata`'s signature, has no meaning here: these entries are never paged).

        # slots [B], index [B,S] (unused), mask [B,1,S,L] bool -> AttentionMetadata
        """
        no_pages = torch.empty(slots.shape[0], 0, dtype=torch.long, device=slots.device)
        return AttentionMetadata(slots, index.reshape(-1), no_pages, mask.shape[-1], mask)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: AttentionMetadata, gqa: bool) -> Tensor:
        """Append this step's entries and attend over all steps' entries [0, kv_len).

        # q [B,h,S,hd], k/v [B,kvh,S,hd] -> [B,h,S,hd]
        """
        if layer != 0:
            raise ValueError(f"UnrolledKV holds one layer (the drafter's), got layer {layer}")
        self._k.append(k)
        self._v.append(v)
        keys = self._k[0] if len(self._k) == 1 else torch.cat(self._k, dim=2)
        values = self._v[0] if len(self._v) == 1 else torch.cat(self._v, dim=2)
        if meta.kv_len > keys.shape[2]:
            raise ValueError(f"UnrolledKV: {meta.kv_len} entries attended, {keys.shape[2]} written")
        keys, values = keys[:, :, : meta.kv_len], values[:, :, : meta.kv_len]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=meta.mask, enable_gqa=gqa)

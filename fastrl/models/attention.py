"""Attention over the paged KV cache, behind one small backend interface.

Every forward (prefill, plain decode, tree verify, drafter steps) describes its attention once, in an
`AttentionMetadata` built by `KVCache.metadata`: where the new tokens' K/V go, which pages hold each row's keys,
how many keys are attended and the mask over them (causal, or `[prefix | tree-ancestor]` for a tree). A backend
turns (q, k, v, metadata) into the attention output for one layer; every layer of the forward reads the same
metadata, so nothing about the batch is recomputed per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from fastrl.models.cpu_attention import KernelPlan
    from fastrl.models.gpu_attention import TritonPlan
    from fastrl.models.kv_cache import KVCache


@dataclass(frozen=True)
class AttentionMetadata:
    """One forward's attention over the cache.

    slots: [B] slot ids; write: [B*S] physical cache entries of the new tokens, row-major; pages: [B,C] the
    pages holding each row's entries [0, C * page_size) (C = ceil(kv_len / page_size)); kv_len: entries
    attended; mask: [B,1,S,kv_len] bool, True = may attend (rows that see nothing open onto the first key);
    first_slot: when set, row b is slot first_slot + b and holds only its home pages (keys read in place).
    What the cache's backend prepared for every layer of the forward (`AttentionBackend.plan`): bias, the mask as an
    additive bias (0 where it may attend, -inf elsewhere) in the attention's dtype (`PagedSdpa` on a CPU:
    scaled_dot_product_attention would convert the bool mask the same way at every layer); kernel, a paged kernel's
    inputs when it takes this forward (`PagedCpuAttention`'s C++ kernel, `PagedTritonAttention`'s on a GPU).
    """

    slots: Tensor
    write: Tensor
    pages: Tensor
    kv_len: int
    mask: Tensor
    first_slot: int | None = None
    bias: Tensor | None = None
    kernel: KernelPlan | TritonPlan | None = None


class AttentionBackend(Protocol):
    """Prepares a forward once (`plan`), then stores the new K/V of each layer and attends over the cache as `meta`
    says."""

    def plan(self, cache: KVCache, meta: AttentionMetadata) -> AttentionMetadata:
        """`meta` with what this backend computes once per forward for all its layers (`KVCache.metadata` calls it)."""
        ...

    def attend(
        self, cache: KVCache, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: AttentionMetadata, gqa: bool
    ) -> Tensor:
        """# q [B,h,S,hd], k/v [B,kvh,S,hd] -> [B,h,S,hd]"""
        ...


class PagedSdpa:
    """The portable backend: write the new entries in place, gather each row's pages into `[B,kvh,L,hd]` (one
    indexed copy per layer) and run scaled_dot_product_attention with the mask. CPU and GPU alike; on a GPU the
    page-table shapes are static per batch bucket, so it is captured in the round's CUDA graph.

    `host_reads`: on a CPU, an output that is not finite is read on the host and the layer attended again with the
    keys no query may see kept out (`attend_finite_hidden`); off where rounds are graphed (a graph reads nothing)."""

    def __init__(self, host_reads: bool = True) -> None:
        self.host_reads = host_reads

    def plan(self, cache: KVCache, meta: AttentionMetadata) -> AttentionMetadata:
        """On a CPU, the bool mask as a float bias once for all layers (nothing to prepare for one layer or a GPU)."""
        if cache.device.type != "cpu" or cache.num_layers == 1:
            return meta
        return replace(meta, bias=mask_bias(meta.mask, cache.dtype))

    def attend(
        self, cache: KVCache, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: AttentionMetadata, gqa: bool
    ) -> Tensor:
        """# q [B,h,S,hd], k/v [B,kvh,S,hd] -> [B,h,S,hd]"""
        cache.store(layer, meta.write, k, v)
        if meta.first_slot is not None:
            keys, values = cache.home_view(layer, meta.first_slot, q.shape[0], meta.kv_len)
        else:
            keys, values = cache.gather(layer, meta.pages, meta.kv_len, reuse=True)  # consumed right here
        mask = meta.mask if meta.bias is None else meta.bias
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
        # a key no query may see still enters the products as 0 x its value: NaN there shows in the output
        if self.host_reads and cache.device.type == "cpu" and not bool(out.isfinite().all()):
            return attend_finite_hidden(q, keys, values, meta.mask, gqa)
        return out


def attend_finite_hidden(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, gqa: bool) -> Tensor:
    """Attention where some keys or values are not finite: those a query may not see add nothing (in the products
    0 * NaN is NaN: a rejected draft whose values are not finite would reach every node of its tree, which plain
    decoding never computes); a query that may see one gets what the products over the keys it sees give (NaN, an
    infinity, or a finite value where an infinite score is -inf), computed over those keys alone.

    # q [B,h,S,hd], keys/values [B,kvh,L,hd], mask [B,1,S,L] bool -> [B,h,S,hd]
    """
    finite_k, finite_v = keys.isfinite(), values.isfinite()
    clean_v = values.where(finite_v, 0.0)
    out = F.scaled_dot_product_attention(q, keys.where(finite_k, 0.0), clean_v, attn_mask=mask, enable_gqa=gqa)
    group = q.shape[1] // keys.shape[1]

    def seen(bad: Tensor) -> Tensor:  # [B,kvh,L] -> [B,h,S]: a query may see a key that is bad
        return (mask & bad.repeat_interleave(group, dim=1)[:, :, None, :]).any(-1)

    seen_k, seen_v = seen(~finite_k.all(-1)), seen(~finite_v.all(-1))
    if not bool((seen_k | seen_v).any()):  # a host read: this path runs on a CPU only
        return out
    scores = q @ keys.repeat_interleave(group, dim=1).transpose(-1, -2) * q.shape[-1] ** -0.5  # [B,h,S,L]
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)  # masked NaN scores replaced, then dropped
    by_hand = weights @ clean_v.repeat_interleave(group, dim=1)
    cols = (~finite_v).any(-1).any(1).any(0).nonzero().squeeze(1)  # [L'] keys with a value that is not finite
    if cols.numel():  # the values that are not finite, times their weights, where the query sees them
        bad_v = ~finite_v[:, :, cols].repeat_interleave(group, dim=1)[:, :, None]  # [B,h,1,L',hd]
        raw = values[:, :, cols].repeat_interleave(group, dim=1)[:, :, None]
        sees = mask[..., cols][..., None] & bad_v  # [B,h,S,L',hd]
        by_hand = by_hand + torch.where(sees, weights[..., cols][..., None] * raw, 0.0).sum(-2)
    return torch.where((seen_k | seen_v)[..., None], by_hand, out)


def mask_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool attention mask as the additive bias scaled_dot_product_attention makes of it (0 / -inf), bit for bit.

    # [B,1,S,L] bool -> [B,1,S,L] dtype
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))

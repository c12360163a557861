"""Boolean attention masks (True = may attend) in the layout scaled_dot_product_attention takes."""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask_by_position(positions: Tensor) -> Tensor:
    """Among the new tokens themselves (no cache): i sees j iff pos[j] <= pos[i].  # [B,S] -> [B,S,S] bool"""
    return positions.unsqueeze(1) <= positions.unsqueeze(2)


def causal_mask_by_index(cache_index: Tensor, kv_len: int) -> Tensor:
    """Over cache entries [0, kv_len): token i sees entry j iff j <= cache_index[i].  # [B,S] -> [B,S,L] bool"""
    keys = torch.arange(kv_len, device=cache_index.device)
    return keys <= cache_index.unsqueeze(-1)


def sdpa_mask(attn_mask: Tensor) -> Tensor:
    """Adds the head axis and opens rows that see nothing (padding) onto the first key, so their output is finite
    (meaningless) instead of NaN, and their row's extent (the CPU kernel's `KernelPlan.extents`) reaches no
    further than its real queries'.  # [B,S,L] bool -> [B,1,S,L] bool"""
    # (not `first[0] = True`: on a GPU that copies a host scalar, which a CUDA-graph capture refuses)
    first = torch.arange(attn_mask.shape[-1], device=attn_mask.device) == 0
    return (attn_mask | (~attn_mask.any(dim=-1, keepdim=True) & first)).unsqueeze(1)


def attention_mask(
    positions: Tensor,
    cache_index: Tensor | None = None,
    attn_mask: Tensor | None = None,
    kv_len: int | None = None,
) -> Tensor:
    """The SDPA mask for one forward, shared by every layer.  # [B,S] -> [B,1,S,L] bool

    Without a cache (`cache_index` None) keys are the new tokens (L = S) and None means causal by position. With a
    cache, keys are cache entries [0, L) after the write, L = attn_mask.shape[-1]; None means causal by cache index
    over L = kv_len entries (default max(cache_index) + 1, which costs one host sync on a GPU).
    """
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool or attn_mask.dim() != 3 or attn_mask.shape[:2] != positions.shape:
            raise ValueError(
                f"attn_mask must be bool [B,S,L] with [B,S] = {tuple(positions.shape)}, "
                f"got {attn_mask.dtype} {tuple(attn_mask.shape)}"
            )
        return sdpa_mask(attn_mask)
    if cache_index is None:
        return sdpa_mask(causal_mask_by_position(positions))
    if kv_len is None:
        kv_len = int(cache_index.max()) + 1
    return sdpa_mask(causal_mask_by_index(cache_index, kv_len))

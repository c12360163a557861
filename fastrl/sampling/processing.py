"""Logit processing: temperature, then top-k, then top-p; removed tokens get -inf.

The filters cut by value, not by rank: a token is kept when its scaled logit is >= a per-row cutoff. Tokens tied
with the last kept one are therefore all kept, so the result does not depend on the order of the vocabulary
(permuting the columns permutes the output) and is deterministic.

    top-k: cutoff_k = the k-th largest scaled logit (k = 0 or k >= V: no cut)
    top-p: on softmax of the top-k-filtered scaled logits, sorted descending, keep rank r while the mass of
           ranks < r is < top_p (rank 0 is always kept); cutoff_p = the value at the last kept rank
    keep:  scaled >= max(cutoff_k, cutoff_p)
"""

from __future__ import annotations

import torch


def process_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    *,
    apply_filters: bool = True,
) -> torch.Tensor:
    """Temperature-scaled, top-k / top-p filtered logits, removed entries = -inf, in float32 (float64 for float64
    logits: a float64 engine samples in float64, so a last-bit difference between a plain row's and a verify row's
    logits stays ~1e-16 instead of being rounded to a float32 ulp apart).

    Args:
        logits: [N, V] raw logits (any float dtype).
        temperature: [N] temperatures; rows with 0 are greedy and are returned as raw logits (float32).
        top_k: [N] int64, 0 = off.
        top_p: [N] in (0, 1], 1 = off.
        apply_filters: False promises that no row uses top-k or top-p and skips the sort (host-side flag,
            so no device synchronisation is needed to decide it).

    Returns:
        [N, V] float32 or float64; ``log_softmax`` of it gives the log-probabilities the sampler draws from.
    """
    # [N,V], [N], [N], [N] -> [N,V]
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    greedy = temperature == 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).to(x.dtype)
    scaled = x / scale[:, None]
    if not apply_filters:
        return scaled  # greedy rows were divided by 1: their raw logits exactly
    cutoff = _filter_cutoff(scaled, top_k, top_p)
    scaled = scaled.masked_fill(scaled < cutoff[:, None], float("-inf"))
    return torch.where(greedy[:, None], x, scaled)


def _filter_cutoff(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # [N,V], [N], [N] -> [N] per-row value cutoff (-inf keeps everything)
    vocab = scaled.shape[-1]
    sorted_vals = scaled.sort(dim=-1, descending=True).values
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab)).to(torch.int64)
    cutoff_k = sorted_vals.gather(1, (k - 1)[:, None]).squeeze(1)
    cutoff_k = torch.where(k < vocab, cutoff_k, torch.full_like(cutoff_k, float("-inf")))

    kept_sorted = sorted_vals.masked_fill(sorted_vals < cutoff_k[:, None], float("-inf"))
    probs = kept_sorted.softmax(dim=-1)
    # exclusive cumsum by shifting keeps it monotone (cumsum - probs need not be)
    mass_before = torch.cat([torch.zeros_like(probs[:, :1]), probs.cumsum(dim=-1)[:, :-1]], dim=1)
    num_kept = (mass_before < top_p.to(probs.dtype)[:, None]).sum(dim=-1).clamp(min=1)
    cutoff_p = sorted_vals.gather(1, (num_kept - 1)[:, None]).squeeze(1)
    cutoff_p = torch.where(top_p < 1, cutoff_p, torch.full_like(cutoff_p, float("-inf")))
    return torch.maximum(cutoff_k, cutoff_p)


def log_probs(processed: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the processed logits (removed tokens get -inf)."""
    # [N,V] -> [N,V]
    return torch.log_softmax(processed, dim=-1)

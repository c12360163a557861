"""A plain decode round: one token per running request."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.engine.batch import RunningBatch
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.models.masks import causal_mask_by_index
from fastrl.sampling.sampler import sample


@dataclass
class PlainRoundResult:
    """Per row: the sampled token, its log-prob, and the hidden state that produced it.

    tokens: [B]; logprobs: [B]; hidden: [B,H]
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    hidden: torch.Tensor


def plain_round(model: CausalLM, cache: KVCache, batch: RunningBatch) -> PlainRoundResult:
    """Feed each row's last token at position `lengths` and sample the next one. # [B] -> [B], [B], [B,H]"""
    positions = batch.lengths.unsqueeze(1)
    key_length = int(batch.lengths.max()) + 1
    out = model(
        batch.last.unsqueeze(1),
        positions,
        cache=cache,
        slots=batch.slots,
        attn_mask=causal_mask_by_index(positions, key_length),
    )
    result = sample(out.logits[:, 0], batch.sampling, batch.lengths + 1)
    return PlainRoundResult(tokens=result.tokens, logprobs=result.logprobs, hidden=out.hidden[:, 0])

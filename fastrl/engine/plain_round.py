"""A plain decode round: one token per running request."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.models.masks import causal_mask_by_index
from fastrl.sampling.sampler import sample
from fastrl.speculative.inputs import DecodeInputs


@dataclass
class PlainRoundResult:
    """Per row: the sampled token, its log-prob, and the hidden state that produced it.

    tokens: [B]; logprobs: [B]; hidden: [B,F] the forward's features (F = H: the final-norm state; with
    `feature_layers`, a fused drafter's input, `ModelOutput.features`)
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    hidden: torch.Tensor


def plain_round(
    model: CausalLM,
    cache: KVCache,
    inputs: DecodeInputs,
    kv_len: int | None = None,
    first_slot: int | None = None,
    feature_layers: tuple[int, ...] = (),
) -> PlainRoundResult:
    """Feed each row's last token at position `lengths` and sample the next one. # [B] -> [B], [B], [B,F]

    Attention covers cache entries [0, kv_len): by default the batch's longest row (one host sync); a CUDA graph
    passes a fixed kv_len (the whole cache). `first_slot`: the rows are slots first_slot, first_slot + 1, ... at
    home (`KVCache.metadata`).
    """
    positions = inputs.lengths.unsqueeze(1)
    key_length = int(inputs.lengths.max()) + 1 if kv_len is None else kv_len
    out = model(
        inputs.last.unsqueeze(1),
        positions,
        cache=cache,
        slots=inputs.slots,
        attn_mask=causal_mask_by_index(positions, key_length),
        first_slot=first_slot,
        feature_layers=feature_layers,
    )
    result = sample(out.logits[:, 0], inputs.sampling, inputs.lengths + 1)
    return PlainRoundResult(tokens=result.tokens, logprobs=result.logprobs, hidden=out.features[:, 0])

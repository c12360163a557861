"""Batched prefill: write the prompts' KV into their slots and return hidden states and last-token logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.engine.request import Request
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.models.masks import causal_mask_by_index


@dataclass
class PrefillResult:
    """Outputs of a prefill over B prompts right-padded to S tokens.

    hidden:      [B,S,H] policy hidden states (rows past a prompt's length are padding)
    last_logits: [B,V] logits at each prompt's last token (they sample the first response token)
    lengths:     [B] prompt lengths
    """

    hidden: torch.Tensor
    last_logits: torch.Tensor
    lengths: torch.Tensor


def prefill(model: CausalLM, cache: KVCache, requests: list[Request], pad_id: int = 0) -> PrefillResult:
    """Run the prompts of `requests` (already holding slots) through the model. # B prompts -> [B,S,H], [B,V]"""
    device = next(model.parameters()).device
    lengths = torch.tensor([len(r.prompt_ids) for r in requests], dtype=torch.long, device=device)
    width = int(lengths.max())
    ids = torch.full((len(requests), width), pad_id, dtype=torch.long, device=device)
    for row, request in enumerate(requests):
        ids[row, : len(request.prompt_ids)] = torch.tensor(request.prompt_ids, dtype=torch.long, device=device)
    positions = torch.arange(width, device=device).unsqueeze(0).expand(len(requests), -1)
    slots = torch.tensor([r.slot for r in requests], dtype=torch.long, device=device)
    # Padding tokens write KV past a prompt's end; those positions are overwritten before anything attends to them.
    out = model(
        ids, positions, cache=cache, slots=slots, attn_mask=causal_mask_by_index(positions, width), compute_logits=False
    )
    rows = torch.arange(len(requests), device=device)
    last_hidden = out.hidden[rows, lengths - 1]
    return PrefillResult(hidden=out.hidden, last_logits=model.logits(last_hidden), lengths=lengths)

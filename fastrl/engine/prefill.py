"""Batched prefill: write the prompts' KV into their slots and return hidden states and last-token logits.

With prefix sharing, requests whose prompts are identical (the n samples of one GRPO prompt) prefill once: the
first of them runs the model, the others get a copy of its KV, hidden states and logits.
"""

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
    computed_rows: int = 0


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
    return PrefillResult(
        hidden=out.hidden, last_logits=model.logits(last_hidden), lengths=lengths, computed_rows=len(requests)
    )


def prefill_shared(model: CausalLM, cache: KVCache, requests: list[Request], share: bool = True) -> PrefillResult:
    """`prefill`, running each distinct prompt once and copying its KV to the slots of its duplicates.

    Row b of the result belongs to requests[b] either way.  # B prompts -> [B,S,H], [B,V]
    """
    if not share:
        return prefill(model, cache, requests)
    first: dict[tuple[int, ...], int] = {}
    source = [first.setdefault(tuple(r.prompt_ids), row) for row, r in enumerate(requests)]
    unique_rows = sorted(first.values())
    if len(unique_rows) == len(requests):
        return prefill(model, cache, requests)
    result = prefill(model, cache, [requests[row] for row in unique_rows])
    position = {row: i for i, row in enumerate(unique_rows)}
    take = torch.tensor([position[s] for s in source], dtype=torch.long, device=result.lengths.device)
    copies = [
        (requests[s].slot, r.slot, len(r.prompt_ids))
        for row, (s, r) in enumerate(zip(source, requests, strict=True))
        if s != row
    ]
    for length in sorted({n for _, _, n in copies}):
        pairs = [(src, dst) for src, dst, n in copies if n == length]
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=cache.device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=cache.device)
        cache.copy_slots(src, dst, length)
    return PrefillResult(
        hidden=result.hidden.index_select(0, take),
        last_logits=result.last_logits.index_select(0, take),
        lengths=result.lengths.index_select(0, take),
        computed_rows=len(unique_rows),
    )

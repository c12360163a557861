"""Batched prefill: write the prompts' KV into their slots and return hidden states and last-token logits.

With prefix sharing, requests whose prompts are identical (the n samples of one GRPO prompt) prefill once: the
first of them runs the model; the others hold its full prompt pages by reference (the scheduler arranged that, and
a copy of the partial last page the runner makes after this prefill) and get a copy of its hidden states and logits.
The result says which rows ran (`PrefillResult.computed`), so the drafter's catch-up can run over those rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.engine.prefill_groups import length_groups, padded_width
from fastrl.engine.request import Request
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.models.masks import causal_mask_by_index


@dataclass
class PrefillResult:
    """Outputs of a prefill over B prompts right-padded to S tokens.

    features:    [B,S,F] the drafter's features of every prompt position (`ModelOutput.features`: the final-norm
                 state, F = H, or with `feature_layers` a fused drafter's input); rows past a prompt's length
                 are padding
    last_logits: [B,V] logits at each prompt's last token (they sample the first response token)
    lengths:     [B] prompt lengths
    computed:    the rows whose prompt the model ran (ascending; one per distinct prompt under sharing, every row
                 without): the other rows copy one of theirs and hold its prompt's pages
    """

    features: torch.Tensor
    last_logits: torch.Tensor
    lengths: torch.Tensor
    computed: list[int]

    @property
    def computed_rows(self) -> int:
        """How many rows the model ran."""
        return len(self.computed)


def prefill(
    model: CausalLM,
    cache: KVCache,
    prompts: list[list[int]],
    slots: list[int],
    pad_id: int = 0,
    feature_layers: tuple[int, ...] = (),
) -> PrefillResult:
    """Run `prompts` through the model, writing their KV into `slots`' pages: one forward per group of similar
    lengths (`length_groups`).  # B prompts -> [B,S,F], [B,V]"""
    device = next(model.parameters()).device
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
    groups = length_groups([len(p) for p in prompts])
    if len(groups) == 1:
        features, last_logits = _forward(model, cache, prompts, slots, pad_id, feature_layers)
    else:
        parts = []
        for rows in groups:
            sub = _forward(model, cache, [prompts[r] for r in rows], [slots[r] for r in rows], pad_id, feature_layers)
            parts.append((torch.tensor(rows, dtype=torch.long, device=device), *sub))
        width, size = max(part.shape[1] for _, part, _ in parts), parts[0][1].shape[-1]
        features = parts[0][1].new_zeros(len(prompts), width, size)
        last_logits = parts[0][2].new_empty(len(prompts), parts[0][2].shape[-1])
        for rows, part, logits in parts:
            features[rows, : part.shape[1]] = part
            last_logits[rows] = logits
    return PrefillResult(
        features=features, last_logits=last_logits, lengths=lengths, computed=list(range(len(prompts)))
    )


def _forward(
    model: CausalLM,
    cache: KVCache,
    prompts: list[list[int]],
    slots: list[int],
    pad_id: int,
    feature_layers: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over prompts right-padded to the longest (`padded_width`).  # B prompts -> features [B,S,F],
    last logits [B,V]"""
    device = next(model.parameters()).device
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
    width = padded_width(int(lengths.max()), cache.max_len)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long, device=device)
    positions = torch.arange(width, device=device).unsqueeze(0).expand(len(prompts), -1)
    slot_ids = torch.tensor(slots, dtype=torch.long, device=device)
    # Padding tokens write KV past a prompt's end (into scratch pages, or the prompt's own last page past its
    # end); nothing attends to those entries before they are overwritten.
    out = model(
        ids,
        positions,
        cache=cache,
        slots=slot_ids,
        attn_mask=causal_mask_by_index(positions, width),
        compute_logits=False,
        feature_layers=feature_layers,
    )
    rows = torch.arange(len(prompts), device=device)
    return out.features, model.logits(out.hidden[rows, lengths - 1])


def prefill_shared(
    model: CausalLM, cache: KVCache, requests: list[Request], feature_layers: tuple[int, ...] = ()
) -> PrefillResult:
    """`prefill` of the requests' prompts, running only those that do not share another's prompt pages
    (`Request.prompt_source`, set by the scheduler, names the request whose prefill fills them).

    Row b of the result belongs to requests[b] either way.  # B prompts -> [B,S,F], [B,V]
    """
    row_of = {r.request_id: row for row, r in enumerate(requests)}
    source = [row if r.prompt_source is None else row_of[r.prompt_source] for row, r in enumerate(requests)]
    unique_rows = sorted(set(source))
    computed = [requests[row] for row in unique_rows]
    result = prefill(
        model, cache, [r.prompt_ids for r in computed], [r.slot for r in computed], feature_layers=feature_layers
    )
    if len(unique_rows) == len(requests):
        return result
    position = {row: i for i, row in enumerate(unique_rows)}
    take = torch.tensor([position[s] for s in source], dtype=torch.long, device=result.lengths.device)
    return PrefillResult(
        features=result.features.index_select(0, take),
        last_logits=result.last_logits.index_select(0, take),
        lengths=result.lengths.index_select(0, take),
        computed=unique_rows,
    )

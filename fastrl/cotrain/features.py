"""Policy features of whole sequences (teacher forcing), for offline drafter training."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from fastrl.cotrain.feature_sequence import FeatureSequence
from fastrl.models.decoder import CausalLM


@torch.no_grad()
def policy_features(
    policy: CausalLM,
    sequences: list[list[int]],
    max_tokens: int = 16384,
    policy_version: int = 0,
    extra_layers: tuple[int, ...] = (),
) -> list[FeatureSequence]:
    """Run the policy over each full sequence (right-padded, causal) and cut drafter examples from its hidden
    states. With `extra_layers`, the outputs of those decoder layers come first and the final-norm state last
    (EAGLE-3's fused input: low, middle, last). The forward runs in the policy's dtype; the features are kept in
    float32 on the CPU whatever it is (a float64 policy's rounded, a bfloat16 one's exact), the trainer casting them
    to the drafter's.  # sequences of T+1 ids -> FeatureSequence, S = T entries, features [S,(len(extra_layers)+1)·H]
    """
    device = next(policy.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list[FeatureSequence | None] = [None] * len(sequences)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(sequences[order[end]]) * (end - start + 1) <= max_tokens:
            end += 1
        group = order[start:end]
        width = len(sequences[group[-1]])
        ids = torch.zeros(len(group), width, dtype=torch.long, device=device)
        for row, i in enumerate(group):
            ids[row, : len(sequences[i])] = torch.tensor(sequences[i], device=device)
        positions = torch.arange(width, device=device).expand(len(group), -1)
        with layer_outputs(policy, extra_layers) as captured:
            hidden: Tensor = policy(ids, positions, compute_logits=False).hidden
        hidden = torch.cat(captured + [hidden], dim=-1)
        for row, i in enumerate(group):
            n = len(sequences[i])
            out[i] = FeatureSequence.from_full_sequence(
                ids[row, :n].cpu(), hidden[row, :n].float().cpu(), policy_version
            )
        start = end
    return [s for s in out if s is not None]


@contextmanager
def layer_outputs(policy: CausalLM, layers: tuple[int, ...]) -> Iterator[list[Tensor]]:
    """Collects the outputs of decoder `layers` (in that order) of the policy forwards run inside the block, through
    forward hooks removed on exit. ValueError on a layer index outside the policy.  # each [B,S,H]"""
    count = len(policy.model.layers)
    bad = [i for i in layers if not 0 <= i < count]
    if bad:
        raise ValueError(f"extra_layers {list(bad)} outside the policy's {count} decoder layers")
    slots: dict[int, Tensor] = {}
    captured: list[Tensor] = []

    def hook(index: int):
        def keep(_module, _inputs, output: Tensor) -> None:
            slots[index] = output

        return keep

    handles = [policy.model.layers[i].register_forward_hook(hook(i)) for i in layers]
    try:
        yield captured
        captured.extend(slots[i] for i in layers)
    finally:
        for h in handles:
            h.remove()

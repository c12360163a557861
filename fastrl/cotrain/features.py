"""Policy features of whole sequences (teacher forcing), for offline drafter training."""

from __future__ import annotations

import torch
from torch import Tensor

from fastrl.cotrain.feature_sequence import FeatureSequence
from fastrl.models.decoder import CausalLM


@torch.no_grad()
def policy_features(
    policy: CausalLM, sequences: list[list[int]], max_tokens: int = 16384, policy_version: int = 0
) -> list[FeatureSequence]:
    """Run the policy over each full sequence (right-padded, causal) and cut drafter examples from its hidden
    states.  # sequences of T+1 ids -> FeatureSequence with S = T entries each"""
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
        hidden: Tensor = policy(ids, positions, compute_logits=False).hidden
        for row, i in enumerate(group):
            n = len(sequences[i])
            out[i] = FeatureSequence.from_full_sequence(
                ids[row, :n].cpu(), hidden[row, :n].float().cpu(), policy_version
            )
        start = end
    return [s for s in out if s is not None]

"""Greedy chain accept length without the engine: on the policy's own T=0 rollouts, a chain of `depth` drafts from
root entry j is accepted up to its first draft that differs from the rollout, so the training-time-test unroll over
the rollout (teacher tokens, the drafter's own features) gives every root's drafts exactly as drafting would."""

from __future__ import annotations

import torch

from fastrl.cotrain.drafter_trainer import make_batches
from fastrl.cotrain.eagle_loss import drafted_tokens, unrolled_predictions
from fastrl.cotrain.feature_sequence import FeatureBatch, FeatureSequence
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter


@torch.no_grad()
def greedy_chain_accept_length(
    drafter: EagleDrafter,
    policy: CausalLM,
    seqs: list[FeatureSequence],
    prompt_lengths: list[int],
    depth: int,
    max_tokens: int = 8192,
) -> float:
    """Tokens per round (accepted drafts + 1) of chain drafting of `depth` over greedy rollouts `seqs` (features
    from `policy_features`, entry i = position i+1) whose prompts have `prompt_lengths`: rounds walk each rollout
    from its first generated token, as the engine's rounds do.  # seqs: S entries each -> scalar"""
    if len(seqs) != len(prompt_lengths):
        raise ValueError(f"{len(seqs)} sequences but {len(prompt_lengths)} prompt lengths")
    drafter.eval()
    index = {id(s): i for i, s in enumerate(seqs)}
    tokens_total = rounds = 0
    for group in make_batches(seqs, max_tokens):
        batch = FeatureBatch.collate(group, target_size=drafter.config.hidden_size)
        preds = unrolled_predictions(drafter, policy, batch.tokens, batch.features, batch.positions, [1.0] * depth)
        drafts = torch.stack([drafted_tokens(drafter, drafter.draft_logits(policy, p)) for p in preds], -1)  # [B,S,d]
        for row, seq in enumerate(group):
            last = seq.tokens.shape[0] - 1
            j = prompt_lengths[index[id(seq)]] - 1  # entry of the first generated token x_n
            while j < last:
                accepted = 0
                while accepted < depth and j + accepted + 1 <= last:
                    if int(drafts[row, j, accepted]) != int(seq.tokens[j + accepted + 1]):
                        break
                    accepted += 1
                emitted = min(accepted + 1, last - j)
                tokens_total += emitted
                rounds += 1
                j += accepted + 1
    if rounds == 0:
        raise ValueError("greedy_chain_accept_length: no rounds (every rollout ended at its prompt)")
    return tokens_total / rounds

"""Greedy chain accept length without the engine: on the policy's own T=0 rollouts, a chain of `depth` drafts from
root entry j is accepted up to its first draft that differs from the rollout, so the training-time-test unroll over
the rollout (teacher tokens, the drafter's own features) gives every root's drafts exactly as drafting would."""

from __future__ import annotations

import torch
from torch import Tensor

from fastrl.cotrain.drafter_trainer import batch_indices
from fastrl.cotrain.eagle_loss import drafted_tokens, unrolled_predictions
from fastrl.cotrain.feature_sequence import FeatureBatch, FeatureSequence
from fastrl.json_values import is_integral
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
    from `policy_features`, entry i = position i+1) whose prompts have `prompt_lengths` (the i-th sequence's is the
    i-th): rounds walk each rollout from its first generated token, as the engine's rounds do.

    ValueError naming the argument for a depth below 1, a prompt length outside 1..S (S + 1 = the rollout's tokens:
    a rollout holds at least its first generated token) or a sequence that does not start at position 1; when no
    rollout has a second generated token, there is no round to count.

    # seqs: S entries each -> scalar
    """
    check_walk_inputs(seqs, prompt_lengths, depth)
    drafter.eval()
    tokens_total = rounds = 0
    for group in batch_indices(seqs, max_tokens):
        batch = FeatureBatch.collate([seqs[i] for i in group], target_size=drafter.config.hidden_size)
        preds = unrolled_predictions(drafter, policy, batch.tokens, batch.features, batch.positions, [1.0] * depth)
        drafts = torch.stack([drafted_tokens(drafter, drafter.draft_logits(policy, p)) for p in preds], -1)  # [B,S,d]
        for row, i in enumerate(group):
            emitted = chain_rounds(drafts[row], seqs[i].tokens, prompt_lengths[i] - 1)
            tokens_total += sum(emitted)
            rounds += len(emitted)
    if rounds == 0:
        raise ValueError(
            "greedy_chain_accept_length: no rounds (every rollout ended at its first generated token, which the "
            "policy samples before any round)"
        )
    return tokens_total / rounds


def chain_rounds(drafts: Tensor, tokens: Tensor, first: int) -> list[int]:
    """Tokens each round emits walking one rollout from entry `first` (its first generated token): a round accepts
    the chain's drafts up to the first that differs from the rollout, plus one, cut at the rollout's end.

    # drafts [S,depth] token ids (row j: the chain rooted at entry j), tokens [S] -> one count per round
    """
    last, depth = tokens.shape[0] - 1, drafts.shape[1]
    emitted: list[int] = []
    j = first
    while j < last:
        accepted = 0
        while accepted < depth and j + accepted + 1 <= last:
            if int(drafts[j, accepted]) != int(tokens[j + accepted + 1]):
                break
            accepted += 1
        emitted.append(min(accepted + 1, last - j))
        j += accepted + 1
    return emitted


def check_walk_inputs(seqs: list[FeatureSequence], prompt_lengths: list[int], depth: int) -> None:
    """ValueError naming the argument of ``greedy_chain_accept_length`` that is wrong (see there)."""
    if not is_integral(depth) or depth < 1:
        raise ValueError(f"greedy_chain_accept_length: depth must be an integer >= 1, got {depth!r}")
    if not seqs:
        raise ValueError("greedy_chain_accept_length: seqs is empty (no rollout to walk)")
    if len(seqs) != len(prompt_lengths):
        raise ValueError(
            f"greedy_chain_accept_length: seqs and prompt_lengths differ in length ({len(seqs)} and "
            f"{len(prompt_lengths)}): one prompt length per sequence"
        )
    for i, (seq, n) in enumerate(zip(seqs, prompt_lengths, strict=True)):
        if seq.start_position != 1:
            raise ValueError(
                f"greedy_chain_accept_length: seqs[{i}] starts at position {seq.start_position}; the walk needs "
                f"whole rollouts (start_position 1, as policy_features gives them)"
            )
        entries = seq.tokens.shape[0]
        if not is_integral(n) or not 1 <= n <= entries:
            raise ValueError(
                f"greedy_chain_accept_length: prompt_lengths[{i}] must be an integer in 1..{entries} (seqs[{i}] holds "
                f"{entries + 1} tokens, at least one of them generated), got {n!r}"
            )

"""The topk == 1 fast path of drafting: a chain of the drafter's own samples, no candidate bookkeeping.

It produces exactly the tree `grow_tree` builds for topk == 1 (Gumbel-top-1 is the perturbed argmax, and a
chain keeps all its nodes), with a few tensor ops per level instead of a candidate pool: on a CPU, or at small
batch on a GPU, per-op overhead is most of a drafter step's cost.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.sampling.sampler import SamplingBatch, perturbed_logits
from fastrl.speculative.draft_tree import DraftTree
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.runtime import StrategyRuntime


def grow_chain(
    drafter: EagleDrafter,
    policy: CausalLM,
    dcache: KVCache,
    slots: Tensor,
    lengths: Tensor,
    base: int,
    root_tokens: Tensor,
    root_feature: Tensor,
    sampling: SamplingBatch,
    runtime: StrategyRuntime,
    noise: Tensor | None = None,
) -> DraftTree:
    """`steps` drafted tokens per row; drafter entries of the chain go to [base + 1, base + steps).

    # lengths [B], root_tokens [B], root_feature [B,H], noise [B,L,V] | None -> DraftTree with N = steps + 1
    """
    if runtime.chain is None:
        raise ValueError(f"strategy {runtime.strategy} is not a chain (topk must be 1)")
    b = lengths.shape[0]
    dev = lengths.device
    prefix = torch.arange(base + 1, device=dev)
    prefix_mask = ((prefix >= 1) & (prefix <= lengths.unsqueeze(1))).unsqueeze(1)  # [B,1,base+1]
    feature = root_feature
    token = perturbed_logits(policy.logits(feature), sampling, lengths + 1, _level(noise, 0)).argmax(-1)
    tokens = [root_tokens, token]
    for level in range(1, runtime.strategy.steps):
        mask = torch.cat([prefix_mask, torch.ones(b, 1, level, dtype=torch.bool, device=dev)], dim=-1)
        index = torch.full((b, 1), base + level, dtype=torch.long, device=dev)
        positions = (lengths + level).unsqueeze(1)
        feature = drafter(policy, token.unsqueeze(1), feature.unsqueeze(1), positions, dcache, slots, index, mask)[:, 0]
        logits = policy.logits(feature)
        token = perturbed_logits(logits, sampling, lengths + level + 1, _level(noise, level)).argmax(-1)
        tokens.append(token)
    parents, depths, ancestors = runtime.chain
    return DraftTree(
        torch.stack(tokens, dim=1), parents.expand(b, -1), depths.expand(b, -1), ancestors.expand(b, -1, -1)
    )


def _level(noise: Tensor | None, level: int) -> Tensor | None:
    # [B,L,V] -> [B,V] | None
    return None if noise is None else noise[:, level]

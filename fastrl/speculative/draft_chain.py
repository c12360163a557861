"""The topk == 1 fast path of drafting: a chain of the drafter's own samples, no candidate bookkeeping.

It produces exactly the tree `grow_tree` builds for topk == 1 (Gumbel-top-1 is the perturbed argmax, and a
chain keeps all its nodes), with a few tensor ops per level instead of a candidate pool: on a CPU, or at small
batch on a GPU, per-op overhead is most of a drafter step's cost.
"""

from __future__ import annotations

import torch

from fastrl.sampling.sampler import perturbed_logits
from fastrl.speculative.draft_context import DraftContext
from fastrl.speculative.draft_tree import DraftTree


def grow_chain(ctx: DraftContext) -> DraftTree:
    """`steps` drafted tokens per row; drafter entries of the chain go to [base + 1, base + steps).

    # lengths [B], root_tokens [B], root_feature [B,H] -> DraftTree with N = steps + 1
    """
    runtime, lengths, base = ctx.runtime, ctx.lengths, ctx.base
    if runtime.chain is None:
        raise ValueError(f"strategy {runtime.strategy} is not a chain (topk must be 1)")
    b = lengths.shape[0]
    dev = lengths.device
    prefix = torch.arange(base + 1, device=dev)
    prefix_mask = ((prefix >= 1) & (prefix <= lengths.unsqueeze(1))).unsqueeze(1)  # [B,1,base+1]
    feature = ctx.root_feature
    pick = perturbed_logits(ctx.logits(feature), ctx.sampling, lengths + 1, ctx.level_noise(0)).argmax(-1)
    token = ctx.tokens(pick)
    tokens = [ctx.root_tokens, token]
    for level in range(1, runtime.strategy.steps):
        mask = torch.cat([prefix_mask, torch.ones(b, 1, level, dtype=torch.bool, device=dev)], dim=-1)
        index = torch.full((b, 1), base + level, dtype=torch.long, device=dev)
        positions = (lengths + level).unsqueeze(1)
        step = ctx.step(token.unsqueeze(1), feature.unsqueeze(1), positions, index, mask)
        feature = step[:, 0]
        noise = ctx.level_noise(level)
        pick = perturbed_logits(ctx.logits(feature), ctx.sampling, lengths + level + 1, noise).argmax(-1)
        token = ctx.tokens(pick)
        tokens.append(token)
    parents, depths, ancestors = runtime.chain
    return DraftTree(
        torch.stack(tokens, dim=1), parents.expand(b, -1), depths.expand(b, -1), ancestors.expand(b, -1, -1)
    )

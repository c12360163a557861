"""The topk == 1 fast path of drafting: a chain of the drafter's own samples, no candidate bookkeeping.

It produces exactly the tree `grow_tree` builds for topk == 1 (Gumbel-top-1 is the perturbed argmax, and a
chain keeps all its nodes), with a few tensor ops per level instead of a candidate pool: on a CPU, or at small
batch on a GPU, per-op overhead is most of a drafter step's cost.

A chain with a confidence stop (`S_1_N@P`) ends early: each row's chain so far is right with the drafter's
probability of it (the product of its drafts' probabilities under the drafter's processed distribution), and once
the mean of that over the rows falls below P the token just drafted is the chain's last: the next level would be
used by fewer than P rows in expectation (at batch 1, the chain stops when it is less than P likely to be right).
Deciding it reads one value per level on the host, so such chains run eagerly (never in a CUDA graph).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastrl.sampling.sampler import perturbed_logits, sample
from fastrl.speculative.draft_context import DraftContext
from fastrl.speculative.draft_tree import DraftTree


def grow_chain(ctx: DraftContext) -> DraftTree:
    """Up to `steps` drafted tokens per row (all of them without a stop); drafter entries of the chain go to
    [base + 1, base + steps).

    # lengths [B], root_tokens [B], root_feature [B,H] -> DraftTree with N = drafted + 1 <= steps + 1
    """
    runtime, lengths, base = ctx.runtime, ctx.lengths, ctx.base
    if runtime.chain is None:
        raise ValueError(f"strategy {runtime.strategy} is not a chain (topk must be 1)")
    b = lengths.shape[0]
    dev = lengths.device
    stop = runtime.strategy.stop_below
    prefix = torch.arange(base + 1, device=dev)
    prefix_mask = ((prefix >= 1) & (prefix <= lengths.unsqueeze(1))).unsqueeze(1)  # [B,1,base+1]
    feature = ctx.root_feature
    token, sure = _draft_level(ctx, feature, 0, stop)
    tokens = [ctx.root_tokens, token]
    for level in range(1, runtime.strategy.steps):
        if sure is not None and float(sure.mean()) < stop:  # the next level would serve fewer than P rows
            break
        mask = torch.cat([prefix_mask, torch.ones(b, 1, level, dtype=torch.bool, device=dev)], dim=-1)
        index = torch.full((b, 1), base + level, dtype=torch.long, device=dev)
        positions = (lengths + level).unsqueeze(1)
        step = ctx.step(token.unsqueeze(1), feature.unsqueeze(1), positions, index, mask)
        feature = step[:, 0]
        token, now_sure = _draft_level(ctx, feature, level, stop)
        sure = None if sure is None or now_sure is None else sure * now_sure
        tokens.append(token)
    parents, depths, ancestors = runtime.at_depth(len(tokens) - 1).chain  # type: ignore[misc]
    return DraftTree(
        torch.stack(tokens, dim=1), parents.expand(b, -1), depths.expand(b, -1), ancestors.expand(b, -1, -1)
    )


def _draft_level(ctx: DraftContext, feature: Tensor, level: int, stop: float) -> tuple[Tensor, Tensor | None]:
    """The drafted token at `level` (position lengths + level + 1) and, with a stop, its draft probability.

    # feature [B,H] -> tokens [B], probability [B] float | None
    """
    logits = ctx.logits(feature)
    positions = ctx.lengths + level + 1
    if stop <= 0:
        return ctx.tokens(perturbed_logits(logits, ctx.sampling, positions, ctx.level_noise(level)).argmax(-1)), None
    drawn = sample(logits, ctx.sampling, positions, ctx.level_noise(level))  # the same argmax, and its log-prob
    # a row whose drafter is not finite is sure of nothing (NaN would keep the batch's mean from ever stopping)
    return ctx.tokens(drawn.tokens), drawn.logprobs.exp().nan_to_num(0.0, posinf=0.0, neginf=0.0)

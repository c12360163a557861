"""Running the drafter for one round: catch up on the tokens the policy emitted, then grow an EAGLE-2 tree.

Drafter cache layout per row (n = position of the root, the last emitted token): entries 1..n hold the drafter's
prefix (entry p read token x_p and feature f_{p-1}); the tree expansions of a round are written at a shared area
[base + 1, base + 1 + T) with base = max(n) over the batch, which lies past every row's prefix and is overwritten
by later rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.speculative.draft_chain import grow_chain
from fastrl.speculative.draft_context import DraftContext
from fastrl.speculative.draft_tree import Candidates, DraftTree, finalize_tree, gumbel_topk
from fastrl.speculative.drafter import EagleDrafter


@dataclass
class DrafterInput:
    """Entries each row's drafter has not seen yet, left-aligned: the last one is the root (x_n, f_{n-1}).

    tokens: [B,K] long; features: [B,K,H]; counts: [B] long (>= 1), valid entries per row
    """

    tokens: Tensor
    features: Tensor
    counts: Tensor


def catch_up(
    drafter: EagleDrafter,
    policy: CausalLM,
    dcache: KVCache,
    slots: Tensor,
    lengths: Tensor,
    base: int,
    new: DrafterInput,
    first_slot: int | None = None,
    step_kernel: bool = True,
) -> Tensor:
    """Feed the pending entries of every row; returns the drafter's output at each root.  # -> [B,H]

    Row b's entries sit at positions lengths[b] - counts[b] + 1 .. lengths[b]; padding goes to entry base + 1 and
    attends to itself alone (its output is dropped; a row's keys between its length and base stay unread).
    `first_slot`: the rows read their keys in place (`KVCache.metadata`); `step_kernel`: see `EagleDrafter.forward`.
    """
    b, k = new.tokens.shape
    cols = torch.arange(k, device=lengths.device)
    valid = cols.unsqueeze(0) < new.counts.unsqueeze(1)
    positions = (lengths - new.counts + 1).unsqueeze(1) + cols.unsqueeze(0)
    index = torch.where(valid, positions, base + 1)
    keys = torch.arange(base + 2, device=lengths.device)
    mask = torch.where(valid.unsqueeze(-1), (keys >= 1) & (keys <= index.unsqueeze(-1)), keys == base + 1)
    clamped = positions.clamp(min=0)
    out = drafter(policy, new.tokens, new.features, clamped, dcache, slots, index, mask, first_slot, step_kernel)
    return out[torch.arange(b, device=lengths.device), new.counts - 1]


def split_pending(new: DrafterInput, width: int) -> tuple[DrafterInput, DrafterInput, Tensor]:
    """Each row's last min(count, width) pending entries, left-aligned in `width` columns (what a graphed round's
    catch-up reads), and the entries before them (counts 0 where none), with the latter's last position below the
    row's length by what the former took (`catch_up` them first at `lengths - taken`).
    # tokens [B,K], features [B,K,F], counts [B] -> ([B,width], [B,width,F], [B]), the earlier entries, taken [B]"""
    b, k = new.tokens.shape
    taken = new.counts.clamp(max=width)
    earlier = new.counts - taken
    index = (earlier.unsqueeze(1) + torch.arange(width, device=new.counts.device)).clamp(max=k - 1)  # [B,width]
    tokens = new.tokens.gather(1, index)
    features = new.features.gather(1, index.unsqueeze(-1).expand(-1, -1, new.features.shape[-1]))
    return DrafterInput(tokens, features, taken), DrafterInput(new.tokens, new.features, earlier), taken


def draft(ctx: DraftContext) -> DraftTree:
    """The round's draft trees: a chain of the drafter's own samples when topk == 1, else an EAGLE-2 tree.

    # B rows -> DraftTree with N = num_draft_tokens
    """
    return grow_chain(ctx) if ctx.runtime.is_chain else grow_tree(ctx)


def grow_tree(ctx: DraftContext) -> DraftTree:
    """EAGLE-2 expansion: `steps` levels, `topk` best frontier nodes expanded per level, best N kept.

    # lengths [B], root_tokens [B], root_feature [B,H] -> DraftTree with N = num_draft_tokens
    """
    lengths, base, runtime = ctx.lengths, ctx.base, ctx.runtime
    strategy = runtime.strategy
    k = strategy.topk
    b = lengths.shape[0]
    dev = lengths.device
    cands = Candidates()
    top, scores = gumbel_topk(ctx.logits(ctx.root_feature), ctx.sampling, lengths + 1, k, ctx.level_noise(0))
    tokens = ctx.tokens(top)
    ids = cands.add_level(tokens, torch.full_like(tokens, -1), scores, depth=1)
    frontier_ids = ids.expand(b, k)
    features = ctx.root_feature.unsqueeze(1).expand(b, k, -1)
    area = runtime.tree_area
    ancestors = torch.zeros(b, k, area, dtype=torch.bool, device=dev)
    prefix = torch.arange(base + 1, device=dev)
    prefix_mask = ((prefix >= 1) & (prefix <= lengths.unsqueeze(1))).unsqueeze(1).expand(b, k, -1)
    rows_k = torch.arange(b, device=dev).repeat_interleave(k)
    sampling_k = ctx.sampling.index(rows_k)
    for depth in range(2, strategy.steps + 1):
        level = depth - 2
        own = runtime.self_bits[level].unsqueeze(0)  # [1,k,T]
        mask = torch.cat([prefix_mask, ancestors | own], dim=-1)
        positions = (lengths + depth - 1).unsqueeze(1).expand(b, k)
        index = (base + 1 + level * k + torch.arange(k, device=dev)).expand(b, k)
        out = ctx.step(tokens, features, positions, index, mask)  # [B,k,H]
        child_pos = (lengths + depth).repeat_interleave(k)
        level_noise = ctx.level_noise(depth - 1)
        level_noise = None if level_noise is None else level_noise.repeat_interleave(k, dim=0)
        logits = ctx.logits(out).reshape(b * k, -1)
        child_top, child_scores = gumbel_topk(logits, sampling_k, child_pos, k, level_noise)
        child_tokens = ctx.tokens(child_top).view(b, k * k)
        child_scores = (scores.unsqueeze(-1) + child_scores.view(b, k, k)).view(b, k * k)
        child_parents = frontier_ids.repeat_interleave(k, dim=1)
        ids = cands.add_level(child_tokens, child_parents, child_scores, depth)
        if depth == strategy.steps:
            break
        best = torch.topk(child_scores, k, dim=1).indices  # [B,k] into this level
        parent_col = best // k
        tokens = child_tokens.gather(1, best)
        scores = child_scores.gather(1, best)
        frontier_ids = ids[best]
        features = out.gather(1, parent_col.unsqueeze(-1).expand(-1, -1, out.shape[-1]))
        ancestors = (ancestors | own.expand(b, -1, -1)).gather(1, parent_col.unsqueeze(-1).expand(-1, -1, area))
    return finalize_tree(ctx.root_tokens, cands, strategy.num_draft_tokens, runtime.max_depth)

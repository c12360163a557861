"""A speculative decode round: draft a tree per row, verify all trees in one policy forward, keep the agreeing path."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.engine.batch import RunningBatch
from fastrl.models.decoder import CausalLM
from fastrl.models.kv_cache import KVCache
from fastrl.sampling.sampler import sample, sampling_noise
from fastrl.spec.draft_chain import grow_chain
from fastrl.spec.drafter import EagleDrafter
from fastrl.spec.drafting import DrafterInput, catch_up, grow_tree
from fastrl.spec.runtime import StrategyRuntime
from fastrl.spec.verify_tree import verify_tree


@dataclass
class SpecRoundResult:
    """Per row, the emitted tokens (accepted drafts, then the policy's own token) and what produced them.

    tokens: [B,D+1], logprobs: [B,D+1], hidden: [B,D+1,H] (entry j produced token j); entries past
    accept_len[b] are padding. accept_len: [B] accepted draft tokens. Times in seconds.
    """

    tokens: Tensor
    logprobs: Tensor
    hidden: Tensor
    accept_len: Tensor
    draft_time_s: float
    verify_time_s: float


def speculative_round(
    policy: CausalLM,
    drafter: EagleDrafter,
    cache: KVCache,
    dcache: KVCache,
    batch: RunningBatch,
    pending: DrafterInput,
    runtime: StrategyRuntime,
) -> SpecRoundResult:
    """One round of EAGLE speculation for the whole batch. # [B] rows -> up to D+1 tokens per row"""
    t0 = time.perf_counter()
    n = batch.lengths
    base = int(n.max())
    b = batch.size
    slots = cache.rows(batch.slots)
    dslots = dcache.rows(batch.slots)
    # The sampler noise of every position this round can touch, computed once: n+1 .. n+levels.
    levels = runtime.noise_levels
    level_rows = torch.arange(b, device=n.device).repeat_interleave(levels)
    level_pos = (n.unsqueeze(1) + 1 + torch.arange(levels, device=n.device)).reshape(-1)
    vocab = policy.config.vocab_size
    flat_noise = sampling_noise(batch.sampling.index(level_rows), level_pos, vocab)
    noise = None if flat_noise is None else flat_noise.view(b, levels, vocab)
    root_feature = catch_up(drafter, policy, dcache, dslots, n, base, pending)
    grow = grow_chain if runtime.is_chain else grow_tree
    tree = grow(drafter, policy, dcache, dslots, n, base, batch.last, root_feature, batch.sampling, runtime, noise)
    t1 = time.perf_counter()

    nodes = tree.num_nodes
    prefix = torch.arange(base, device=n.device)
    prefix_mask = (prefix < n.unsqueeze(1)).unsqueeze(1).expand(b, nodes, base)
    mask = torch.cat([prefix_mask, tree.ancestors], dim=-1)
    index = (base + runtime.node_range).expand(b, nodes)
    out = policy(tree.tokens, n.unsqueeze(1) + tree.depths, cache=cache, slots=slots, cache_index=index, attn_mask=mask)
    rows = torch.arange(b, device=n.device).repeat_interleave(nodes)
    positions = (n.unsqueeze(1) + tree.depths + 1).reshape(-1)
    node_noise = None if noise is None else noise.gather(1, tree.depths.unsqueeze(-1).expand(-1, -1, vocab))
    node_noise = None if node_noise is None else node_noise.reshape(b * nodes, vocab)
    sampled = sample(out.logits.reshape(b * nodes, -1), batch.sampling.index(rows), positions, node_noise)
    targets = sampled.tokens.view(b, nodes)
    acc = verify_tree(tree, targets, runtime.max_depth)

    # Compact the accepted path's KV from its tree slots to its sequence positions (a no-op past the path).
    depth_range = runtime.level_range.unsqueeze(0)
    dst = n.unsqueeze(1) + depth_range
    src = torch.where(depth_range <= acc.accept_len.unsqueeze(1), base + acc.path, dst)
    cache.move(slots, src, dst)
    path_hidden = out.hidden.gather(1, acc.path.unsqueeze(-1).expand(-1, -1, out.hidden.shape[-1]))
    t2 = time.perf_counter()
    return SpecRoundResult(
        tokens=targets.gather(1, acc.path),
        logprobs=sampled.logprobs.view(b, nodes).gather(1, acc.path),
        hidden=path_hidden,
        accept_len=acc.accept_len,
        draft_time_s=t1 - t0,
        verify_time_s=t2 - t1,
    )

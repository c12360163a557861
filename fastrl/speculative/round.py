"""A speculative decode round: draft a tree per row, verify all trees in one policy forward, keep the agreeing path.

The round has two parts. `catch_up` feeds each row's drafter the entries it has not read (their number varies from
round to round). `draft_and_verify` is everything after it; its shapes depend only on the batch size, the strategy
and `base` (>= every row's length: attention covers policy cache entries [0, base + N), the drafter's tree steps go
to its entries past base), so on a GPU it is captured once per strategy and batch bucket as a CUDA graph (with
`base` fixed at the end of the cache) and replayed; on a CPU `base` is the batch's longest row, which keeps
attention short. The policy writes row b's tree node i at its entry n_b + i, so a chain's accepted path is at its
sequence positions already; a tree's is moved there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fastrl.models.decoder import CausalLM
from fastrl.models.device_sync import drain
from fastrl.models.kv_cache import KVCache
from fastrl.sampling.sampler import sample, sampling_noise
from fastrl.speculative.draft_tree import DraftTree, merge_trees
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafting import DraftContext, DrafterInput, catch_up, draft
from fastrl.speculative.inputs import DecodeInputs
from fastrl.speculative.runtime import StrategyRuntime
from fastrl.speculative.verify_tree import verify_tree


@dataclass(frozen=True)
class SpecModels:
    """What a speculative round runs on: the policy and its KV cache, and (for EAGLE strategies) the drafter and
    its cache. History-only rounds need no drafter. `feature_layers`: the policy layers whose outputs the verify
    forward returns with its final-norm states (`ModelOutput.features`: a fused drafter's `extra_layers`)."""

    policy: CausalLM
    cache: KVCache
    drafter: EagleDrafter | None = None
    dcache: KVCache | None = None
    feature_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class InPlaceReads:
    """Which forwards of a speculative round read their keys in place instead of gathering them: each field is the
    `first_slot` that forward passes to `KVCache.metadata`, or None to gather. In place needs the rows to be slots
    first_slot, first_slot + 1, ... holding only their home pages, and every entry the forward writes to lie in a
    page its row holds (a write to a scratch page would not be seen by a view). `verify`: the policy's tree nodes
    (entries n_b + i); `draft`: the drafter's catch-up and expansions."""

    verify: int | None = None
    draft: int | None = None

    @classmethod
    def decide(cls, first_slot: int, lengths: list[int], runtime: StrategyRuntime, held_past: int) -> InPlaceReads:
        """What may read in place when the rows are consecutive slots at home from `first_slot` and every row b holds
        pages for entries [0, lengths[b] + held_past) (the scheduler reserves a round's lookahead).  # host values

        Tree node i of row b goes to entry n_b + i (i < num_nodes); the drafter writes catch-up entries <= n_b and
        expansions at base + 1 .. base + draft_reach, base = max(n), so the shortest row bounds it.
        """
        verify = runtime.num_nodes <= held_past
        draft = max(lengths) - min(lengths) + runtime.draft_reach < held_past
        return cls(first_slot if verify else None, first_slot if draft else None)


@dataclass
class SpecRoundResult:
    """Per row, the emitted tokens (accepted drafts, then the policy's own token) and what produced them.

    tokens: [B,D+1], logprobs: [B,D+1], hidden: [B,D+1,F] (the features, `ModelOutput.features`, of the
    state that produced token j: what the drafter reads next; F = H without feature layers); entries past
    accepted[b] are padding. accepted: [B] accepted draft tokens. draft_nodes: tree
    nodes verified per row, root excluded (fewer than the strategy's when a chain stopped early). Times in seconds.
    """

    tokens: Tensor
    logprobs: Tensor
    hidden: Tensor
    accepted: Tensor
    draft_nodes: int = 0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    catch_up_time_s: float = 0.0
    """The drafter's catch-up, a part of ``draft_time_s`` (0.0 unless the round was asked to time it)."""
    chain_depth: int | None = None
    """A stopping chain's levels drafted (its EAGLE part's: a hybrid's history nodes are not levels); else None."""

    def padded(self, levels: int) -> SpecRoundResult:
        """The same result with its per-row entries zero-padded to `levels`.  # [B,D+1] -> [B,levels]"""
        pad = levels - self.tokens.shape[1]
        return SpecRoundResult(
            F.pad(self.tokens, (0, pad)),
            F.pad(self.logprobs, (0, pad)),
            F.pad(self.hidden, (0, 0, 0, pad)),
            self.accepted,
            self.draft_nodes,
            self.draft_time_s,
            self.verify_time_s,
            self.catch_up_time_s,
        )


def speculative_round(
    models: SpecModels,
    inputs: DecodeInputs,
    runtime: StrategyRuntime,
    pending: DrafterInput | None = None,
    history: DraftTree | None = None,
    reads: InPlaceReads | None = None,
    time_catch_up: bool = False,
) -> SpecRoundResult:
    """One speculative round for the whole batch, eagerly: the EAGLE tree (after drafter catch-up on `pending`),
    the `history` tree, or their union, verified in one policy forward; `reads` says which forwards read their
    keys in place (None: all gather them); `time_catch_up`: time the catch-up (see ``timed_catch_up``).
    # [B] rows -> up to D+1 tokens per row"""
    t0 = time.perf_counter()
    base = int(inputs.lengths.max())
    reads = reads or InPlaceReads()
    root_feature, catch_up_s = None, 0.0
    if runtime.strategy.uses_drafter:
        if pending is None:
            raise ValueError(f"strategy {runtime.strategy} drafts with EAGLE: the drafter's pending input is needed")
        root_feature, catch_up_s = timed_catch_up(models, inputs, pending, base, reads.draft, time_catch_up)
    draft = draft_trees(models, inputs, root_feature, runtime, base, history, reads.draft)
    t1 = time.perf_counter()
    result = verify_trees(models, inputs, draft, draft.runtime, base, reads.verify)
    if draft.runtime is not runtime:  # a chain that stopped early: its rows padded to the strategy's width
        result = result.padded(runtime.max_depth + 1)
    result.draft_time_s, result.verify_time_s = t1 - t0, time.perf_counter() - t1
    result.catch_up_time_s = catch_up_s
    if runtime.strategy.stops_early:
        result.chain_depth = draft.runtime.strategy.steps
    return result


def timed_catch_up(
    models: SpecModels, inputs: DecodeInputs, pending: DrafterInput, base: int, first_slot: int | None, timed: bool
) -> tuple[Tensor, float]:
    """``catch_drafter_up`` and, when ``timed``, its seconds (the device's queue drained before and after it, so
    the time is the catch-up's own; 0.0 untimed). A round after rounds without the drafter catches up on every
    token they emitted: a cost of those rounds as much as of this one, which the bandit does not charge to the arm.
    # -> [B,H], seconds"""
    if not timed:
        return catch_drafter_up(models, inputs, pending, base, first_slot), 0.0
    device = inputs.lengths.device
    drain(device)
    start = time.perf_counter()
    root_feature = catch_drafter_up(models, inputs, pending, base, first_slot)
    drain(device)
    return root_feature, time.perf_counter() - start


def catch_drafter_up(
    models: SpecModels, inputs: DecodeInputs, pending: DrafterInput, base: int, first_slot: int | None = None
) -> Tensor:
    """Feed every row's drafter its unread entries; the drafter's output at each root.  # -> [B,H]"""
    dslots = models.dcache.rows(inputs.slots)
    return catch_up(models.drafter, models.policy, models.dcache, dslots, inputs.lengths, base, pending, first_slot)


def draft_and_verify(
    models: SpecModels, inputs: DecodeInputs, root_feature: Tensor, runtime: StrategyRuntime, base: int
) -> SpecRoundResult:
    """The part of a round after catch-up, with no host synchronisation: what a CUDA graph captures.

    `base` >= every row's length: tree node i of row b goes to policy cache entry n_b + i (attention covers
    [0, base + N)) and the drafter's to entries [base + 1, base + 1 + T).  # [B] rows, root_feature [B,H] -> result
    """
    if runtime.strategy.stops_early:
        raise ValueError(f"strategy {runtime.strategy} decides its length on the host: it runs eagerly")
    return verify_trees(models, inputs, draft_trees(models, inputs, root_feature, runtime, base), runtime, base)


@dataclass
class Draft:
    """A round's draft trees, the sampler noise of the positions they cover ([B,L,V], None if all greedy) and the
    runtime that verifies them (the strategy's, or a shorter chain's when its chain stopped early)."""

    tree: DraftTree
    noise: Tensor | None
    runtime: StrategyRuntime


def draft_trees(
    models: SpecModels,
    inputs: DecodeInputs,
    root_feature: Tensor | None,
    runtime: StrategyRuntime,
    base: int,
    history: DraftTree | None = None,
    first_slot: int | None = None,
) -> Draft:
    """Compute the round's sampler noise once, then draft each row's tree: the EAGLE tree (a chain when
    topk == 1) of `root_feature`, the `history` tree, or the union of both under the shared root (`first_slot`:
    the drafter reads its keys in place)."""
    n = inputs.lengths
    b = n.shape[0]
    # The sampler noise of every position this round can touch, computed once: n+1 .. n+levels.
    levels = runtime.noise_levels
    level_rows = torch.arange(b, device=n.device).repeat_interleave(levels)
    level_pos = (n.unsqueeze(1) + 1 + torch.arange(levels, device=n.device)).reshape(-1)
    vocab = models.policy.config.vocab_size
    flat_noise = sampling_noise(inputs.sampling.index(level_rows), level_pos, vocab)
    noise = None if flat_noise is None else flat_noise.view(b, levels, vocab)
    trees = []
    if runtime.strategy.uses_drafter:
        if root_feature is None or models.drafter is None or models.dcache is None:
            raise ValueError(f"strategy {runtime.strategy} needs the drafter and its root features")
        context = DraftContext(
            drafter=models.drafter,
            policy=models.policy,
            dcache=models.dcache,
            slots=models.dcache.rows(inputs.slots),
            lengths=n,
            base=base,
            root_tokens=inputs.last,
            root_feature=root_feature,
            sampling=inputs.sampling,
            runtime=runtime,
            noise=noise,
            first_slot=first_slot,
        )
        trees.append(draft(context))
        if runtime.strategy.stops_early:
            runtime = runtime.at_depth(trees[0].num_nodes - 1)
    if runtime.strategy.is_history:
        if history is None:
            raise ValueError(f"strategy {runtime.strategy} drafts from history: the history tree is needed")
        history.tokens[:, 0] = inputs.last  # the root is the row's last emitted token, whatever the index holds
        trees.append(history)
    tree = trees[0] if len(trees) == 1 else merge_trees(trees[0], trees[1])
    return Draft(tree, noise, runtime)


def tree_attention_mask(ancestors: Tensor, lengths: Tensor, kv_len: int) -> Tensor:
    """Which cache entries each tree node attends: row b's prefix [0, n_b) and, at entries n_b + j, tree node j
    when it is the node itself or one of its ancestors; nothing else (stale entries past the tree included).

    # ancestors [B,N,N] bool, lengths [B] (n), kv_len >= max(n) + N -> [B,N,kv_len] bool
    """
    b, nodes, _ = ancestors.shape
    offset = torch.arange(kv_len, device=lengths.device).unsqueeze(0) - lengths.unsqueeze(1)  # [B,L] node j = key - n
    in_tree = (offset >= 0) & (offset < nodes)
    node = offset.clamp(0, nodes - 1).unsqueeze(1).expand(b, nodes, kv_len)
    return (offset < 0).unsqueeze(1) | (ancestors.gather(2, node) & in_tree.unsqueeze(1))


def verify_trees(
    models: SpecModels,
    inputs: DecodeInputs,
    draft: Draft,
    runtime: StrategyRuntime,
    base: int,
    first_slot: int | None = None,
) -> SpecRoundResult:
    """One policy forward over every tree node (node i of row b at cache entry n_b + i), the policy's sample at
    each node, the longest agreeing path; the accepted path's KV ends at its sequence positions (`first_slot`: the
    policy reads its keys in place)."""
    policy, cache, tree, noise = models.policy, models.cache, draft.tree, draft.noise
    n = inputs.lengths
    b = n.shape[0]
    vocab = policy.config.vocab_size
    slots = cache.rows(inputs.slots)
    nodes = tree.num_nodes
    index = n.unsqueeze(1) + runtime.node_range  # [B,N] node i at cache entry n + i
    mask = tree_attention_mask(tree.ancestors, n, base + nodes)
    out = policy(
        tree.tokens,
        n.unsqueeze(1) + tree.depths,
        cache=cache,
        slots=slots,
        cache_index=index,
        attn_mask=mask,
        first_slot=first_slot,
        feature_layers=models.feature_layers,
    )
    rows = torch.arange(b, device=n.device).repeat_interleave(nodes)
    positions = (n.unsqueeze(1) + tree.depths + 1).reshape(-1)
    node_noise = None
    if noise is not None:  # the noise of each node's depth (a chain's node i is at depth i)
        depths = tree.depths.unsqueeze(-1).expand(-1, -1, vocab)
        node_noise = noise[:, :nodes] if runtime.verifies_chain else noise.gather(1, depths)
        node_noise = node_noise.reshape(b * nodes, vocab)
    sampled = sample(out.logits.reshape(b * nodes, -1), inputs.sampling.index(rows), positions, node_noise)
    targets = sampled.tokens.view(b, nodes)
    acc = verify_tree(tree, targets, runtime.max_depth)

    # The accepted path's KV to its sequence positions: node path[d] sits at n + path[d], its token at n + d (a
    # no-op past the path). A chain's node d is its depth-d node, so a chain's path is in place already.
    if not runtime.verifies_chain:
        depth_range = runtime.level_range.unsqueeze(0)
        dst = n.unsqueeze(1) + depth_range
        src = torch.where(depth_range <= acc.accepted.unsqueeze(1), n.unsqueeze(1) + acc.path, dst)
        cache.move(slots, src, dst)
    logprobs = sampled.logprobs.view(b, nodes)
    if runtime.verifies_chain:  # the path's first accepted + 1 nodes are the chain's first ones (the rest: padding)
        levels = runtime.max_depth + 1
        return SpecRoundResult(
            targets[:, :levels], logprobs[:, :levels], out.features[:, :levels], acc.accepted, nodes - 1
        )
    path_hidden = out.features.gather(1, acc.path.unsqueeze(-1).expand(-1, -1, out.features.shape[-1]))
    return SpecRoundResult(
        tokens=targets.gather(1, acc.path),
        logprobs=logprobs.gather(1, acc.path),
        hidden=path_hidden,
        accepted=acc.accepted,
        draft_nodes=nodes - 1,
    )

"""EAGLE-2 draft trees as batched tensors: candidate bookkeeping, Gumbel-top-k children, best-N pruning, masks.

Node 0 of every tree is the root (the last emitted token, not yet seen by the policy). Nodes are stored in
topological order (a parent precedes its children), so index-ordered selections stay ancestor-closed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from fastrl.sampling.sampler import SamplingBatch, perturbed_logits

# Floor of a candidate's log-score (tokens the sampler masks out score -inf): finite, so a child always ranks
# strictly below its parent.
MIN_LOG_SCORE = -1e4


@dataclass
class DraftTree:
    """A batch of draft trees with N nodes each.

    tokens:    [B,N] long, node 0 = root
    parents:   [B,N] long, parent node index (-1 for the root)
    depths:    [B,N] long, root depth 0
    ancestors: [B,N,N] bool, ancestors[b,i,j] = node j is node i or one of its ancestors
    """

    tokens: Tensor
    parents: Tensor
    depths: Tensor
    ancestors: Tensor

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


@dataclass
class Candidates:
    """Draft candidates accumulated level by level (level d holds the children proposed for depth d).

    Each level adds [B,M] tensors: token, parent (candidate index, -1 = root), cumulative log-score.
    """

    tokens: list[Tensor] = field(default_factory=list)
    parents: list[Tensor] = field(default_factory=list)
    scores: list[Tensor] = field(default_factory=list)
    depths: list[Tensor] = field(default_factory=list)
    count: int = 0

    def add_level(self, tokens: Tensor, parents: Tensor, scores: Tensor, depth: int) -> Tensor:
        """Append one level; returns the candidate indices given to it.  # [B,M] x3 -> [M] long"""
        m = tokens.shape[1]
        self.tokens.append(tokens)
        self.parents.append(parents)
        self.scores.append(scores)
        self.depths.append(torch.full_like(tokens, depth))
        ids = torch.arange(self.count, self.count + m, device=tokens.device)
        self.count += m
        return ids


def gumbel_topk(
    logits: Tensor, sampling: SamplingBatch, positions: Tensor, k: int, noise: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The drafter's k distinct candidates for the token at `positions`, chosen with the policy's own noise.

    Candidates are the top-k of the perturbed draft logits (Gumbel-top-k; plain top-k for greedy rows), so the
    first candidate is exactly what the policy would sample if its logits equalled the drafter's. The score of a
    candidate is its log-softmax under those perturbed logits: the drafter's confidence that the policy's sample
    is this token, given the noise it will use. `noise`: the rows' sampler noise if computed beforehand.
    # [M,V], batch of M, [M] -> tokens [M,k], log-scores [M,k]
    """
    perturbed = perturbed_logits(logits, sampling, positions, noise)
    top = torch.topk(perturbed, k, dim=-1)
    scores = torch.log_softmax(perturbed, dim=-1).gather(1, top.indices)
    return top.indices, torch.nan_to_num(scores, nan=MIN_LOG_SCORE).clamp(min=MIN_LOG_SCORE)


def ancestor_matrix(parents: Tensor, max_depth: int) -> Tensor:
    """ancestors[b,i,j] = j is i or an ancestor of i.  # parents [B,N] (-1 root) -> [B,N,N] bool"""
    b, n = parents.shape
    up = parents.clamp(min=0)
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(b, n, n)
    anc = eye.clone()
    cur = up
    for _ in range(max_depth):
        anc |= torch.nn.functional.one_hot(cur, n).bool()
        cur = up.gather(1, cur)
    return anc


def finalize_tree(root_tokens: Tensor, cands: Candidates, num_nodes: int, max_depth: int) -> DraftTree:
    """Keep the best `num_nodes - 1` candidates by cumulative score (plus the root), in topological order.

    The kept set is ancestor-closed: a child's cumulative score never exceeds its parent's (log-scores are <= 0),
    and among equal scores a stable sort keeps candidate order, which is topological, so a parent always ranks
    before its children. Equal scores are common: a top-k or top-p filter that leaves one token gives it
    log-score exactly 0, so the child ties its parent.
    # root_tokens [B], candidates C per row -> DraftTree with N = num_nodes
    """
    tokens = torch.cat(cands.tokens, dim=1)
    parents = torch.cat(cands.parents, dim=1)
    depths = torch.cat(cands.depths, dim=1)
    scores = torch.cat(cands.scores, dim=1)
    b, c = tokens.shape
    keep = num_nodes - 1
    if keep > c:
        raise ValueError(f"tree of {num_nodes} nodes asked from only {c} candidates")
    ranked = torch.sort(scores, dim=1, descending=True, stable=True).indices
    chosen = ranked[:, :keep].sort(dim=1).values  # candidate order is topological
    new_index = torch.full((b, c), -1, dtype=torch.long, device=tokens.device)
    new_index.scatter_(1, chosen, torch.arange(1, keep + 1, device=tokens.device).expand(b, keep))
    cand_parent = parents.gather(1, chosen)
    node_parent = torch.where(cand_parent < 0, 0, new_index.gather(1, cand_parent.clamp(min=0)))
    root_parent = torch.full((b, 1), -1, dtype=torch.long, device=tokens.device)
    node_parents = torch.cat([root_parent, node_parent], dim=1)
    node_tokens = torch.cat([root_tokens.unsqueeze(1), tokens.gather(1, chosen)], dim=1)
    node_depths = torch.cat([torch.zeros_like(root_parent), depths.gather(1, chosen)], dim=1)
    return DraftTree(node_tokens, node_parents, node_depths, ancestor_matrix(node_parents, max_depth))


def merge_trees(first: DraftTree, second: DraftTree) -> DraftTree:
    """The union of two trees sharing their root (node 0): `second`'s other nodes follow all of `first`'s, so the
    order stays topological and, where both propose a path, `verify_tree` keeps `first`'s (it takes the
    lowest-index node among the deepest accepted). # [B,N] + [B,M] -> DraftTree with N + M - 1 nodes"""
    b, n = first.tokens.shape
    m = second.num_nodes
    tail_parents = second.parents[:, 1:]
    parents = torch.cat([first.parents, torch.where(tail_parents == 0, 0, tail_parents + n - 1)], dim=1)
    total = n + m - 1
    ancestors = torch.zeros(b, total, total, dtype=torch.bool, device=first.tokens.device)
    ancestors[:, :n, :n] = first.ancestors
    ancestors[:, n:, n:] = second.ancestors[:, 1:, 1:]
    ancestors[:, n:, 0] = second.ancestors[:, 1:, 0]
    return DraftTree(
        tokens=torch.cat([first.tokens, second.tokens[:, 1:]], dim=1),
        parents=parents,
        depths=torch.cat([first.depths, second.depths[:, 1:]], dim=1),
        ancestors=ancestors,
    )

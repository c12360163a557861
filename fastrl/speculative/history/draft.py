"""A history draft as a value, and the pure function that ranks weighted continuations into one.

A draft is a tree in parent-pointer form: node 0 is the root (the sequence's last token, not yet seen by the
policy), every other node's parent precedes it, and the nodes are numbered breadth-first with the children of a
node ranked by weight (heaviest first). It holds no tensors: the batched ``DraftTree`` is built from a list of
drafts by ``history_draft_tree``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HistoryDraft:
    """One sequence's draft tree.

    tokens:  node tokens, ``tokens[0]`` the root
    parents: parent node index of each node, ``-1`` for the root, ``parents[i] < i`` otherwise
    weights: summed weight of the source continuations through each node (the root's is the total), so a
             child never outweighs its parent
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    weights: tuple[float, ...]

    @property
    def num_nodes(self) -> int:
        """Nodes including the root."""
        return len(self.tokens)

    @property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node (root 0)."""
        depths = [0] * len(self.parents)
        for i in range(1, len(self.parents)):
            depths[i] = depths[self.parents[i]] + 1
        return tuple(depths)

    @property
    def max_depth(self) -> int:
        """Depth of the deepest node (0 for a root-only draft)."""
        return max(self.depths)


def rank_continuations(
    root: int, continuations: Sequence[tuple[Sequence[int], float]], max_nodes: int, chain: bool = False
) -> HistoryDraft:
    """The ``max_nodes``-node draft (root included) that keeps the heaviest prefixes of the continuations.

    ``continuations`` are (tokens after the root, weight) pairs, in a deterministic order; their tokens form a
    trie whose node weight is the summed weight of the continuations through it. A tree keeps the
    ``max_nodes - 1`` heaviest trie nodes (ties: the node created first), which is ancestor-closed because a
    child never outweighs its parent and is created after it. A chain follows the heaviest child from the root.
    The trie is expanded lazily, best node first, so only kept nodes pay for splitting their continuations.
    The draft is shorter than ``max_nodes`` when the trie is smaller; its depth is the longest continuation's.
    """
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    merged: dict[tuple[int, ...], float] = {}  # identical continuations (siblings agree often) count once
    for continuation, weight in continuations:
        key = tuple(continuation)
        merged[key] = merged.get(key, 0.0) + weight
    texts = list(merged)
    tokens = [root]
    parents = [-1]
    weights = [sum(merged.values())]
    members: list[list[int]] = [list(range(len(texts)))]  # continuations through each node

    def expand(node: int, depth: int) -> list[int]:
        """Create the children of ``node`` (at ``depth``) from its continuations; returns their indices."""
        buckets: dict[int, list[int]] = {}
        for i in members[node]:
            if len(texts[i]) > depth:
                buckets.setdefault(texts[i][depth], []).append(i)
        created = []
        for token, through in buckets.items():
            created.append(len(tokens))
            tokens.append(token)
            parents.append(node)
            weights.append(sum(merged[texts[i]] for i in through))
            members.append(through)
        return created

    keep = max_nodes - 1
    kept: list[int] = []
    depth_of = {0: 0}
    if chain:
        node = 0
        while len(kept) < keep:
            created = expand(node, depth_of[node])
            if not created:
                break
            node = min(created, key=lambda c: (-weights[c], c))
            depth_of[node] = depth_of[parents[node]] + 1
            kept.append(node)
    else:
        frontier = [(-weights[c], c) for c in expand(0, 0)]
        heapq.heapify(frontier)
        while len(kept) < keep and frontier:
            _, node = heapq.heappop(frontier)
            kept.append(node)
            depth_of[node] = depth_of[parents[node]] + 1
            if len(kept) < keep:
                for c in expand(node, depth_of[node]):
                    heapq.heappush(frontier, (-weights[c], c))
    return _breadth_first(tokens, parents, weights, kept)


def _breadth_first(tokens: list[int], parents: list[int], weights: list[float], kept: list[int]) -> HistoryDraft:
    """Renumber the kept trie nodes (plus the root) breadth-first, children heaviest first."""
    kids: dict[int, list[int]] = {}
    for node in sorted(kept):
        kids.setdefault(parents[node], []).append(node)
    order = [0]
    new_index = {0: 0}
    out_parents = [-1]
    head = 0
    while head < len(order):
        node = order[head]
        head += 1
        for child in sorted(kids.get(node, ()), key=lambda c: (-weights[c], c)):
            new_index[child] = len(order)
            order.append(child)
            out_parents.append(new_index[node])
    return HistoryDraft(
        tokens=tuple(tokens[n] for n in order),
        parents=tuple(out_parents),
        weights=tuple(weights[n] for n in order),
    )

"""History drafts as one batched ``DraftTree`` of a fixed node count, padded so that pads never decide a path.

Padding rule: a draft with fewer than N nodes is completed with clones of its node 1 (a child of the root):
same parent (the root), same token, no children, placed after every real node. ``verify_tree`` accepts a node
iff its token equals the policy's target at its parent, so a clone is accepted exactly when node 1 is, at the
same depth 1; the accepted path ends at the first (lowest-index) deepest accepted node (``argmax`` returns the
first maximum), which is node 1 or a real node deeper than it, never a clone. Even a verifier with another
tie-break would emit the same tokens through a clone: it has node 1's token, parent and ancestors, hence the same
target and the same KV. A root-only draft first gets node 1 = the root's token again (a real guess: "the last
token repeats"), since a clone needs something to copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastrl.speculative.draft_tree import DraftTree, ancestor_matrix
from fastrl.speculative.history.draft import HistoryDraft


def pad_draft(draft: HistoryDraft, num_nodes: int) -> HistoryDraft:
    """``draft`` completed to exactly ``num_nodes`` nodes by the padding rule (unchanged if already that size)."""
    if draft.num_nodes > num_nodes:
        raise ValueError(f"draft of {draft.num_nodes} nodes does not fit a tree of {num_nodes} nodes")
    if draft.num_nodes == num_nodes:
        return draft
    tokens, parents, weights = list(draft.tokens), list(draft.parents), list(draft.weights)
    if len(tokens) == 1:
        tokens.append(tokens[0])
        parents.append(0)
        weights.append(0.0)
    pad = num_nodes - len(tokens)
    return HistoryDraft(
        tokens=tuple(tokens + [tokens[1]] * pad),
        parents=tuple(parents + [0] * pad),
        weights=tuple(weights + [0.0] * pad),
    )


def history_draft_tree(
    drafts: Sequence[HistoryDraft], num_nodes: int, max_depth: int, device: torch.device | str | None = None
) -> DraftTree:
    """Stack drafts into a ``DraftTree`` of ``num_nodes`` nodes per row (padding rule above).

    Every draft must have at most ``num_nodes`` nodes and depth at most ``max_depth``; ``num_nodes >= 2``.
    # B drafts -> DraftTree: tokens, parents, depths [B,N] long, ancestors [B,N,N] bool
    """
    if num_nodes < 2:
        raise ValueError(f"a history draft tree needs num_nodes >= 2 (root plus one node), got {num_nodes}")
    if not drafts:
        raise ValueError("history_draft_tree needs at least one draft")
    tokens: list[tuple[int, ...]] = []
    parents: list[tuple[int, ...]] = []
    depths: list[tuple[int, ...]] = []
    deepest = 1
    for draft in drafts:
        padded = pad_draft(draft, num_nodes)
        row_depths = padded.depths
        if max(row_depths) > max_depth:
            raise ValueError(f"draft of depth {max(row_depths)} exceeds max_depth={max_depth}")
        deepest = max(deepest, max(row_depths))
        tokens.append(padded.tokens)
        parents.append(padded.parents)
        depths.append(row_depths)
    parent_tensor = torch.tensor(parents, dtype=torch.long, device=device)
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device),
        parents=parent_tensor,
        depths=torch.tensor(depths, dtype=torch.long, device=device),
        # walked up as deep as the drafts reach, not max_depth: a wide, shallow tree (suffix_512 drafts are a few
        # tokens deep) then costs a few [B,N,N] steps, not N
        ancestors=ancestor_matrix(parent_tensor, deepest),
    )

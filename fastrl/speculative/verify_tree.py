"""Exact tree verification: a draft node is accepted iff its token is what the policy samples at its parent.

The policy's target at node i is the token it samples at position (root position + depth_i + 1) from its logits
at node i, with the request's own seed (the sampling contract), so greedy and sampling follow one rule and the
emitted tokens equal plain decoding's. The accepted nodes whose ancestors are all accepted form paths from the
root that agree token for token (children sharing a token, as history drafts' padding clones and merged trees
have, are accepted together); the emitted tokens are the targets along the path to the first (lowest-index)
deepest such node: accepted drafts, then one policy token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.speculative.draft_tree import DraftTree


@dataclass
class Acceptance:
    """Per row: accepted draft tokens, and the accepted path's node indices by depth.

    accepted: [B] long, number of accepted draft tokens (emitted tokens = accepted + 1)
    path:       [B,D+1] long, path[b,d] = node at depth d on the accepted path for d <= accepted[b]; entries
                beyond repeat the deepest accepted node
    """

    accepted: Tensor
    path: Tensor


def verify_tree(tree: DraftTree, targets: Tensor, max_depth: int) -> Acceptance:
    """Longest agreeing path of each tree.  # tree with N nodes, targets [B,N] -> Acceptance"""
    parent = tree.parents.clamp(min=0)
    match = tree.tokens == targets.gather(1, parent)
    match[:, 0].fill_(True)  # the root; fill_, not `= True`: no host scalar in a CUDA graph
    accepted = ~(tree.ancestors & ~match.unsqueeze(1)).any(dim=-1)  # every node on the way matches
    deepest = torch.where(accepted, tree.depths, -1).argmax(dim=1)
    accepted = tree.depths.gather(1, deepest.unsqueeze(1)).squeeze(1)
    on_path = tree.ancestors.gather(1, deepest.view(-1, 1, 1).expand(-1, 1, tree.num_nodes)).squeeze(1)
    levels = torch.arange(max_depth + 1, device=targets.device)
    at_level = on_path.unsqueeze(1) & (tree.depths.unsqueeze(1) == levels.view(1, -1, 1))  # [B,D+1,N]
    path = torch.where(at_level.any(-1), at_level.float().argmax(-1), -1)
    path = torch.where(path < 0, deepest.unsqueeze(1), path)
    return Acceptance(accepted=accepted, path=path)

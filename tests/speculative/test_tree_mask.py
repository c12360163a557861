"""The verify forward's attention mask: each row's prefix, then its tree nodes at entries n + j by ancestry."""

from __future__ import annotations

import torch

from fastrl.speculative.draft_tree import ancestor_matrix
from fastrl.speculative.round import tree_attention_mask


def test_tree_mask_opens_the_prefix_and_the_ancestors_at_each_rows_own_entries():
    parents = torch.tensor([[-1, 0, 0, 1, 3], [-1, 0, 1, 2, 0]])
    ancestors = ancestor_matrix(parents, 4)
    lengths = torch.tensor([3, 7])
    nodes, kv_len = parents.shape[1], 7 + parents.shape[1] + 2
    mask = tree_attention_mask(ancestors, lengths, kv_len)
    assert mask.shape == (2, nodes, kv_len)
    for b, n in enumerate(lengths.tolist()):
        assert mask[b, :, :n].all()
        assert torch.equal(mask[b, :, n : n + nodes], ancestors[b])
        assert not mask[b, :, n + nodes :].any()  # stale entries past the tree

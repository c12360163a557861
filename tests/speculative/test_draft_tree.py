"""Draft trees and tree verification as pure functions."""

from __future__ import annotations

import torch

from fastrl.sampling.params import SamplingParams
from fastrl.sampling.sampler import SamplingBatch, sample
from fastrl.speculative.draft_tree import Candidates, DraftTree, ancestor_matrix, finalize_tree, gumbel_topk
from fastrl.speculative.verify_tree import verify_tree


def _tree(parents: list[int], tokens: list[int]) -> DraftTree:
    p = torch.tensor([parents])
    depth = [0]
    for i in range(1, len(parents)):
        depth.append(depth[parents[i]] + 1)
    return DraftTree(torch.tensor([tokens]), p, torch.tensor([depth]), ancestor_matrix(p, max(depth)))


def test_ancestor_matrix():
    tree = _tree([-1, 0, 0, 1, 3], [9, 1, 2, 3, 4])
    anc = tree.ancestors[0].int().tolist()
    assert anc[4] == [1, 1, 0, 1, 1]
    assert anc[2] == [1, 0, 1, 0, 0]
    assert anc[0] == [1, 0, 0, 0, 0]


def test_verify_accepts_longest_agreeing_path():
    #        0(root)
    #      1(a=5)   2(a=6)
    #      3(7)     4(8)
    #      5(9)
    tree = _tree([-1, 0, 0, 1, 2, 3], [0, 5, 6, 7, 8, 9])
    # Policy samples: after root 6, after node 2 -> 8, after node 4 -> 11
    targets = torch.tensor([[6, 0, 8, 0, 11, 0]])
    acc = verify_tree(tree, targets, max_depth=3)
    assert acc.accepted.tolist() == [2]
    assert acc.path[0, :3].tolist() == [0, 2, 4]
    # emitted = targets along the path: 6, 8, then the policy's own 11
    assert targets.gather(1, acc.path)[0, :3].tolist() == [6, 8, 11]


def test_verify_rejects_at_root():
    tree = _tree([-1, 0, 1], [0, 5, 6])
    acc = verify_tree(tree, torch.tensor([[4, 6, 1]]), max_depth=2)
    assert acc.accepted.tolist() == [0]
    assert acc.path[0].tolist() == [0, 0, 0]


def test_verify_batched_rows_independent():
    a = _tree([-1, 0, 1, 2], [0, 1, 2, 3])
    both = DraftTree(
        torch.cat([a.tokens, a.tokens]),
        torch.cat([a.parents, a.parents]),
        torch.cat([a.depths, a.depths]),
        torch.cat([a.ancestors, a.ancestors]),
    )
    targets = torch.tensor([[1, 2, 3, 4], [1, 9, 3, 4]])
    acc = verify_tree(both, targets, max_depth=3)
    assert acc.accepted.tolist() == [3, 1]


def test_finalize_keeps_best_ancestor_closed_in_topological_order():
    torch.manual_seed(0)
    b, k = 3, 3
    cands = Candidates()
    s1 = torch.log_softmax(torch.randn(b, k), -1)
    ids1 = cands.add_level(torch.randint(0, 50, (b, k)), torch.full((b, k), -1), s1, 1)
    parents2 = ids1.expand(b, k).repeat_interleave(k, dim=1)
    s2 = s1.repeat_interleave(k, dim=1) + torch.log_softmax(torch.randn(b, k * k), -1)
    cands.add_level(torch.randint(0, 50, (b, k * k)), parents2, s2, 2)
    tree = finalize_tree(torch.tensor([7, 8, 9]), cands, num_nodes=6, max_depth=2)
    assert tree.tokens.shape == (b, 6)
    assert tree.tokens[:, 0].tolist() == [7, 8, 9]
    for row in range(b):
        for i in range(1, 6):
            parent = int(tree.parents[row, i])
            assert 0 <= parent < i
            assert tree.depths[row, i] == tree.depths[row, parent] + 1
        # the kept nodes are the best 5 by score
        all_scores = torch.cat([s1[row], s2[row]])
        kept = sorted(all_scores.topk(5).values.tolist())
        assert len(kept) == 5


def test_gumbel_topk_first_candidate_is_the_policy_sample():
    torch.manual_seed(1)
    logits = torch.randn(64, 30)
    params = [
        SamplingParams(temperature=t, top_k=k, top_p=p)
        for t, k, p in [(1.0, 0, 1.0), (0.7, 0, 0.9), (0.0, 0, 1.0), (1.0, 5, 1.0)]
    ]
    batch = SamplingBatch.from_params([params[i % 4] for i in range(64)], list(range(64)))
    positions = torch.arange(64) + 10
    tokens, scores = gumbel_topk(logits, batch, positions, 4)
    assert torch.equal(tokens[:, 0], sample(logits, batch, positions).tokens)
    assert (tokens.unsqueeze(-1) != tokens.unsqueeze(-2)).sum() == 64 * 4 * 3  # distinct children
    assert torch.all(scores[:, :-1] >= scores[:, 1:])

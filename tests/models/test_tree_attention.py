"""Tree-style forward (tokens at arbitrary cache indices, custom mask) and path compaction with KVCache.move."""

from __future__ import annotations

import pytest
import torch

from fastrl.models import KVCache, load_model

TOL = 1e-4
P = 6  # prefix length
# Two branches after the prefix: a = (a0, a1), b = (b0, b1, b2); tree order [a0, a1, b0, b1, b2].
TREE_DEPTH = torch.tensor([0, 1, 0, 1, 2])
TREE_PARENTS = torch.tensor(
    [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ],
    dtype=torch.bool,
)  # [i, j]: tree token j is i itself or an ancestor of i


def hf_hidden(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf.model(ids).last_hidden_state


@pytest.fixture(params=["llama_gqa", "qwen3"])
def setup(request, hf_checkpoint):
    hf, path = hf_checkpoint(request.param)
    torch.manual_seed(1)
    prefix = torch.randint(0, 97, (2, P))
    tree = torch.randint(0, 97, (2, 5))
    return hf, load_model(path), prefix, tree


def test_tree_forward_through_cache_equals_linear_branches(setup):
    hf, model, prefix, tree = setup
    c = model.config
    cache = KVCache(c.num_hidden_layers, 4, 24, c.num_key_value_heads, c.head_dim)
    slots = torch.tensor([3, 1])
    positions = (P + TREE_DEPTH).expand(2, 5)
    cache_index = (P + torch.arange(5)).expand(2, 5)
    mask = torch.cat([torch.ones(5, P, dtype=torch.bool), TREE_PARENTS], 1).expand(2, 5, P + 5)
    with torch.no_grad():
        model(prefix, torch.arange(P).expand(2, P), cache, slots)
        out = model(tree, positions, cache, slots, cache_index=cache_index, attn_mask=mask)
    want_a = hf_hidden(hf, torch.cat([prefix, tree[:, :2]], 1))[:, P:]
    want_b = hf_hidden(hf, torch.cat([prefix, tree[:, 2:]], 1))[:, P:]
    assert (out.hidden[:, :2] - want_a).abs().max() <= TOL
    assert (out.hidden[:, 2:] - want_b).abs().max() <= TOL

    # Accept branch b: compact cache entries P+2..P+4 onto P..P+2 (overlapping, dst <= src), then decode on.
    src = (P + torch.arange(2, 5)).expand(2, 3)
    cache.move(slots, src, src - 2)
    nxt = torch.randint(0, 97, (2, 1))
    with torch.no_grad():
        step = model(nxt, torch.full((2, 1), P + 3), cache, slots)
        want = hf(torch.cat([prefix, tree[:, 2:], nxt], 1)).logits[:, -1:]
    assert (step.logits - want).abs().max() <= TOL


def test_tree_forward_without_cache_equals_linear_branches(setup):
    hf, model, prefix, tree = setup
    ids = torch.cat([prefix, tree], 1)
    positions = torch.cat([torch.arange(P), P + TREE_DEPTH]).expand(2, P + 5)
    mask = torch.zeros(P + 5, P + 5, dtype=torch.bool)
    mask[:P, :P] = torch.ones(P, P, dtype=torch.bool).tril()
    mask[P:, :P] = True
    mask[P:, P:] = TREE_PARENTS
    with torch.no_grad():
        out = model(ids, positions, attn_mask=mask.expand(2, P + 5, P + 5))
    want_a = hf_hidden(hf, torch.cat([prefix, tree[:, :2]], 1))
    want_b = hf_hidden(hf, torch.cat([prefix, tree[:, 2:]], 1))
    assert (out.hidden[:, :P] - want_a[:, :P]).abs().max() <= TOL
    assert (out.hidden[:, P : P + 2] - want_a[:, P:]).abs().max() <= TOL
    assert (out.hidden[:, P + 2 :] - want_b[:, P:]).abs().max() <= TOL

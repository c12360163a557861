"""Prefill in groups of similar prompt lengths: the plan covers every row once and never costs more than one
forward; the grouped prefill gives what one padded forward gives."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.engine.prefill import _forward, prefill
from fastrl.engine.prefill_groups import LEVEL_RATIO, length_groups
from fastrl.models.checkpoint import load_model
from fastrl.models.kv_cache import KVCache
from tests.helpers import make_hf_model


def test_the_groups_cover_every_row_once_each_within_the_ladder_ratio():
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(1, rng.choice([1, 5, 60, 2000])) for _ in range(rng.randint(1, 300))]
        groups = length_groups(lengths)
        assert sorted(r for g in groups for r in g) == list(range(len(lengths)))
        assert all(g == sorted(g) for g in groups)
        spans = [(min(lengths[r] for r in g), max(lengths[r] for r in g)) for g in groups]
        assert all(hi < LEVEL_RATIO * lo for lo, hi in spans)  # padding under a quarter of a prompt
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))  # shortest first, no overlap
    assert length_groups([]) == []
    assert length_groups([37] * 64) == [list(range(64))]
    assert length_groups([10, 500, 11]) == [[0, 2], [1]]


def test_a_prompts_width_depends_on_the_lengths_present_not_on_how_many():
    """What prefix sharing needs: a GRPO group's prompt prefilled once or once per sibling gets the same width."""
    rng = random.Random(1)
    for _ in range(100):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 40))]
        repeated = [n for n in lengths for _ in range(rng.randint(1, 4))]

        def widths(ls):
            return {ls[r]: max(ls[i] for i in g) for g in length_groups(ls) for r in g}

        assert widths(lengths) == widths(repeated)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", seed=3).save_pretrained(path)
    return load_model(path, dtype=torch.float64)


def test_a_grouped_prefill_gives_what_one_padded_forward_gives(model):
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 90) for _ in range(n)] for n in [3, 90, 5, 4, 88, 40, 6, 91]]
    assert len(length_groups([len(p) for p in prompts])) > 1
    c = model.config
    caches = [KVCache(c.num_hidden_layers, 8, 128, c.num_key_value_heads, c.head_dim, torch.float64) for _ in "ab"]
    with torch.no_grad():
        grouped = prefill(model, caches[0], prompts, list(range(8)))
        features, logits = _forward(model, caches[1], prompts, list(range(8)), 0, ())
    assert grouped.features.shape == features.shape
    for row, prompt in enumerate(prompts):
        n = len(prompt)
        assert torch.allclose(grouped.features[row, :n], features[row, :n], rtol=0, atol=1e-12)
        keys = [cache.read(0, torch.tensor([row]), n)[0] for cache in caches]
        assert torch.allclose(keys[0], keys[1], rtol=0, atol=1e-12)
    assert torch.allclose(grouped.last_logits, logits, rtol=0, atol=1e-10)
    assert torch.equal(grouped.lengths, torch.tensor([len(p) for p in prompts]))

"""FeatureBuffer: bounded by tokens, oldest policy versions evicted first, recency-biased sampling."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.cotrain.buffer import FeatureBuffer
from fastrl.cotrain.feature_sequence import FeatureSequence


def seq(n: int, version: int, tag: int = 0) -> FeatureSequence:
    """A sequence of n entries whose tokens all equal `tag` (to tell sequences apart)."""
    return FeatureSequence(torch.full((n,), tag, dtype=torch.long), torch.randn(n, 4), 3, version)


def tags(seqs: list[FeatureSequence]) -> list[int]:
    return [int(s.tokens[0]) for s in seqs]


def test_capacity_evicts_oldest_version_then_oldest_sequence():
    buf = FeatureBuffer(capacity_tokens=30)
    buf.extend([seq(10, 1, tag=1), seq(10, 0, tag=2), seq(10, 1, tag=3)])
    assert buf.num_tokens == 30 and buf.versions == [0, 1]
    buf.add(seq(10, 1, tag=4))  # over capacity: version 0 goes first
    assert buf.versions == [1] and buf.num_tokens == 30
    buf.add(seq(10, 2, tag=5))  # then the oldest sequence of version 1
    everything = buf.sample(1000, random.Random(0))
    assert sorted(tags(everything)) == [3, 4, 5]
    assert buf.num_sequences == 3


def test_retention_keeps_newest_versions_only():
    buf = FeatureBuffer(capacity_tokens=1000, retention_versions=2)
    for v in range(4):
        buf.add(seq(5, v, tag=v))
    assert buf.versions == [2, 3]
    buf.add(seq(5, 1, tag=9))  # older than the window: dropped
    assert buf.versions == [2, 3] and buf.num_tokens == 10


def test_short_sequences_are_dropped_and_long_ones_cut():
    buf = FeatureBuffer(capacity_tokens=8)
    buf.add(seq(1, 0))
    assert len(buf) == 0
    buf.add(seq(20, 0))
    assert buf.num_tokens == 8 and buf.sample(100, random.Random(0))[0].tokens.shape[0] == 8


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_sequence_with_a_non_finite_feature_is_refused_and_nothing_changes(bad):
    """Kept, one NaN fails every training step that samples it (each co-training slice's whole work discarded)."""
    rng = random.Random(7)
    buf = FeatureBuffer(capacity_tokens=1000)
    poisoned = seq(12, 0, tag=5)
    poisoned.features[rng.randrange(12), rng.randrange(4)] = bad
    buf.extend([seq(6, 0, tag=1), seq(6, 0, tag=2)])
    with pytest.raises(ValueError, match="NaN or an infinity"):
        buf.add(poisoned)
    assert buf.num_tokens == 12 and sorted(tags(buf.sequences())) == [1, 2]


def test_sample_respects_budget_and_favours_recent_versions():
    buf = FeatureBuffer(capacity_tokens=10_000, recency_decay=0.25)
    for _ in range(50):
        buf.add(seq(10, 0, tag=0))
        buf.add(seq(10, 1, tag=1))
    rng = random.Random(0)
    counts = [0, 0]
    for _ in range(200):
        batch = buf.sample(45, rng)
        assert 1 <= len(batch) <= 4 and sum(s.tokens.shape[0] for s in batch) <= 45
        for t in tags(batch):
            counts[t] += 1
    assert counts[1] > 2 * counts[0] > 0
    assert FeatureBuffer(100).sample(10, rng) == []
    assert len(buf.sample(5, rng)) == 1  # one sequence even when it exceeds the budget


def test_a_sampled_batch_is_bounded_padded_as_the_trainer_computes_it():
    """The trainer pads a batch to rows x its longest sequence: on long-tailed lengths a bound on the token sum let
    batches grow to 10-20x the budget in padded entries. Random buffers and budgets: rows x longest <= budget
    (a single sequence excepted), and nothing that would still fit is left out when the draw stops early."""
    for case in range(60):
        rng = random.Random(case)
        buf = FeatureBuffer(capacity_tokens=10**7, recency_decay=rng.choice([0.3, 1.0]))
        for _ in range(rng.randint(1, 60)):
            buf.add(seq(min(4000, int(2 * rng.paretovariate(0.8))) + 2, rng.randint(0, 3), tag=0))
        budget = rng.choice([16, 100, 1000, 8192])
        for _ in range(5):
            batch = buf.sample(budget, rng)
            padded = len(batch) * max(s.tokens.shape[0] for s in batch)
            assert len(batch) == 1 or padded <= budget, (case, budget, padded)


def test_versions_whose_weight_underflows_are_sampled_last_not_a_crash():
    """recency_decay ** age reaches 0.0 once versions lie far enough apart (0.1 ** 330); u ** (1 / 0.0) raised
    ZeroDivisionError, and every co-training slice failed from then on."""
    buf = FeatureBuffer(capacity_tokens=10_000, recency_decay=0.1)
    buf.add(seq(10, 0, tag=0))
    buf.add(seq(10, 400, tag=1))
    rng = random.Random(0)
    assert tags(buf.sample(10, rng)) == [1]
    assert sorted(tags(buf.sample(100, rng))) == [0, 1]  # still drawn when the budget reaches it


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"capacity_tokens": 1}, "capacity_tokens"),
        ({"capacity_tokens": 10, "retention_versions": -1}, "retention"),
        ({"capacity_tokens": 10, "recency_decay": 0.0}, "recency_decay"),
    ],
)
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        FeatureBuffer(**kwargs)


def test_collate_keeps_the_batch_dtype_exactly():
    """float64 features stay float64 through padding (no float32 round trip: the float64 loss checks rely on it)."""
    from fastrl.cotrain.feature_sequence import FeatureBatch

    seqs = [FeatureSequence(torch.arange(n), torch.randn(n, 6, dtype=torch.float64), 2) for n in (3, 5)]
    batch = FeatureBatch.collate(seqs, dtype=torch.float64, target_size=4)
    assert batch.features.dtype == torch.float64 and batch.targets.dtype == torch.float64
    for row, s in enumerate(seqs):
        n = s.tokens.shape[0]
        assert torch.equal(batch.features[row, :n], s.features)
        assert torch.equal(batch.targets[row, : n - 1], s.features[1:, 2:])


def test_collate_refuses_no_sequences_and_mixed_widths():
    from fastrl.cotrain.feature_sequence import FeatureBatch

    with pytest.raises(ValueError, match=r"FeatureBatch.collate: no sequences"):
        FeatureBatch.collate([], target_size=4)
    mixed = [FeatureSequence(torch.arange(3), torch.randn(3, w), 1) for w in (4, 8)]
    with pytest.raises(ValueError, match=r"features are of widths \[4, 8\]"):
        FeatureBatch.collate(mixed, target_size=4)


def test_long_sequences_get_their_share_of_the_sampled_tokens():
    """Bounding the padded batch must not starve the long tail: a draw over all lengths that skipped what would
    widen the batch took long sequences in 0.19 of the tokens where the buffer holds 0.65 (fair: the first
    sequence drawn by tokens, the rest from its length class, here 0.57: two 1500-token sequences fill 3000 of
    4096). 160 x 200 and 40 x 1500 tokens, one version."""
    buf = FeatureBuffer(capacity_tokens=10**7)
    for n in [200] * 160 + [1500] * 40:
        buf.add(seq(n, 0, tag=n))
    rng = random.Random(0)
    tokens = {200: 0, 1500: 0}
    for _ in range(1000):
        batch = buf.sample(4096, rng)
        assert len(batch) * max(s.tokens.shape[0] for s in batch) <= 4096
        for s in batch:
            tokens[s.tokens.shape[0]] += s.tokens.shape[0]
    assert 0.5 < tokens[1500] / sum(tokens.values()) < 0.75

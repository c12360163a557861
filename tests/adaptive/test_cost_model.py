"""Cost model (fitted and parametric) and acceptance model of the workload simulator."""

import numpy as np
import pytest

from fastrl.adaptive.acceptance import AcceptanceProfile, level_widths
from fastrl.adaptive.cost_model import CostModel, CostParams
from fastrl.adaptive.workload import Phase, Workload
from fastrl.strategy.strategy import DISABLE, Strategy

TREE, CHAIN = Strategy(8, 4, 32), Strategy(3, 1, 4)


def test_fit_interpolates_in_batch_size():
    measurements = [(TREE, 1, 0.010), (TREE, 8, 0.012), (TREE, 8, 0.014), (TREE, 8, 0.100), (TREE, 32, 0.040)]
    measurements += [(DISABLE, 4, 0.005)]
    model = CostModel.fit(measurements)
    assert model.measured_strategies == [DISABLE, TREE]
    assert model.round_time(TREE, 8) == pytest.approx(0.014)  # median of the repeats
    assert model.round_time(TREE, 1) == pytest.approx(0.010)
    assert model.round_time(TREE, 4) == pytest.approx(0.010 + (0.014 - 0.010) * 3 / 7)
    assert model.round_time(TREE, 20) == pytest.approx(0.014 + (0.040 - 0.014) * 12 / 24)
    assert model.round_time(TREE, 64) == pytest.approx(0.040 + (0.040 - 0.014) / 24 * 32)  # extrapolated
    assert model.round_time(DISABLE, 1) == model.round_time(DISABLE, 100) == pytest.approx(0.005)
    with pytest.raises(ValueError, match="'3_1_4'"):
        model.round_time(CHAIN, 4)
    fallback = CostModel.fit(measurements, fallback=CostParams())
    assert fallback.round_time(CHAIN, 4) == CostModel.default_gpu().round_time(CHAIN, 4)
    with pytest.raises(ValueError, match="at least one"):
        CostModel.fit([])
    for seconds in (0.0, float("inf"), float("nan")):  # an infinite round time made every prediction inf or 0/0
        with pytest.raises(ValueError, match="seconds a finite number > 0"):
            CostModel.fit([(TREE, 1, seconds)])


def test_parametric_default_shape():
    model = CostModel.default_gpu()
    p = model.params
    plain = [model.round_time(DISABLE, b) for b in (1, 8, 64, 128, 256)]
    assert plain[:4] == [p.forward_s] * 4  # memory-bound: flat up to saturation
    assert plain[4] == pytest.approx(2 * p.forward_s)
    # verify grows with batch_size * num_draft_tokens beyond saturation
    assert model.breakdown(TREE, 4).verify_s == p.forward_s  # 128 tokens
    assert model.breakdown(TREE, 16).verify_s == pytest.approx(4 * p.forward_s)
    # draft cost ~ steps * per-step cost
    assert model.breakdown(TREE, 1).draft_s == pytest.approx(8 * p.draft_step_s)
    assert model.breakdown(CHAIN, 1).draft_s == pytest.approx(3 * p.draft_step_s)
    assert model.breakdown(DISABLE, 1).draft_s == 0.0
    assert model.round_time(TREE, 1) == pytest.approx(p.forward_s + 8 * p.draft_step_s + p.spec_overhead_s)
    with pytest.raises(ValueError, match="forward_s"):
        CostParams(forward_s=0.0)


def test_acceptance_grows_with_tree_size_and_drafter_quality():
    weak, strong = AcceptanceProfile(0.5), AcceptanceProfile(0.8)
    for profile in (weak, strong):
        values = [profile.expected_accepted(Strategy.parse(s)) for s in ("1_1_2", "3_1_4", "8_4_8", "8_4_16", "8_4_32")]
        assert values == sorted(values) and values[0] > 0
        assert profile.expected_accepted(DISABLE) == 0.0
    assert strong.expected_accepted(TREE) > weak.expected_accepted(TREE) + 1
    assert sum(level_widths(Strategy(8, 4, 16), strong)) == 15
    assert all(w <= 4 for w in level_widths(TREE, strong))


def test_sampled_acceptance_matches_expectation_and_is_capped():
    rng = np.random.default_rng(0)
    profile = AcceptanceProfile(0.7)
    hits = profile.sample_request_hits(rng, 20000)
    assert abs(hits.mean() - 0.7) < 0.005 and hits.std() == pytest.approx(0.05, rel=0.05)
    for strategy in (CHAIN, TREE, Strategy(8, 4, 8)):
        accepted = profile.sample_accepted(strategy, hits, rng)
        assert accepted.min() >= 0 and accepted.max() <= min(strategy.steps, strategy.num_draft_tokens - 1)
        assert accepted.mean() == pytest.approx(profile.expected_accepted(strategy), rel=0.03)
    assert profile.sample_accepted(DISABLE, hits[:5], rng).tolist() == [0] * 5


def test_workload_validation_and_lengths():
    phases = (Phase(0, AcceptanceProfile()), Phase(3, AcceptanceProfile(0.9)))
    workload = Workload("w", phases, num_rollouts=5, requests_per_rollout=256)
    assert [workload.phase_index(r) for r in range(5)] == [0, 0, 0, 1, 1]
    lengths = workload.sample_lengths(np.random.default_rng(0))
    assert lengths.shape == (256,) and lengths.min() >= 16 and lengths.max() <= 8192
    assert lengths.max() > 4 * np.median(lengths)  # heavy tail: the batch decays to a long tail of 1
    with pytest.raises(ValueError, match="first must start at rollout 0"):
        Workload("bad", (Phase(1, AcceptanceProfile()),))
    with pytest.raises(ValueError, match="strictly increasing"):
        Workload("bad", (Phase(0, AcceptanceProfile()), Phase(0, AcceptanceProfile())))
    with pytest.raises(ValueError, match="top1_hit"):
        AcceptanceProfile(1.5)

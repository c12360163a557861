"""The chi-square goodness-of-fit helper used by the statistical sampler tests."""

import pytest
import torch

from fastrl.sampling.goodness_of_fit import chi_square_sf, chi_square_test


def test_survival_function_known_values():
    # classic table values: the 95% quantiles of chi2(1), chi2(2), chi2(10)
    assert chi_square_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi_square_sf(5.991464547107979, 2) == pytest.approx(0.05, rel=1e-9)
    assert chi_square_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi_square_sf(0.0, 3) == pytest.approx(1.0)
    assert chi_square_sf(5.0, 0) == 1.0


def test_survival_function_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for x, dof in [(0.5, 1), (7.0, 3), (40.0, 25), (300.0, 255), (1.0, 60)]:
        assert chi_square_sf(x, dof) == pytest.approx(float(stats.chi2.sf(x, dof)), rel=1e-9, abs=1e-300)


def test_accepts_matching_and_rejects_wrong_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    assert chi_square_test(torch.tensor([500, 300, 200]), probs).p_value > 0.99
    assert chi_square_test(torch.tensor([600, 250, 150]), probs).p_value < 1e-6


def test_zero_probability_bins_are_counted_as_impossible():
    result = chi_square_test(torch.tensor([50, 0, 50, 3]), torch.tensor([0.5, 0.0, 0.5, 0.0]))
    assert result.impossible == 3
    assert result.dof == 1


def test_small_bins_are_pooled():
    probs = torch.tensor([0.9, 0.05, 0.03, 0.02])
    result = chi_square_test(torch.tensor([90, 5, 3, 2]), probs)  # expected 90, 5, 3, 2 -> pool 3 + 2
    assert result.dof == 2
    assert result.statistic == pytest.approx(0.0)


def test_too_few_samples_for_any_power_is_refused():
    """A sampler stuck on one token against a uniform target over 1,000 tokens with 2,000 samples: every bin expects
    fewer than 5, all were pooled into one, and the test passed it (statistic 0, dof 0, p = 1)."""
    probs = torch.full((1000,), 1e-3, dtype=torch.float64)
    stuck = torch.zeros(1000, dtype=torch.float64)
    stuck[0] = 2000
    with pytest.raises(ValueError, match="1000 possible categories but 2000 samples expect fewer than 5"):
        chi_square_test(stuck, probs)
    one_hot = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    assert chi_square_test(torch.tensor([0.0, 50.0, 0.0]), one_hot).p_value == 1.0  # one possible category: fine

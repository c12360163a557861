"""Pearson chi-square goodness-of-fit test, for checking samplers against their target distribution.

Self-contained (the survival function is torch's regularised upper incomplete gamma), so statistical tests need
no scipy. Not used on any decoding path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_EXPECTED = 5.0  # bins expected to hold fewer samples are pooled, as the chi-square approximation needs


@dataclass(frozen=True)
class ChiSquareResult:
    """Result of :func:`chi_square_test`.

    Attributes:
        statistic: Pearson's sum of (observed - expected)**2 / expected over the (pooled) bins.
        dof: degrees of freedom (pooled bins with positive probability, minus one).
        p_value: P(chi2(dof) >= statistic); 1.0 when dof == 0.
        impossible: number of samples that fell in bins of probability zero (must be 0 for a correct sampler).
    """

    statistic: float
    dof: int
    p_value: float
    impossible: int


def chi_square_sf(statistic: float, dof: int) -> float:
    """Survival function of the chi-square distribution: Q(dof / 2, statistic / 2)."""
    if dof <= 0:
        return 1.0
    a = torch.tensor(dof / 2.0, dtype=torch.float64)
    x = torch.tensor(max(statistic, 0.0) / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, x))


def chi_square_test(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = MIN_EXPECTED) -> ChiSquareResult:
    """Test observed ``counts`` against category probabilities ``probs``.

    Categories with probability 0 are left out of the statistic and their counts reported as ``impossible``.
    Categories expected to hold fewer than ``min_expected`` samples are pooled into one bin (merged into the
    smallest regular bin if the pool itself is still too small). ValueError when that leaves one bin of several
    possible categories (too few samples: no sampler could fail the test).
    """
    # [C] counts, [C] probs -> scalar result
    counts = counts.detach().to("cpu", torch.float64).reshape(-1)
    probs = probs.detach().to("cpu", torch.float64).reshape(-1)
    if counts.shape != probs.shape:
        raise ValueError(f"counts and probs must have equal length, got {counts.numel()} and {probs.numel()}")
    total = counts.sum()
    possible = probs > 0
    impossible = int(counts[~possible].sum())
    probs = probs[possible] / probs[possible].sum()
    counts = counts[possible]
    expected = probs * total

    order = torch.argsort(expected, descending=True)
    expected, counts = expected[order], counts[order]
    regular = expected >= min_expected
    obs_bins, exp_bins = list(counts[regular].tolist()), list(expected[regular].tolist())
    if (~regular).any():
        pooled_obs, pooled_exp = float(counts[~regular].sum()), float(expected[~regular].sum())
        if pooled_exp >= min_expected or not exp_bins:
            obs_bins.append(pooled_obs)
            exp_bins.append(pooled_exp)
        else:
            obs_bins[-1] += pooled_obs
            exp_bins[-1] += pooled_exp
    observed_t = torch.tensor(obs_bins, dtype=torch.float64)
    expected_t = torch.tensor(exp_bins, dtype=torch.float64)
    statistic = float(((observed_t - expected_t) ** 2 / expected_t).sum())
    dof = len(exp_bins) - 1
    if dof == 0 and int(possible.sum()) > 1:  # every category pooled into one bin: nothing could fail
        raise ValueError(
            f"chi_square_test: {int(possible.sum())} possible categories but {total:.0f} samples expect fewer than "
            f"{min_expected} in all but one bin, so the test has no power: draw more samples"
        )
    return ChiSquareResult(statistic=statistic, dof=dof, p_value=chi_square_sf(statistic, dof), impossible=impossible)

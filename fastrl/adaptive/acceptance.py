"""A stochastic model of how many draft tokens the policy accepts per request, per strategy and phase.

The drafter's top-1 guess at tree depth ``d`` matches the policy's token with probability
``p_d = top1_hit * depth_decay**(d - 1)``; with ``w`` candidates on the path at that depth the chance one of them
matches is ``1 - (1 - p_d) * width_decay**(w - 1)`` (later siblings are less likely than the first). A request
accepts tokens depth by depth until the first miss, so accepted tokens are geometric-like and capped at ``steps``.
The ``num_draft_tokens - 1`` tree nodes are spread over depths greedily by expected gain, at most ``topk`` per depth
(only the children of the on-path node can extend it), so deeper, wider, larger trees accept more. Each request
gets its own ``top1_hit`` (drawn around the phase's value with ``request_jitter``), as some responses are easier
to draft than others.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fastrl.strategy.strategy import Strategy


@dataclass(frozen=True)
class AcceptanceProfile:
    """How well the drafter agrees with the policy during one phase of training."""

    top1_hit: float = 0.6
    depth_decay: float = 0.97
    width_decay: float = 0.8
    request_jitter: float = 0.05

    def __post_init__(self) -> None:
        for name in ("top1_hit", "depth_decay", "width_decay"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"AcceptanceProfile.{name} must be in (0, 1], got {value}")
        if self.request_jitter < 0.0:
            raise ValueError(f"AcceptanceProfile.request_jitter must be >= 0, got {self.request_jitter}")

    def sample_request_hits(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """Per-request top-1 hit probabilities. [count]"""
        hits = self.top1_hit + self.request_jitter * rng.standard_normal(count)
        return np.clip(hits, 0.01, 0.99)

    def sample_accepted(self, strategy: Strategy, request_hits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Accepted draft tokens per request for one round of ``strategy``. request_hits: [b] -> [b] int"""
        if strategy.is_disabled:
            return np.zeros(len(request_hits), dtype=np.int64)
        _require_eagle(strategy)
        widths = np.asarray(level_widths(strategy, self))  # [steps]
        depth_hit = request_hits[:, None] * self.depth_decay ** np.arange(strategy.steps)[None, :]  # [b, steps]
        level_hit = np.where(widths > 0, 1.0 - (1.0 - depth_hit) * self.width_decay ** np.maximum(widths - 1, 0), 0.0)
        survived = np.cumprod(rng.random(level_hit.shape) < level_hit, axis=1)  # [b, steps]
        return survived.sum(axis=1)

    def expected_accepted(self, strategy: Strategy) -> float:
        """Mean accepted draft tokens per request, averaged over the request jitter (Gauss-Hermite, 9 points)."""
        return _expected_accepted(strategy, self)


def _level_hit(profile: AcceptanceProfile, top1_hit: float, depth: int, width: int) -> float:
    if width == 0:
        return 0.0
    p = top1_hit * profile.depth_decay ** (depth - 1)
    return 1.0 - (1.0 - p) * profile.width_decay ** (width - 1)


def _path_value(profile: AcceptanceProfile, top1_hit: float, widths: list[int]) -> float:
    """Expected accepted tokens: sum over depths of the probability that every level up to it matched."""
    total, alive = 0.0, 1.0
    for depth, width in enumerate(widths, start=1):
        alive *= _level_hit(profile, top1_hit, depth, width)
        total += alive
    return total


@lru_cache(maxsize=4096)
def level_widths(strategy: Strategy, profile: AcceptanceProfile) -> tuple[int, ...]:
    """On-path candidates per depth: the tree's draft nodes spread greedily by expected gain. -> [steps]"""
    widths = [0] * strategy.steps
    for _ in range(strategy.num_draft_tokens - 1):
        base = _path_value(profile, profile.top1_hit, widths)
        best_gain, best_level = 0.0, -1
        for level in range(strategy.steps):
            if widths[level] >= strategy.topk:
                continue
            widths[level] += 1
            gain = _path_value(profile, profile.top1_hit, widths) - base
            widths[level] -= 1
            if gain > best_gain + 1e-12:
                best_gain, best_level = gain, level
        if best_level < 0:
            break
        widths[best_level] += 1
    return tuple(widths)


@lru_cache(maxsize=4096)
def _expected_accepted(strategy: Strategy, profile: AcceptanceProfile) -> float:
    if strategy.is_disabled:
        return 0.0
    _require_eagle(strategy)
    widths = list(level_widths(strategy, profile))
    nodes, weights = np.polynomial.hermite_e.hermegauss(9)
    weights = weights / weights.sum()
    total = 0.0
    for node, weight in zip(nodes, weights, strict=True):
        hit = float(np.clip(profile.top1_hit + profile.request_jitter * node, 0.01, 0.99))
        total += weight * _path_value(profile, hit, widths)
    return total


def _require_eagle(strategy: Strategy) -> None:
    """The acceptance model describes EAGLE trees only; history drafts depend on the rollouts' own repetition."""
    if strategy.is_history:
        raise ValueError(
            f"strategy {strategy}: the simulator's acceptance model covers EAGLE strategies (S_K_N) only; "
            "history arms (suffix_N, hybrids) are measured, not simulated"
        )

"""Structured config of `fastrl check-exact`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastrl.adaptive.factory import build_selector
from fastrl.commands.decode_config import DecodeConfig
from fastrl.strategy.strategy import DISABLE


@dataclass
class CheckExactConfig(DecodeConfig):
    """Keys of `fastrl check-exact` (see conf/check_exact.yaml): the decode keys of `fastrl generate`, plus the plain
    run's batch size, where to write the report and the log-prob tolerance."""

    strategy: str = "8_4_32"
    plain_batch_size: int = 0
    report: str = ""
    logprob_tol: float | None = None
    """Equal tokens whose log-probs differ by more count as a bug; None: the compute dtype's rounding
    (``fastrl.exactness.mismatch.logprob_tolerance``: 1e-3 in float32, 0.25 in bfloat16, times 1/T below T = 1)."""

    def __post_init__(self) -> None:
        self.check_decode_keys("check_exact")
        if not (self.strategy == "ema" and self.ema_json) and not speculates(self):  # plain against plain
            raise ValueError(
                f"check_exact.strategy={self.strategy}: name a speculative strategy (S_K_N, bandit or ema), or a "
                "selector with one among its strategies; this one decodes plainly only"
            )
        if self.plain_batch_size < 0:
            raise ValueError(f"check_exact.plain_batch_size must be >= 0 (0: batch_size), got {self.plain_batch_size}")
        if self.logprob_tol is not None and not 0 <= self.logprob_tol < math.inf:  # inf would check nothing
            raise ValueError(
                f"check_exact.logprob_tol must be a finite number >= 0 (null: the dtype's), got {self.logprob_tol}"
            )


def speculates(cfg: CheckExactConfig) -> bool:
    """Whether the selector ``cfg`` names may run a speculative round at the batch sizes the check decodes at
    (``DISABLE`` spelled any way, a bandit of ``[disable]``, or one whose buckets up to ``batch_size`` and
    ``bs_threshold`` hold ``disable`` alone, has none: checking it would compare plain decoding with itself)."""
    if cfg.strategy != "bandit":
        return any(s != DISABLE for s in build_selector(cfg.strategy, cfg.bandit, cfg.ema).strategies)
    top = cfg.batch_size if cfg.bandit.bs_threshold is None else min(cfg.batch_size, cfg.bandit.bs_threshold)
    buckets = zip(cfg.bandit.buckets().thresholds, cfg.bandit.arms_per_bucket(), strict=True)
    reached = [arms for low, arms in buckets if low <= top]
    return any(s != DISABLE for arms in reached for s in arms)

"""The consistency check between rollout log-probs and the trainer's recomputation of them.

The rollout engine reports the log-prob of each token it sampled; the trainer recomputes them under the weights
it believes the rollout used. They agree to float precision when the rollout is on-policy and both sides process
logits the same way. Stale or wrong weights on a worker, a different temperature / top-k / top-p, or a broken
sampler show up as a large difference, reported every step and fatal above a tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.exactness.mismatch import logprob_tolerance

TRAINER_TOLERANCE = 1e-3
"""Default tolerance where rollouts compute in float32 or float64 (the trainer recomputes in float32)."""


def rollout_tolerance(rollout_dtype: torch.dtype | None, temperature: float = 1.0) -> float:
    """Default tolerance for rollouts computed in ``rollout_dtype`` (None: unknown, float32 or wider) at
    ``temperature``: the trainer's float32 rounding, or a half-precision rollout's own, as
    ``fastrl.exactness.mismatch.logprob_tolerance`` bounds it (bfloat16: 0.25 at T >= 1; logits divided by T < 1
    scale the rounding by 1/T: 2.5 at T = 0.1)."""
    own = logprob_tolerance(rollout_dtype, temperature) if rollout_dtype is not None else 0.0
    return max(TRAINER_TOLERANCE, own)


class LogprobMismatchError(RuntimeError):
    """Rollout log-probs differ from the trainer's recomputation by more than the tolerance."""


@dataclass
class LogprobCheck:
    """How far the rollout's log-probs are from the recomputed ones, over all response tokens.

    max_abs_diff / mean_abs_diff: over tokens (inf when a side is non-finite where the other is not).
    worst_row / worst_token: where the max is.
    """

    max_abs_diff: float
    mean_abs_diff: float
    worst_row: int
    worst_token: int


def compare_logprobs(rollout: Tensor, recomputed: Tensor, mask: Tensor) -> LogprobCheck:
    """Differences on the masked tokens.  # rollout/recomputed [B,T], mask [B,T] bool -> LogprobCheck"""
    if rollout.shape != recomputed.shape or rollout.shape != mask.shape:
        raise ValueError(
            f"shapes differ: rollout {tuple(rollout.shape)}, recomputed {tuple(recomputed.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    a = rollout.to(torch.float64)
    b = recomputed.to(torch.float64)
    diff = (a - b).abs()
    diff = torch.where(a == b, torch.zeros_like(diff), diff)  # equal infinities agree
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
    diff = torch.where(mask, diff, torch.zeros_like(diff))
    count = int(mask.sum())
    if count == 0:
        return LogprobCheck(0.0, 0.0, 0, 0)
    flat = int(diff.argmax())
    max_diff = float(diff.max())
    return LogprobCheck(
        max_abs_diff=max_diff,
        mean_abs_diff=float(diff.sum()) / count,
        worst_row=flat // diff.shape[1],
        worst_token=flat % diff.shape[1],
    )


def require_consistent(check: LogprobCheck, tolerance: float, context: str = "") -> None:
    """Raise LogprobMismatchError when the max difference exceeds `tolerance` (inf disables the check) or is
    not finite while the tolerance is."""
    if math.isinf(tolerance):
        return
    if not check.max_abs_diff <= tolerance:
        raise LogprobMismatchError(
            f"rollout log-probs differ from the trainer's recomputation by up to {check.max_abs_diff:.3g} "
            f"(mean {check.mean_abs_diff:.3g}; worst at sequence {check.worst_row}, response token "
            f"{check.worst_token}), above logprob_tolerance={tolerance:g}{': ' + context if context else ''}. "
            "The rollout did not run the trainer's current weights with the same sampling settings "
            "(stale policy on a worker, wrong weights, or a different temperature/top-k/top-p); in low precision "
            "raise logprob_tolerance."
        )

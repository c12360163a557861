"""What one GRPO step reports, and the interface of whatever records it (W&B, stdout, a list in tests)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Protocol

from fastrl.rl.rollout_speed import SpeedStory
from fastrl.rollout.types import WorkerReplacement
from fastrl.strategy.round_stats import accept_length

CORRECT_REWARD = 1.0  # a sample counts as correct when its reward reaches the task's full reward


@dataclass
class StepMetrics:
    """One training step.

    Rollout: `policy_version` generated the samples; rewards (mean, std), accuracy (fraction of samples with
    reward >= CORRECT_REWARD) overall and per problem-size bucket, response lengths in tokens, the fraction cut
    by max_new_tokens / context, the rollout's wall time and tail time (after the first worker ran dry), the
    mean accepted tokens per decode round (1.0 for plain decoding) over `decode_rows` request-rounds (None in the
    metrics of older runs) and `speculative_accept_length`, the same over
    the rounds that drafted only (None when none did: the drafter's quality apart from the selector's choice of
    plain decoding), the drafter version after the rollout and
    its co-training loss / top-1 accuracy when it trained (`drafter_steps` optimiser steps summed over workers, in
    `drafter_time_s` wall seconds summed over workers, in the tail or after it; `drafter_failures` co-training
    slices or merges that failed, their work dropped: each is also a warning in the run's log),
    and the drafter's top-1 agreement with the policy on the rollout's held-out requests, before and after the
    rollout's update (None without held-out requests). `drift_kl` (with GRPOConfig.track_drift): KL of the policy
    that generated the rollout to the initial policy, estimated on the rollout's responses (over the tokens both
    policies' top-k / top-p filters keep). A value that is not finite is null in metrics.jsonl (and a warning).
    Consistency: max / mean |rollout log-prob - recomputed log-prob| over response tokens.
    Update: total loss, its clipped-surrogate and KL parts (token means, averaged over optimizer steps), the
    fraction of clipped tokens, the gradient norm before clipping (mean over optimizer steps), learning rate.
    Time: update and whole-step wall seconds.
    Speed: `plain_time_estimate_s` is the estimated wall time of the rollout had it decoded plainly (None when the
    strategy selector made no estimate), `estimated_speedup` = that / `rollout_time_s`; `arm_rounds` counts the
    decode rounds per batch-size bucket and strategy (bucket label -> strategy -> rounds), `strategy_choices` the
    most-chosen strategy per bucket.
    Faults: `workers_lost` rollout workers were lost during or before the rollout (`workers_replaced` of them
    replaced: all, unless ``restart_failed_workers`` is off), their
    `requests_rerun` unfinished requests re-ran elsewhere and `cotrain_sequences_lost` co-training sequences died
    with them (each loss is also one line of the run's log naming the worker).
    """

    step: int
    policy_version: int
    reward_mean: float
    reward_std: float
    accuracy: float
    accuracy_by_bucket: dict[str, float]
    response_len_mean: float
    response_len_p50: float
    response_len_p90: float
    response_len_max: int
    truncated_fraction: float
    response_tokens: int
    rollout_time_s: float
    tail_time_s: float
    mean_accept_length: float
    drafter_version: int
    drafter_loss: float | None
    drafter_top1: float | None
    logprob_max_abs_diff: float
    logprob_mean_abs_diff: float
    loss: float
    pg_loss: float
    kl: float
    clip_fraction: float
    grad_norm: float
    lr: float
    update_time_s: float
    step_time_s: float
    drafter_steps: int = 0
    drafter_time_s: float = 0.0
    drafter_failures: int = 0
    drafter_heldout_top1_before: float | None = None
    drafter_heldout_top1: float | None = None
    drift_kl: float | None = None
    rollout_tokens_per_s: float = 0.0
    speculative_accept_length: float | None = None
    plain_time_estimate_s: float | None = None
    estimated_speedup: float | None = None
    arm_rounds: dict[str, dict[str, int]] = field(default_factory=dict)
    strategy_choices: dict[str, str] = field(default_factory=dict)
    workers_lost: int = 0
    workers_replaced: int = 0
    requests_rerun: int = 0
    cotrain_sequences_lost: int = 0
    decode_rows: int | None = None

    def to_flat_dict(self) -> dict[str, float]:
        """Scalar view for loggers: buckets as ``accuracy/<bucket>``, decode rounds as
        ``arm_rounds/<bucket>/<strategy>``, None values and the (string) strategy choices dropped."""
        out: dict[str, float] = {}
        for key, value in asdict(self).items():
            if key == "accuracy_by_bucket":
                out.update({f"accuracy/{k}": float(v) for k, v in value.items()})
            elif key == "arm_rounds":
                out.update({f"arm_rounds/{b}/{s}": float(n) for b, arms in value.items() for s, n in arms.items()})
            elif key != "strategy_choices" and value is not None:
                out[key] = float(value)
        return out

    def speed(self) -> SpeedStory:
        """The rollout's speed story (tokens/s, accept length, against plain decoding, choices per bucket)."""
        return SpeedStory(
            tokens=self.response_tokens,
            wall_time_s=self.rollout_time_s,
            accept_length=self.mean_accept_length,
            plain_time_estimate_s=self.plain_time_estimate_s,
            arm_rounds=self.arm_rounds,
        )

    def finite(self) -> bool:
        """True when every reported number is finite."""
        return all(math.isfinite(v) for v in self.to_flat_dict().values())


def worker_loss_fields(replacements: list[WorkerReplacement]) -> dict[str, int]:
    """StepMetrics' fault counts from a rollout's worker replacements."""
    return {
        "workers_lost": len(replacements),
        "workers_replaced": sum(r.replacement_id is not None for r in replacements),
        "requests_rerun": sum(len(r.rerun_request_ids) for r in replacements),
        "cotrain_sequences_lost": sum(r.cotrain_sequences_lost for r in replacements),
    }


class MetricsLogger(Protocol):
    """Receives each step's metrics (the trainer calls `log` once per step, after the update)."""

    def log(self, metrics: StepMetrics, step: int) -> None:
        """Record `metrics` of training step `step`."""
        ...


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def accuracy_by_bucket(buckets: list[str], rewards: list[float], names: list[str] | None = None) -> dict[str, float]:
    """Fraction of samples with reward >= CORRECT_REWARD per bucket, in the order of `names` (buckets without
    samples omitted), else in first-seen order."""
    totals: dict[str, list[int]] = {}
    for bucket, reward in zip(buckets, rewards, strict=True):
        counts = totals.setdefault(bucket, [0, 0])
        counts[0] += reward >= CORRECT_REWARD
        counts[1] += 1
    order = [n for n in names if n in totals] if names is not None else list(totals)
    return {name: totals[name][0] / totals[name][1] for name in order}


def decode_rows(accept_lengths: list[list[int]]) -> int:
    """Decode rounds summed over requests (each entry of a request's list is one round): the rows the accept
    length divides by."""
    return sum(len(a) for a in accept_lengths)


def mean_accept_length(accept_lengths: list[list[int]]) -> float:
    """Tokens emitted per decode round over all requests (`round_stats.accept_length` of their sums)."""
    return accept_length(sum(sum(a) for a in accept_lengths), decode_rows(accept_lengths))

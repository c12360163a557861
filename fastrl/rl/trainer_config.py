"""The GRPO trainer's configuration (a Hydra structured config), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from fastrl.sampling.params import check_temperature

# Keys that may differ between a checkpoint and the run that resumes it without changing the trajectory.
RESUMABLE_KEYS = ("steps", "checkpoint_every", "checkpoint_dir", "progress", "logprob_tolerance")


@dataclass
class GRPOConfig:
    """Keys of the GRPO trainer.

    Rollouts: each step samples `prompts_per_step` problems and `samples_per_prompt` (n) responses per problem
    with `temperature` / `top_p` / `top_k`, at most `max_new_tokens` each. temperature 0 (greedy) is allowed but
    gives n identical samples (zero advantage); log-probs are then the T = 1 ones, as the sampler reports.

    Advantages: (r - mean_group) / (std_group + advantage_eps), or r - mean_group when `scale_by_std` is False.

    Update: `ppo_epochs` passes over the batch, each split into `mini_batches` optimizer steps (1 and 1: one
    fully on-policy step, ratio = 1); every mini-batch is accumulated over micro-batches of at most
    `micro_batch_tokens` padded tokens. Loss = clipped surrogate (`clip_eps`, `clip_eps_high`: None = clip_eps)
    + `kl_coef` * k3 KL to the initial policy (kept frozen only when kl_coef > 0), both token means.
    AdamW (`lr`, `adam_beta1`, `adam_beta2`, `adam_eps`, `weight_decay`), gradients clipped to `max_grad_norm`
    (0 = no clipping; the norm is reported either way).

    Drift: with `track_drift`, a frozen copy of the initial policy is kept (and checkpointed) and every step
    reports `drift_kl`, the KL of the current policy to it estimated on the step's fresh rollouts.

    Checks: rollout vs recomputed log-probs, max abs difference above `logprob_tolerance` raises (inf: report
    only; None: `rollout_tolerance` of the rollouts' compute dtype and temperature where the caller knows the
    dtype, as `fastrl train` does, else 1e-3). Checkpoints every `checkpoint_every` steps and after the last one
    (0 = never) under `checkpoint_dir`/step_XXXXXX (XXXXXX = steps completed).
    """

    steps: int = 100
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    scale_by_std: bool = True
    advantage_eps: float = 1e-6
    lr: float = 1e-6
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    kl_coef: float = 0.0
    ppo_epochs: int = 1
    mini_batches: int = 1
    micro_batch_tokens: int = 16384
    seed: int = 0
    logprob_tolerance: float | None = None
    track_drift: bool = False
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        _at_least(self, "steps", 1)
        _at_least(self, "prompts_per_step", 1)
        _at_least(self, "samples_per_prompt", 2)
        _at_least(self, "max_new_tokens", 1)
        _at_least(self, "ppo_epochs", 1)
        _at_least(self, "mini_batches", 1)
        _at_least(self, "micro_batch_tokens", 1)
        _at_least(self, "checkpoint_every", 0)
        _at_least(self, "top_k", 0)
        if not 0 <= self.seed < 2**63:  # seeds live in int64 tensors
            raise ValueError(f"GRPOConfig.seed must be in [0, 2**63), got {self.seed}")
        check_temperature("GRPOConfig.temperature", self.temperature)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"GRPOConfig.top_p must satisfy 0 < top_p <= 1, got {self.top_p}")
        if not self.lr > 0:
            raise ValueError(f"GRPOConfig.lr must be > 0, got {self.lr}")
        for key in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"GRPOConfig.{key} must be in [0, 1), got {getattr(self, key)}")
        for key in ("adam_eps", "advantage_eps", "clip_eps"):
            if not getattr(self, key) > 0:
                raise ValueError(f"GRPOConfig.{key} must be > 0, got {getattr(self, key)}")
        if self.clip_eps >= 1:
            raise ValueError(
                f"GRPOConfig.clip_eps must be < 1 (the ratio is clipped at 1 - clip_eps), got {self.clip_eps}"
            )
        if self.clip_eps_high is not None and not self.clip_eps_high > 0:
            raise ValueError(f"GRPOConfig.clip_eps_high must be None or > 0, got {self.clip_eps_high}")
        for key in ("weight_decay", "max_grad_norm", "kl_coef"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"GRPOConfig.{key} must be a finite number >= 0, got {value}")
        if self.logprob_tolerance is not None and not self.logprob_tolerance >= 0:
            raise ValueError(
                f"GRPOConfig.logprob_tolerance must be >= 0 (inf: never raise; null: the rollout dtype's), got "
                f"{self.logprob_tolerance}"
            )
        if self.mini_batches > self.batch_size:
            raise ValueError(
                f"GRPOConfig.mini_batches={self.mini_batches} exceeds the {self.batch_size} sequences of a step "
                "(prompts_per_step * samples_per_prompt)"
            )
        if self.checkpoint_every > 0 and not self.checkpoint_dir:
            raise ValueError(
                f"GRPOConfig.checkpoint_dir must be set when GRPOConfig.checkpoint_every > 0 "
                f"(checkpoint_every={self.checkpoint_every})"
            )

    @property
    def batch_size(self) -> int:
        """Sequences per step."""
        return self.prompts_per_step * self.samples_per_prompt

    def trajectory_differences(self, other: GRPOConfig) -> list[str]:
        """Keys (outside RESUMABLE_KEYS) whose values differ: resuming across them is not an exact continuation."""
        return [
            f.name
            for f in fields(self)
            if f.name not in RESUMABLE_KEYS and getattr(self, f.name) != getattr(other, f.name)
        ]


def _at_least(config: GRPOConfig, key: str, low: int) -> None:
    value = getattr(config, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"GRPOConfig.{key} must be an integer >= {low}, got {value!r}")

"""Trains an EAGLE drafter on FeatureSequences against a frozen policy (offline, or in co-training time slices)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from fastrl.cotrain.eagle_loss import EagleLoss, EagleLossConfig, eagle_loss
from fastrl.cotrain.feature_sequence import FeatureBatch, FeatureSequence
from fastrl.models.checkpoint import non_finite_names
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter

TRAIN_TOP1_TARGETS = 256
"""A training step measures top-1 on at most this many targets when the drafter has a draft vocabulary (the policy's
full-vocabulary top-1 is a head product per target: on all of them it doubled a SmolLM2 step); evaluation measures
it on all."""

MAX_SEED = 2**40
"""Above a drafter training's seeds (drafter_trainer.seed, train_drafter.seed): the seeds derived from them
(seed * 1_000_003 + ..., seed * 100_003 + a request's index) stay within int64."""


@dataclass
class DrafterTrainerConfig(EagleLossConfig):
    """Optimisation settings of the drafter, and (inherited) the loss: its terms and training-time-test depth.

    Trainers unroll 3 steps by default (EAGLE-3's training-time test): on the bundled model it beat 1 and 5 steps in
    held-out accept length at the same data and epochs, and dropping the feature term lost (docs/benchmarks.md,
    "Drafter training").
    """

    ttt_steps: int = 3

    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    total_steps: int = 0  # 0 = constant learning rate after warm-up (train-drafter: a cosine over its whole run, sized
    # from its first shard); else cosine decay to 10% at total_steps
    grad_clip: float = 1.0
    max_tokens_per_batch: int = 8192
    feature_noise: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, zero_allowed in (("lr", False), ("grad_clip", False), ("weight_decay", True), ("feature_noise", True)):
            value = getattr(self, key)
            if not (math.isfinite(value) and (value >= 0 if zero_allowed else value > 0)):
                bound = ">= 0" if zero_allowed else "> 0"
                raise ValueError(f"drafter_trainer.{key} must be a finite number {bound}, got {value}")
        if self.max_tokens_per_batch < 1:
            raise ValueError(f"drafter_trainer.max_tokens_per_batch must be >= 1, got {self.max_tokens_per_batch}")
        for key in ("warmup_steps", "total_steps"):
            if getattr(self, key) < 0:
                raise ValueError(f"drafter_trainer.{key} must be >= 0, got {getattr(self, key)}")
        if not 0 <= self.seed < MAX_SEED:  # batch and noise seeds derive from it (seed * 1_000_003 + ...)
            raise ValueError(f"drafter_trainer.seed must be an integer in [0, 2**40), got {self.seed}")


@dataclass
class DrafterMetrics:
    """Averages over the entries of one step or evaluation."""

    loss: float
    feature_loss: float
    token_loss: float
    top1: float
    tokens: int


def make_batches(
    seqs: list[FeatureSequence], max_tokens: int, rng: random.Random | None = None
) -> list[list[FeatureSequence]]:
    """Group sequences of similar length so each padded batch holds at most `max_tokens` entries (one sequence
    always fits); shuffled batch order when `rng` is given."""
    return [[seqs[i] for i in group] for group in batch_indices(seqs, max_tokens, rng)]


def batch_indices(seqs: list[FeatureSequence], max_tokens: int, rng: random.Random | None = None) -> list[list[int]]:
    """``make_batches``' groups as indices into `seqs` (for callers that pair each sequence with other values)."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].tokens.shape[0])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = max([seqs[i].tokens.shape[0]] + [seqs[c].tokens.shape[0] for c in current])
        if current and width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def finite_metrics(loss: EagleLoss, where: str) -> DrafterMetrics:
    """The metrics of one batch's loss; FloatingPointError (naming `where`) when the loss or top-1 is not finite: a
    non-finite feature in the batch, or diverged weights."""
    total = float(loss.total.detach())
    if not (math.isfinite(total) and math.isfinite(float(loss.top1))):
        raise FloatingPointError(f"non-finite drafter loss {total} {where} (a non-finite feature or weight)")
    return DrafterMetrics(total, float(loss.feature), float(loss.token), float(loss.top1), loss.count)


class DrafterTrainer:
    """AdamW on the drafter's own parameters; the policy's embedding and LM head stay frozen and shared.

    `version` counts the drafter weights this trainer produced (bumped by `bump_version` when they are published).
    """

    def __init__(
        self, drafter: EagleDrafter, policy: CausalLM, config: DrafterTrainerConfig | None = None, version: int = 0
    ) -> None:
        self.config = config or DrafterTrainerConfig()
        self.drafter = drafter
        self.policy = policy
        for p in policy.parameters():
            p.requires_grad_(False)
        self.device = drafter.fc.weight.device
        self.dtype = drafter.fc.weight.dtype
        self.optimizer = torch.optim.AdamW(
            drafter.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )
        self.step_count = 0
        self.version = version
        self.rng = random.Random(self.config.seed)

    def learning_rate(self) -> float:
        """Warm-up then constant, or cosine to 10% when total_steps is set."""
        c = self.config
        if self.step_count < c.warmup_steps:
            return c.lr * (self.step_count + 1) / c.warmup_steps
        if c.total_steps <= 0:
            return c.lr
        progress = min(1.0, (self.step_count - c.warmup_steps) / max(1, c.total_steps - c.warmup_steps))
        return c.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    def train_step(self, seqs: list[FeatureSequence]) -> DrafterMetrics:
        """One optimiser step on a batch of sequences (none when the batch holds no position to learn from: a
        sequence needs a token after its root, and a 2-token rollout gives the loss nothing). FloatingPointError
        when the loss is not finite (a non-finite feature, or a diverged run: the step is not taken). The drafter is
        left in eval mode, whatever happens."""
        self.drafter.train()
        try:
            return self._step(seqs)
        finally:
            self.drafter.eval()

    def _step(self, seqs: list[FeatureSequence]) -> DrafterMetrics:
        """``train_step``'s work, with the drafter in train mode."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        batch = FeatureBatch.collate(seqs, self.device, self.dtype, target_size=self.drafter.config.hidden_size)
        with torch.enable_grad():
            loss = eagle_loss(
                self.drafter, self.policy, batch, self.config, self.config.feature_noise, TRAIN_TOP1_TARGETS
            )
            if loss.count == 0:  # no position to learn from (sequences too short): no step, nothing counted
                return DrafterMetrics(0.0, 0.0, 0.0, 0.0, 0)
            metrics = finite_metrics(loss, f"at step {self.step_count + 1}")
            self.optimizer.zero_grad(set_to_none=True)
            loss.total.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.step_count += 1
        return metrics

    def check_finite(self) -> None:
        """FloatingPointError when a weight of the drafter is NaN or infinite (an update that diverged)."""
        bad = non_finite_names(dict(self.drafter.named_parameters()))
        if bad:
            raise FloatingPointError(f"drafter weights became non-finite after step {self.step_count}: {bad[:3]}")

    def train_epoch(self, seqs: list[FeatureSequence]) -> list[DrafterMetrics]:
        """One pass over `seqs` in length-grouped, shuffled batches."""
        return [self.train_step(b) for b in make_batches(seqs, self.config.max_tokens_per_batch, self.rng)]

    @torch.no_grad()
    def evaluate(self, seqs: list[FeatureSequence]) -> DrafterMetrics:
        """Token-weighted loss and top-1 agreement with the policy on `seqs` (no noise, no update). FloatingPointError
        when a batch's loss is not finite, as in ``train_step``."""
        self.drafter.eval()
        totals = [0.0, 0.0, 0.0, 0.0]
        count = 0
        for group in make_batches(seqs, self.config.max_tokens_per_batch):
            loss = eagle_loss(
                self.drafter,
                self.policy,
                FeatureBatch.collate(group, self.device, self.dtype, target_size=self.drafter.config.hidden_size),
                self.config,
            )
            metrics = finite_metrics(loss, "in evaluation")
            for i, v in enumerate((metrics.loss, metrics.feature_loss, metrics.token_loss, metrics.top1)):
                totals[i] += v * loss.count
            count += loss.count
        if count == 0:
            raise ValueError("evaluate: no entries with targets")
        return DrafterMetrics(*(t / count for t in totals), tokens=count)

    def bump_version(self) -> int:
        """Mark the current weights as a new published version; returns it."""
        self.version += 1
        return self.version

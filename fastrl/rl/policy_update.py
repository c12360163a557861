"""The GRPO policy update of one step: old / reference log-probs, then epochs x mini-batches of AdamW steps,
each accumulated over token-budgeted micro-batches."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.models.decoder import CausalLM
from fastrl.rl.grpo import clipped_policy_loss, drift_kl, kl_k3, token_mean
from fastrl.rl.logprobs import PackedSequences, batched_logprobs, plan_micro_batches, response_logprobs
from fastrl.rl.seeding import shuffle_generator
from fastrl.rl.trainer_config import GRPOConfig


@dataclass
class UpdateBatch:
    """One step's sequences with what the loss needs.

    sequences: N packed prompt + response pairs; advantages: [N]; old_logprobs: [N,T] under the policy before
    the update (the PPO ratio's denominator); ref_logprobs: [N,T] under the frozen reference, or None (no KL);
    drift_kl: the token mean of old - reference log-probs over the responses (`grpo.drift_kl`: an estimate of
    KL(policy || initial policy) on prompts the policy has not trained on yet), None unless `track_drift`.
    """

    sequences: PackedSequences
    advantages: Tensor
    old_logprobs: Tensor
    ref_logprobs: Tensor | None
    drift_kl: float | None = None


@dataclass
class UpdateStats:
    """Averages over the optimizer steps of one update (token means inside each)."""

    loss: float
    pg_loss: float
    kl: float
    clip_fraction: float
    grad_norm: float
    optimizer_steps: int
    drift_kl: float | None = None  # copied from UpdateBatch.drift_kl by the trainer


class PolicyUpdater:
    """Owns the AdamW optimizer of `policy` and, when kl_coef > 0 or track_drift, a frozen copy of the initial
    policy.

    `prepare` computes old (and reference) log-probs without gradient; `update` runs `ppo_epochs` passes, each a
    seeded shuffle of the sequences split into `mini_batches` optimizer steps. Every mini-batch's loss is the
    token mean over all its response tokens, accumulated over micro-batches that pass that token count as the
    normaliser, so the gradient does not depend on `micro_batch_tokens`.
    """

    def __init__(self, policy: CausalLM, config: GRPOConfig) -> None:
        self.policy = policy
        self.config = config
        self.optimizer = torch.optim.AdamW(
            policy.parameters(),
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.reference: CausalLM | None = None
        if config.kl_coef > 0 or config.track_drift:
            self.reference = copy.deepcopy(policy).eval().requires_grad_(False)

    def prepare(self, sequences: PackedSequences, advantages: Tensor) -> UpdateBatch:
        """Old and reference log-probs of `sequences`.  # N sequences, [N] -> UpdateBatch"""
        budget = self.config.micro_batch_tokens
        old = batched_logprobs(self.policy, sequences, budget)
        ref = None if self.reference is None else batched_logprobs(self.reference, sequences, budget)
        drift = None
        if ref is not None and self.config.track_drift:
            drift = drift_kl(old, ref, sequences.response_mask)
        return UpdateBatch(
            sequences=sequences,
            advantages=advantages.to(old.device),
            old_logprobs=old,
            ref_logprobs=ref if self.config.kl_coef > 0 else None,
            drift_kl=drift,
        )

    def update(self, batch: UpdateBatch, step: int) -> UpdateStats:
        """All optimizer steps of training step `step` (its index seeds the mini-batch shuffles)."""
        cfg = self.config
        seqs = batch.sequences
        count = seqs.response_mask.shape[0]
        lengths = (seqs.prompt_lengths + seqs.response_mask.sum(dim=1)).tolist()
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
        steps = 0
        for epoch in range(cfg.ppo_epochs):
            order = torch.randperm(count, generator=shuffle_generator(cfg.seed, step, epoch))
            for mini in torch.tensor_split(order, cfg.mini_batches):
                stats = self._optimizer_step(batch, mini.tolist(), lengths)
                for key, value in stats.items():
                    sums[key] += value
                steps += 1
        return UpdateStats(**{k: v / steps for k, v in sums.items()}, optimizer_steps=steps)

    def _optimizer_step(self, batch: UpdateBatch, rows: list[int], lengths: list[int]) -> dict[str, float]:
        """One AdamW step over the sequences `rows`; returns its loss parts, clip fraction and gradient norm."""
        cfg = self.config
        device = batch.old_logprobs.device
        mask = batch.sequences.response_mask
        normalizer = mask[torch.tensor(rows, device=device)].sum().clamp(min=1)
        self.optimizer.zero_grad(set_to_none=True)
        pg_total, kl_total, clipped = 0.0, 0.0, 0.0
        for micro in plan_micro_batches(lengths, rows, cfg.micro_batch_tokens):
            index = torch.tensor(micro, dtype=torch.long, device=device)
            sub = batch.sequences.select(index)
            width = sub.response_mask.shape[1]
            logp = response_logprobs(self.policy, sub)  # [b,T]
            part = clipped_policy_loss(
                logp,
                batch.old_logprobs[index, :width],
                batch.advantages[index],
                sub.response_mask,
                cfg.clip_eps,
                cfg.clip_eps_high,
                normalizer,
            )
            loss = part.loss
            if batch.ref_logprobs is not None:
                kl = token_mean(
                    kl_k3(logp, batch.ref_logprobs[index, :width], sub.response_mask), sub.response_mask, normalizer
                )
                loss = loss + cfg.kl_coef * kl
                kl_total += float(kl.detach())
            loss.backward()
            pg_total += float(part.loss.detach())
            clipped += float(part.clip_fraction) * int(sub.response_mask.sum()) / float(normalizer)
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), max_norm)
        self.optimizer.step()
        return {
            "loss": pg_total + cfg.kl_coef * kl_total,
            "pg_loss": pg_total,
            "kl": kl_total,
            "clip_fraction": clipped,
            "grad_norm": float(grad_norm),
        }

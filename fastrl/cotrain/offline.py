"""Offline drafter training: sample rollouts from the policy, take its features, fit the drafter, measure it."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from fastrl.cotrain.accept_eval import AcceptResult, measure_accept_length
from fastrl.cotrain.drafter_trainer import DrafterMetrics, DrafterTrainer, DrafterTrainerConfig, make_batches
from fastrl.cotrain.features import policy_features
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.draft_vocab import coverage, most_frequent_tokens
from fastrl.speculative.drafter import EagleDrafter


@dataclass
class OfflineDrafterConfig:
    """What to generate, how long to train, and how to measure."""

    num_prompts: int = 1024
    eval_prompts: int = 64
    temperature: float = 1.0
    max_new_tokens: int = 1024
    gen_batch_size: int = 64
    epochs: int = 4
    seed: int = 0
    accept_strategies: list[str] = field(default_factory=lambda: ["3_1_4", "8_4_32"])
    accept_requests: int = 16
    device: str = "cpu"
    draft_vocab_size: int = 0  # > 0: draft over the K most frequent tokens of the training rollouts
    trainer: DrafterTrainerConfig = field(default_factory=DrafterTrainerConfig)


@dataclass
class OfflineDrafterReport:
    """Per-epoch evaluation and the final accept lengths (per strategy and temperature)."""

    epochs: list[DrafterMetrics]
    accept_lengths: list[AcceptResult]
    train_sequences: int
    train_tokens: int


def rollout_sequences(
    policy: CausalLM, tokenizer: Any, cfg: OfflineDrafterConfig, count: int, seed: int
) -> list[list[int]]:
    """Sample `count` task rollouts from the policy; returns prompt + response ids."""
    task = ArithChainTask()
    rng = random.Random(seed)
    prompts = [tokenizer(task.sample_problem(rng).prompt)["input_ids"] for _ in range(count)]
    params = [
        SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=seed * 100003 + i)
        for i in range(count)
    ]
    engine = Engine(policy, EngineConfig(max_batch_size=cfg.gen_batch_size, device=cfg.device))
    outs = engine.generate([GenerateInput(p, q) for p, q in zip(prompts, params, strict=True)], progress=True)
    return [o.prompt_ids + o.token_ids for o in outs]


def fit_drafter(
    policy: CausalLM,
    drafter: EagleDrafter,
    train_ids: list[list[int]],
    eval_ids: list[list[int]],
    cfg: OfflineDrafterConfig,
) -> tuple[list[DrafterMetrics], list]:
    """Fit `drafter` in place on the policy's features of `train_ids` for cfg.epochs (cosine over the whole run
    unless the trainer sets total_steps), first restricting it to the draft_vocab_size most frequent tokens of the
    training sequences when > 0; held-out metrics on `eval_ids` after each epoch. Returns (per-epoch metrics,
    the training FeatureSequences)."""
    if cfg.draft_vocab_size > 0:
        vocab = most_frequent_tokens(train_ids, cfg.draft_vocab_size, policy.config.vocab_size)
        drafter.set_draft_vocab(vocab)
        print(f"draft vocabulary: {vocab.numel()} tokens cover {coverage(eval_ids, vocab):.4f} of held-out tokens")
    train = policy_features(policy, train_ids)
    held_out = policy_features(policy, eval_ids)
    trainer_cfg = cfg.trainer
    if trainer_cfg.total_steps == 0:  # cosine over the whole run
        per_epoch = len(make_batches(train, trainer_cfg.max_tokens_per_batch))
        trainer_cfg = dataclasses.replace(trainer_cfg, total_steps=per_epoch * cfg.epochs)
    trainer = DrafterTrainer(drafter, policy, trainer_cfg)
    epochs = []
    for epoch in range(cfg.epochs):
        bar = tqdm(trainer.train_epoch(train), desc=f"drafter epoch {epoch + 1}/{cfg.epochs}", unit="step", leave=False)
        for last in bar:
            bar.set_postfix(loss=f"{last.loss:.3f}", top1=f"{last.top1:.3f}")
        metrics = trainer.evaluate(held_out)
        epochs.append(metrics)
        print(f"epoch {epoch + 1}: held-out loss {metrics.loss:.4f}, top-1 {metrics.top1:.3f}", flush=True)
    return epochs, train


def train_offline(
    policy: CausalLM, drafter: EagleDrafter, tokenizer: Any, cfg: OfflineDrafterConfig
) -> OfflineDrafterReport:
    """The whole offline recipe; `drafter` is trained in place."""
    torch.manual_seed(cfg.seed)
    train_ids = rollout_sequences(policy, tokenizer, cfg, cfg.num_prompts, cfg.seed)
    eval_ids = rollout_sequences(policy, tokenizer, cfg, cfg.eval_prompts, cfg.seed + 1)
    epochs, train = fit_drafter(policy, drafter, train_ids, eval_ids, cfg)
    accept = []
    rng = random.Random(cfg.seed + 2)
    task = ArithChainTask()
    for temperature in (0.0, cfg.temperature):
        inputs = [
            GenerateInput(
                tokenizer(task.sample_problem(rng).prompt)["input_ids"],
                SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=temperature, seed=i),
            )
            for i in range(cfg.accept_requests)
        ]
        for strategy in cfg.accept_strategies:
            length = measure_accept_length(policy, drafter, inputs, strategy, device=cfg.device)
            accept.append(AcceptResult(strategy, temperature, length))
            print(f"accept length {strategy} T={temperature}: {length:.2f}", flush=True)
    return OfflineDrafterReport(epochs, accept, len(train), sum(s.num_targets for s in train))

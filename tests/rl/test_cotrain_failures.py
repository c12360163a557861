"""A co-training slice that fails (here: a learning rate that makes the drafter's loss non-finite) drops its work and
says so: `drafter_failures` in the step's metrics and one warning per failure in the run's log; the live drafter and
the rollouts are untouched."""

from __future__ import annotations

import logging

import torch

from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.models.checkpoint import save_model
from fastrl.rl.trainer import GRPOTrainer
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.rollout.local import LocalRollout
from fastrl.rollout.worker_config import RolloutWorkerConfig
from tests.rl.grpo_setup import DigitTask, char_tokenizer, tiny_policy


def test_failed_cotraining_is_counted_and_logged(tmp_path, caplog):
    policy = tiny_policy()
    save_model(policy, tmp_path / "served")
    config = RolloutWorkerConfig(
        model_dir=str(tmp_path / "served"),
        strategy="3_1_4",
        cotrain=True,
        engine={"max_batch_size": 8},
        slice_seconds=0.05,
        trainer=DrafterTrainerConfig(lr=1e12, warmup_steps=0, max_tokens_per_batch=256),
    )
    backend = LocalRollout(config)
    live = {k: v.clone() for k, v in backend.worker.drafter.state_dict().items()}
    grpo = GRPOConfig(steps=2, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=10, progress=False)
    trainer = GRPOTrainer(policy, char_tokenizer(), DigitTask(), backend, grpo)
    with caplog.at_level(logging.WARNING, logger="fastrl.train"):
        metrics = trainer.train()
    failed = sum(m.drafter_failures for m in metrics)
    assert failed >= 1 and all(m.drafter_steps == 0 for m in metrics if m.drafter_failures)
    warnings = [r.getMessage() for r in caplog.records if "drafter co-training failed" in r.getMessage()]
    assert len(warnings) == failed and "non-finite" in warnings[0]
    assert all(m.to_flat_dict()["drafter_failures"] == m.drafter_failures for m in metrics)
    drafter = backend.worker.drafter.state_dict()
    assert all(torch.equal(drafter[k], v) for k, v in live.items())  # no diverged weights were published

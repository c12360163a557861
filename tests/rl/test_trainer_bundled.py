"""Three GRPO steps on the bundled arithmetic model with its tokenizer and the real task (slow; skipped until the
model is in fastrl/assets/arith-tiny)."""

from __future__ import annotations

import pytest

from fastrl.assets_path import bundled_model_dir
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks import ArithChainTask, TaskConfig
from fastrl.rl.trainer import GRPOTrainer
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.rollout.local import LocalRollout
from fastrl.rollout.worker_config import RolloutWorkerConfig

MODEL = bundled_model_dir()


@pytest.mark.slow
@pytest.mark.skipif(not (MODEL / "model.safetensors").is_file(), reason="the bundled model is not built yet")
def test_three_grpo_steps_on_the_bundled_model():
    task = ArithChainTask(TaskConfig(n_max=6))  # small problems: in distribution, short responses
    config = GRPOConfig(
        steps=3,
        prompts_per_step=4,
        samples_per_prompt=4,
        max_new_tokens=task.max_response_chars() + 1,
        lr=1e-5,
        progress=False,
        logprob_tolerance=1e-4,
    )
    backend = LocalRollout(RolloutWorkerConfig(model_dir=str(MODEL), engine={"max_batch_size": 16}, cotrain=False))
    trainer = GRPOTrainer(load_model(MODEL), load_tokenizer(MODEL), task, backend, config)
    history = trainer.train()
    assert [m.policy_version for m in history] == [0, 1, 2] and backend.policy_version == 3
    for m in history:
        assert m.finite(), m
        assert m.logprob_max_abs_diff < 1e-4
        assert m.truncated_fraction == 0.0  # the trained model stops with <eos>
    assert sum(m.accuracy for m in history) / 3 > 0.5  # it solves small sums, and 3 small steps keep it so

"""The GRPO trainer end to end on a tiny random policy with a real Engine-backed backend."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fastrl.rl.logprob_check import LogprobMismatchError
from fastrl.rl.metrics import StepMetrics
from fastrl.rl.trainer import GRPOTrainer, OffPolicyRolloutError
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.rollout.local import LocalRollout
from tests.rl.grpo_setup import DigitTask, char_tokenizer, local_backend, tiny_policy

BASE = dict(prompts_per_step=2, samples_per_prompt=4, max_new_tokens=12, lr=1e-2, progress=False)


class ListLogger:
    """Keeps what the trainer logs."""

    def __init__(self) -> None:
        self.records: list[tuple[int, StepMetrics]] = []

    def log(self, metrics: StepMetrics, step: int) -> None:
        self.records.append((step, metrics))


def _trainer(tmp_path, config: GRPOConfig, seed: int = 0, logger=None) -> tuple[GRPOTrainer, LocalRollout]:
    policy = tiny_policy(seed=seed)
    backend = local_backend(tmp_path / f"served-{seed}", tiny_policy(seed=seed + 1000))  # other weights
    return GRPOTrainer(policy, char_tokenizer(), DigitTask(), backend, config, logger), backend


def test_steps_run_end_to_end_and_bump_versions(tmp_path):
    logger = ListLogger()
    config = GRPOConfig(steps=3, kl_coef=0.05, ppo_epochs=2, mini_batches=2, micro_batch_tokens=64, **BASE)
    trainer, backend = _trainer(tmp_path, config, logger=logger)
    initial = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    history = trainer.train()
    assert [m.step for m in history] == [0, 1, 2] and [s for s, _ in logger.records] == [0, 1, 2]
    assert [m.policy_version for m in history] == [0, 1, 2]
    assert trainer.version == 3 and backend.policy_version == 3 and trainer.step == 3
    for m in history:
        assert m.finite(), m
        assert m.logprob_max_abs_diff < 1e-4  # the backend was synced to the trainer's weights before step 0
        assert 1 <= m.response_len_p50 <= m.response_len_p90 <= m.response_len_max <= 12
        assert m.mean_accept_length == 1.0 and m.grad_norm > 0 and 0 <= m.clip_fraction <= 1
        assert set(m.accuracy_by_bucket) <= {"2-3", "4+"} and m.accuracy_by_bucket
        assert m.response_tokens > 0 and m.step_time_s >= m.update_time_s > 0
        assert m.kl >= 0 and m.loss == pytest.approx(m.pg_loss + 0.05 * m.kl)
    assert history[-1].kl > 0  # the policy moved away from its frozen start
    # the backend's model holds exactly the trainer's weights
    for name, value in trainer.policy.state_dict().items():
        assert torch.equal(backend.worker.policy.state_dict()[name], value)
        assert not torch.equal(initial[name], value) or name.endswith("norm.weight")
    assert trainer.updater.reference is not None
    assert all(torch.equal(trainer.updater.reference.state_dict()[k], v) for k, v in initial.items())


def test_training_raises_the_dense_reward(tmp_path):
    config = GRPOConfig(steps=6, prompts_per_step=4, samples_per_prompt=4, max_new_tokens=12, lr=3e-2, progress=False)
    trainer, _ = _trainer(tmp_path, config, seed=3)
    rewards = [m.reward_mean for m in trainer.train()]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.05, rewards


def test_runs_are_reproducible_and_seeds_matter(tmp_path):
    config = GRPOConfig(steps=2, **BASE)
    a = [m.reward_mean for m in _trainer(tmp_path / "a", config)[0].train()]
    b = [m.reward_mean for m in _trainer(tmp_path / "b", config)[0].train()]
    c = [m.reward_mean for m in _trainer(tmp_path / "c", dataclasses.replace(config, seed=1))[0].train()]
    assert a == b and a != c


def test_wrong_weights_on_the_backend_are_caught(tmp_path):
    trainer, backend = _trainer(tmp_path, GRPOConfig(steps=1, **BASE))
    trainer.sync_backend()
    with torch.no_grad():
        backend.worker.policy.model.layers[1].self_attn.o_proj.weight.mul_(1.1)  # a worker with corrupted weights
    with pytest.raises(LogprobMismatchError, match="policy version 0"):
        trainer.train_step()


def test_stale_policy_version_is_caught(tmp_path):
    trainer, backend = _trainer(tmp_path, GRPOConfig(steps=1, **BASE))
    trainer.sync_backend()
    backend.worker.policy_version = 7  # a worker that missed the last weight push
    with pytest.raises(OffPolicyRolloutError, match="version 7"):
        trainer.train_step()


class OneBadReward(DigitTask):
    """The digit task, but its second reward is ``bad``."""

    def __init__(self, bad: object) -> None:
        super().__init__()
        self.bad, self.calls = bad, 0

    def reward(self, problem, text):
        self.calls += 1
        return self.bad if self.calls == 2 else super().reward(problem, text)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None, "0.5", [1.0]])
def test_a_reward_that_is_not_a_finite_number_stops_the_step_before_the_update(tmp_path, bad):
    """A NaN reward went through the advantages into the loss and wrote NaN into every weight (AdamW state too);
    only the weight push then complained, blaming the weights. None gave a bare TypeError."""
    trainer, _ = _trainer(tmp_path, GRPOConfig(steps=1, **BASE))
    trainer.task = OneBadReward(bad)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    with pytest.raises(ValueError, match=r"OneBadReward.reward returned .* for step0-p0-s1: a reward must be a finite"):
        trainer.train_step()
    assert all(torch.equal(before[k], v) for k, v in trainer.policy.state_dict().items())
    assert trainer.version == 0 and trainer.step == 0


@pytest.mark.parametrize("good", [True, 1, np.float32(0.5), torch.tensor(0.25)])
def test_rewards_of_any_numeric_kind_are_taken(tmp_path, good):
    trainer, _ = _trainer(tmp_path, GRPOConfig(steps=1, **BASE))
    trainer.task = OneBadReward(good)
    assert trainer.rollout(0).rewards[1] == float(good)


@pytest.mark.parametrize(
    "key, value",
    [
        ("steps", -1),
        ("prompts_per_step", 0),
        ("samples_per_prompt", 1),
        ("max_new_tokens", 0),
        ("temperature", -0.5),
        ("top_p", 0.0),
        ("top_k", -1),
        ("lr", 0.0),
        ("adam_beta2", 1.0),
        ("adam_eps", 0.0),
        ("weight_decay", -1.0),
        ("max_grad_norm", float("nan")),
        ("clip_eps", 1.5),
        ("clip_eps_high", -0.1),
        ("kl_coef", -0.1),
        ("ppo_epochs", 0),
        ("mini_batches", 100),
        ("micro_batch_tokens", 0),
        ("seed", -3),
        ("logprob_tolerance", -1.0),
        ("checkpoint_every", 2),  # without checkpoint_dir
        ("prompts_per_step", 2.5),
    ],
)
def test_bad_config_raises_naming_the_key(key, value):
    with pytest.raises(ValueError, match=rf"GRPOConfig\.{key}"):
        GRPOConfig(**{key: value})


def test_default_and_valid_configs_construct():
    assert GRPOConfig().batch_size == 64
    assert GRPOConfig(checkpoint_every=2, checkpoint_dir="runs/x", temperature=0.0, clip_eps_high=0.28).top_k == 0

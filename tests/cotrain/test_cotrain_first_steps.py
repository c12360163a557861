"""Co-training's first updates leave a strong drafter as good as it was.

AdamW's first steps move every weight by about the learning rate whatever its gradient (the moments are one
gradient's: the step is lr x sign(g)); on the shipped fused drafter one such step at `fastrl train`'s co-training
rate cut the held-out chain accept length from 4.5 to 3.3 tokens a round, and the default run (one fixed arm,
`7_1_8`) fell from 4.33 at step 0 to 3.0 at step 1, below the same drafter frozen at every later step
(docs/results.md). The learning rate therefore warms up over the first updates. These tests take `fastrl train`'s own
composed co-training settings, so a config that drops the warm-up fails here.
"""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.commands.train_config import TrainConfig
from fastrl.config_compose import compose_config, conf_dir
from fastrl.cotrain.chain_accept import greedy_chain_accept_length
from fastrl.cotrain.cotrainer import CoTrainer
from fastrl.cotrain.drafter_trainer import DrafterTrainer
from fastrl.cotrain.features import policy_features
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter

DEPTH = 7  # the chain of the default run's deepest fixed arm (7_1_8)


@pytest.fixture(scope="module")
def train_settings(tmp_path_factory):
    """The drafter trainer settings `fastrl train` composes by default (co-training on)."""
    run = tmp_path_factory.mktemp("run")
    config = compose_config("train", TrainConfig, [f"rl.checkpoint_dir={run}"], conf_dir() / "train")
    assert config.drafter.cotrain
    return config.drafter.trainer


@pytest.fixture(scope="module")
def rollouts():
    """The bundled policy, its shipped drafter, T=1 rollouts to train on (a rollout's worth), greedy held-out
    rollouts with their prompt lengths, and the shipped drafter's accept length over them."""
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0].eval()
    tokenizer, task, rng = load_tokenizer(bundled_model_dir()), ArithChainTask(), random.Random(0)
    prompts = [tokenizer(task.sample_problem(rng).prompt)["input_ids"] for _ in range(40)]
    engine = Engine(policy, EngineConfig(max_batch_size=40))
    sampled = [SamplingParams(max_new_tokens=160, temperature=1.0, seed=i) for i in range(24)]
    greedy = [SamplingParams(max_new_tokens=160, temperature=0.0)] * 16
    outputs = engine.generate([GenerateInput(p, s) for p, s in zip(prompts, sampled + greedy, strict=True)])
    full = [p + o.token_ids for p, o in zip(prompts, outputs, strict=True)]
    features = policy_features(policy, full, extra_layers=drafter.extra_layers)
    held_out, prompt_lengths = features[24:], [len(p) for p in prompts[24:]]
    shipped = greedy_chain_accept_length(drafter, policy, held_out, prompt_lengths, DEPTH)
    return policy, drafter, features[:24], held_out, prompt_lengths, shipped


def accept_after(rollouts, settings, steps: int) -> tuple[float, float]:
    """Held-out greedy chain accept length of the shipped drafter, and of its co-trained copy after ``steps``
    updates on the training rollouts (16 a batch)."""
    policy, drafter, train, held_out, prompt_lengths, shipped = rollouts
    trainer = CoTrainer(policy, settings)
    trainer.prepare(drafter, version=0)
    rng = random.Random(1)
    slice_metrics = trainer.train_slice(lambda _: rng.sample(train, 16), seconds=1e9, max_steps=steps)
    assert slice_metrics.steps == steps and slice_metrics.error is None
    trained = copy.deepcopy(drafter)  # the published weights, as a worker's merge receives them
    trained.load_state_dict(trainer.trained().state)
    return shipped, greedy_chain_accept_length(trained, policy, held_out, prompt_lengths, DEPTH)


@pytest.mark.parametrize("steps", [1, 3])
def test_the_first_updates_keep_the_shipped_drafters_accept_length(rollouts, train_settings, steps):
    before, after = accept_after(rollouts, train_settings, steps)
    assert before > 3.5  # the shipped drafter, strong
    assert after >= 0.95 * before, f"{steps} co-training updates: accept length {before:.3f} -> {after:.3f}"


def test_without_the_warm_up_one_update_costs_a_third_of_the_accept_length(rollouts, train_settings):
    """What the warm-up prevents (so the test above measures something that can fail)."""
    before, after = accept_after(rollouts, dataclasses.replace(train_settings, warmup_steps=0), 1)
    assert after < 0.85 * before


def test_the_learning_rate_warms_up_from_a_small_fraction(rollouts, train_settings):
    policy, drafter = rollouts[:2]
    trainer = DrafterTrainer(copy.deepcopy(drafter), policy, train_settings)
    assert train_settings.warmup_steps >= 10 and trainer.learning_rate() <= train_settings.lr / 10
    trainer.step_count = train_settings.warmup_steps
    assert trainer.learning_rate() == pytest.approx(train_settings.lr)

"""Reproducible co-training on a local Ray with two rollout workers (as `fastrl train` runs by default), a fixed
strategy and the `steps` schedule: two identical runs agree in every metric but wall-clock times and the log-prob
diagnostics, drafter metrics and accept lengths included; so do 4 steps and 2 steps + checkpoint + 2 resumed."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file

from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.cotrain.schedule import CotrainSchedule
from fastrl.models.checkpoint import save_model
from fastrl.rl.checkpoint import COTRAIN_DIR, DRAFTER_DIR
from fastrl.rl.trainer import GRPOTrainer
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.rollout.cluster import ensure_ray
from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.manager_config import RolloutManagerConfig
from fastrl.rollout.worker_config import RolloutWorkerConfig
from tests.rl.grpo_setup import DigitTask, char_tokenizer, tiny_policy

UPDATES = 3
# Wall-clock times and what derives from them (tokens/s, the estimated speedup), and the rollout-vs-trainer log-prob
# diagnostics.
EXCLUDED = ("time", "tokens_per_s", "speedup", "logprob_")


@pytest.fixture(scope="module")
def local_ray():
    started = ensure_ray(None, min(2, os.cpu_count() or 1))
    yield
    if started:
        ray.shutdown()


def _run(
    root: Path,
    name: str,
    steps: int,
    resume: Path | None = None,
    strategy: str = "5_1_6",
    then: Callable[[GRPOTrainer], None] | None = None,
) -> list[dict]:
    """The run's metrics (but the EXCLUDED ones); ``then`` gets the trainer after its last step, before shutdown."""
    policy = tiny_policy(seed=0)
    save_model(policy, root / f"{name}.served")
    worker = RolloutWorkerConfig(
        model_dir=str(root / f"{name}.served"),
        strategy=strategy,
        bandit={"strategies": ["5_1_6", "3_2_4", "disable"], "bs_thresholds": [1, 4]},
        engine={"dtype": "float64", "max_batch_size": 16},
        num_cpus=0.5,
        slice_seconds=0.02,
        schedule=CotrainSchedule("steps", UPDATES, heldout_fraction=0.25),
        trainer=DrafterTrainerConfig(lr=3e-3, warmup_steps=0, max_tokens_per_batch=128),
    )
    config = GRPOConfig(
        steps=steps,
        prompts_per_step=4,
        samples_per_prompt=2,
        max_new_tokens=16,
        lr=1e-2,
        checkpoint_every=2,
        checkpoint_dir=str(root / name),
        progress=False,
    )
    backend = RayRolloutManager(RolloutManagerConfig(worker=worker, num_workers=2, overlap_drafter_round=True))
    try:
        trainer = GRPOTrainer(policy, char_tokenizer(), DigitTask(), backend, config)
        if resume is not None:
            trainer.resume(resume)
        history = trainer.train()
        if then is not None:
            then(trainer)
    finally:
        backend.shutdown()
    return [{k: v for k, v in dataclasses.asdict(m).items() if not any(e in k for e in EXCLUDED)} for m in history]


def test_identical_runs_and_a_resumed_run_agree(tmp_path, local_ray):
    first = _run(tmp_path, "first", steps=4)
    assert [m["drafter_version"] for m in first] == [1, 2, 3, 4]  # the drafter was co-trained every step
    assert all(m["drafter_steps"] == 2 * UPDATES for m in first)  # the quota, on both workers
    assert all(m["mean_accept_length"] > 1.0 for m in first)
    assert any(m["drafter_heldout_top1"] is not None for m in first)
    assert (tmp_path / "first" / "step_000002" / COTRAIN_DIR / "worker_1.safetensors").is_file()
    second = _run(tmp_path, "second", steps=2)  # an identical run, stopped after its step-2 checkpoint
    assert second == first[:2]
    resumed = _run(tmp_path, "resumed", steps=4, resume=tmp_path / "second" / "step_000002")
    assert resumed == first[2:]


def test_bandit_runs_agree_but_for_accept_lengths(tmp_path, local_ray):
    """The bandit's rewards are timings, so its choices (the rounds per arm, and the accept lengths they give) may
    differ between two identical runs; everything else must not: rollouts are exact, and the drafter's data and
    schedule do not depend on which strategy verified them."""
    first = _run(tmp_path, "first", steps=2, strategy="bandit")
    second = _run(tmp_path, "second", steps=2, strategy="bandit")
    for m in first + second:
        for timing_driven in (
            "mean_accept_length",
            "speculative_accept_length",
            "decode_rows",
            "arm_rounds",
            "strategy_choices",
        ):
            m.pop(timing_driven)
    assert second == first and first[-1]["drafter_steps"] == 2 * UPDATES


def test_a_checkpoint_after_a_rollout_before_its_update_holds_the_last_step_boundary(tmp_path, local_ray):
    """Ctrl-C after step 2's rollout (its drafter round left running, then closed by the save), before its update:
    the checkpoint held that round's merged drafter and its buffer and optimiser moments (on the Ray backend the
    save's own wait for the round pushed the new version), so a resume repeated the round on top of them."""

    def cut(trainer: GRPOTrainer) -> None:
        trainer.config = dataclasses.replace(trainer.config, steps=3)
        trainer.rollout(trainer.step)
        trainer.save_checkpoint(tmp_path / "cut")

    _run(tmp_path, "run", steps=2, then=cut)
    boundary, saved = tmp_path / "run" / "step_000002", tmp_path / "cut"
    for part in (DRAFTER_DIR, COTRAIN_DIR):
        for file in sorted((boundary / part).iterdir()):
            if file.suffix == ".safetensors":
                mine, theirs = load_file(str(saved / part / file.name)), load_file(str(file))
                assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine), file
            elif file.suffix == ".json":
                assert json.loads((saved / part / file.name).read_text()) == json.loads(file.read_text()), file

"""A checkpoint taken while a rollout runs (Ctrl-C between two steps' updates) holds the co-training state of the
last step boundary: none of the running rollout's sequences, drafter updates or optimiser moments, so resuming it
repeats that rollout exactly once. The held-out set is part of the state (a resumed run measures the drafter on
the same features as an uninterrupted one)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from fastrl.cotrain.schedule import CotrainSchedule
from fastrl.models.checkpoint import save_model
from fastrl.rl.trainer import GRPOTrainer
from fastrl.rl.trainer_config import GRPOConfig
from fastrl.rollout.local import LocalRollout
from fastrl.rollout.types import RolloutRequest
from fastrl.rollout.worker_config import RolloutWorkerConfig
from fastrl.sampling.params import SamplingParams
from tests.rl.grpo_setup import DigitTask, char_tokenizer, tiny_policy


def _run(tmp_path, name: str, cotrain: bool = True) -> tuple[GRPOTrainer, LocalRollout]:
    policy = tiny_policy(seed=0)
    save_model(policy, tmp_path / f"{name}.served")
    worker = RolloutWorkerConfig(
        model_dir=str(tmp_path / f"{name}.served"),
        strategy="3_2_6",
        cotrain=cotrain,
        engine={"max_batch_size": 16, "seed": 0},
        schedule=CotrainSchedule(mode="steps", updates_per_rollout=2, heldout_fraction=0.3),
    )
    backend = LocalRollout(worker, seed=0)
    config = GRPOConfig(
        steps=2,
        prompts_per_step=2,
        samples_per_prompt=4,
        max_new_tokens=10,
        lr=1e-2,
        kl_coef=0.0,
        ppo_epochs=1,
        mini_batches=1,
        checkpoint_every=2,
        checkpoint_dir=str(tmp_path / name),
        progress=False,
    )
    return GRPOTrainer(policy, char_tokenizer(), DigitTask(), backend, config), backend


def _files(directory) -> dict:
    tensors = {f.name: load_file(str(f)) for f in sorted(directory.glob("*.safetensors"))}
    metas = {f.name: json.loads(f.read_text()) for f in sorted(directory.glob("*.json"))}
    return {"tensors": tensors, "meta": metas}


def test_a_checkpoint_inside_a_rollout_holds_the_last_step_boundary(tmp_path):
    trainer, backend = _run(tmp_path, "run")
    trainer.train()  # two steps; the checkpoint of step 2 is the boundary
    boundary = _files(tmp_path / "run" / "step_000002" / "cotrain")
    assert boundary["meta"]["worker_0.json"]["heldout"]["sequences"]  # the held-out set is kept
    worker = backend.worker
    steps_before = worker.cotrainer.total_steps
    # step 3's rollout, cut short: its requests finish and a tail slice trains on them; no drafter round closes
    params = [SamplingParams(max_new_tokens=8, temperature=1.0, seed=i) for i in range(6)]
    worker.generate([RolloutRequest(f"3-{i}", [1, 5 + i, 6], p) for i, p in enumerate(params)])
    worker.train_drafter_slice(30.0)
    assert worker.cotrainer.total_steps > steps_before and worker.cotraining.buffer.num_sequences > 0
    cut = _files(trainer.save_checkpoint(tmp_path / "cut") / "cotrain")
    assert cut["meta"] == boundary["meta"]
    for name, tensors in boundary["tensors"].items():
        assert tensors.keys() == cut["tensors"][name].keys()
        assert all(torch.equal(tensors[k], cut["tensors"][name][k]) for k in tensors), name


def test_the_held_out_set_survives_a_resume(tmp_path):
    trainer, backend = _run(tmp_path, "run")
    trainer.train()
    measured = backend.worker.heldout_top1()
    assert measured[0] > 0
    resumed, resumed_backend = _run(tmp_path, "resumed")
    resumed.resume(tmp_path / "run" / "step_000002")
    assert resumed_backend.worker.heldout_top1() == measured


def test_a_run_without_cotraining_resumes_a_cotrained_checkpoint(tmp_path):
    """drafter=frozen over a co-trained run's checkpoint: the co-training state is left unused (it was a Ray
    traceback from inside the worker)."""
    trainer, _ = _run(tmp_path, "run")
    trainer.train()
    frozen, backend = _run(tmp_path, "frozen", cotrain=False)
    frozen.resume(tmp_path / "run" / "step_000002")
    assert frozen.step == 2 and backend.cotrain_state() == []


def test_a_checkpoint_records_the_tasks_settings_and_resume_compares_them(tmp_path):
    import dataclasses

    import pytest

    from fastrl.rl.tasks.task import TaskConfig

    trainer, _ = _run(tmp_path, "run")
    trainer.task.config = TaskConfig(n_max=6)  # the settings a configured task (ArithChainTask) carries
    trainer.train()
    saved = json.loads((tmp_path / "run" / "step_000002" / "trainer_state.json").read_text())
    assert saved["task"] == json.loads(json.dumps(dataclasses.asdict(TaskConfig(n_max=6))))
    other, _ = _run(tmp_path, "other")
    other.task.config = TaskConfig(n_max=5)
    with pytest.raises(
        ValueError, match=r"the task's settings differ from the checkpoint's: \['task.n_max'\] \(task.n_max: "
    ):
        other.resume(tmp_path / "run" / "step_000002")


def test_a_checkpoint_after_a_rollouts_drafter_round_before_its_update_holds_the_last_step_boundary(tmp_path):
    """Ctrl-C after a step's rollout returned (its drafter round merged and installed a new drafter), before the
    step's update: the checkpoint used to hold that round's drafter, buffer and optimiser moments, so the resumed
    run repeated the round on top of them (drafter versions off by one from then on, the rollout's sequences twice
    in the buffer)."""
    trainer, backend = _run(tmp_path, "run")
    trainer.train()  # two steps; the checkpoint of step 2 is the boundary
    boundary = tmp_path / "run" / "step_000002"
    version = backend.drafter_version
    rollout = trainer.rollout(trainer.step)  # step 3's whole rollout, drafter round included
    assert backend.drafter_version == version + 1 and rollout.batch.drafter.steps > 0
    cut = trainer.save_checkpoint(tmp_path / "cut")  # what Ctrl-C saves there
    assert _same(cut / "cotrain", boundary / "cotrain")
    assert _same(cut / "drafter", boundary / "drafter")
    assert json.loads((cut / "drafter" / "drafter_config.json").read_text())["version"] == version


def _same(a, b) -> bool:
    """The checkpoint folders hold equal JSON and bitwise equal tensors."""
    left, right = _files(a), _files(b)
    if left["meta"] != right["meta"] or left["tensors"].keys() != right["tensors"].keys():
        return False
    return all(
        x.keys() == right["tensors"][name].keys() and all(torch.equal(x[k], right["tensors"][name][k]) for k in x)
        for name, x in left["tensors"].items()
    )


class ListLogger:
    """Keeps what the trainer logs."""

    def __init__(self) -> None:
        self.records: list[tuple[int, object]] = []

    def log(self, metrics, step: int) -> None:
        self.records.append((step, metrics))


class _StopWhileLogging:
    """A logger through which a second Ctrl-C arrives while step ``at``'s metrics line is being written."""

    def __init__(self, at: int) -> None:
        self.at, self.steps = at, []

    def log(self, metrics, step: int) -> None:
        if step == self.at:
            raise KeyboardInterrupt("again, inside the step")
        self.steps.append(step)


def test_an_interrupt_before_a_steps_metrics_are_logged_logs_them_before_the_checkpoint(tmp_path):
    """A second Ctrl-C while step 1's metrics were computed: the trainer said it stood between steps after step 1,
    so the interrupt saved checkpoint step_000002 and the resumed run started at step 2, without step 1's line
    anywhere. The interrupt handler now finishes the step first: its metrics are computed and logged."""
    trainer, _ = _run(tmp_path, "run")
    logger = ListLogger()
    trainer.logger = logger
    original = trainer._metrics
    calls = []

    def interrupted_once(*args):
        calls.append(args[0])
        if len(calls) == 2:  # step 1's first computation: Ctrl-C again
            raise KeyboardInterrupt("again, inside the step")
        return original(*args)

    trainer._metrics = interrupted_once
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.step == 2 and [s for s, _ in logger.records] == [0]
    assert trainer.finish_interrupted_step()  # what fastrl train's handler calls before its checkpoint
    assert [s for s, _ in logger.records] == [0, 1] and not trainer.updating
    assert trainer.finish_interrupted_step() and [s for s, _ in logger.records] == [0, 1]  # logged once


def test_an_interrupt_inside_the_logger_leaves_the_step_unfinished(tmp_path):
    """Its line may be written already: it is not written twice, and no checkpoint claims the step."""
    trainer, _ = _run(tmp_path, "run")
    trainer.logger = _StopWhileLogging(at=1)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.logger.steps == [0] and trainer.step == 2
    assert not trainer.finish_interrupted_step() and trainer.logger.steps == [0]

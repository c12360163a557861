"""Resuming from a damaged checkpoint is one clear error naming the file, raised before anything is restored:
corrupt trainer_state.json, a negative step, a missing drafter/, truncated RNG or drafter weights, corrupt
rollout_selector.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fastrl.rl.trainer import GRPOTrainer
from tests.rl.grpo_setup import digit_trainer


def _trainer(directory: Path) -> GRPOTrainer:
    return digit_trainer(
        directory, "2_1_3", steps=1, prompts_per_step=1, samples_per_prompt=2, max_new_tokens=6, checkpoint_every=1
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    _trainer(root / "ckpt").train()
    return root / "ckpt" / "step_000001"


def _damage_json(key: str, value):
    def damage(d: Path) -> None:
        meta = json.loads((d / "trainer_state.json").read_text())
        meta[key] = value
        (d / "trainer_state.json").write_text(json.dumps(meta))

    return damage


def _truncate(name: str):
    def damage(d: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: len(data) // 2])

    return damage


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "trainer_state.json").write_text("{"), r"trainer_state.json is not valid JSON"),
        (_damage_json("step", -5), r"trainer_state.json: 'step' must be an integer >= 0, got -5"),
        (lambda d: shutil.rmtree(d / "drafter"), r"drafter/ is missing, but the run has a drafter"),
        (_truncate("rng.safetensors"), r"rng.safetensors is not a readable safetensors file"),
        (_truncate("drafter/drafter.safetensors"), r"drafter.safetensors is not a readable safetensors file"),
        (_truncate("policy/model.safetensors"), r"model.safetensors is not a readable safetensors file"),
        (lambda d: (d / "rollout_selector.json").write_text("[1"), r"rollout_selector.json is not valid JSON"),
    ],
)
def test_damaged_checkpoint_is_named(saved, tmp_path, damage, message):
    copy = tmp_path / "ckpt"
    shutil.copytree(saved, copy)
    damage(copy)
    trainer = _trainer(tmp_path / "other")
    with pytest.raises(ValueError, match=message):
        trainer.resume(copy)
    assert trainer.step == 0


def test_missing_checkpoint_directory_is_named(tmp_path):
    with pytest.raises(ValueError, match="checkpoint directory .*nowhere does not exist"):
        _trainer(tmp_path / "run").resume(tmp_path / "nowhere")


def test_a_checkpoint_killed_while_written_is_never_the_latest(saved, tmp_path, monkeypatch):
    """A run killed inside save_training_checkpoint leaves ``step_N.tmp`` without its state file (written last), and
    even a ``.tmp`` that has one is never what resuming picks: the last complete checkpoint is."""
    import fastrl.rl.checkpoint as checkpoint
    from fastrl.commands.run_dir import latest_checkpoint

    trainer = _trainer(tmp_path / "ckpt")
    trainer.train()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_cotrain_states", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_checkpoint(tmp_path / "ckpt" / "step_000004")
    partial = tmp_path / "ckpt" / "step_000004.tmp"
    assert partial.is_dir() and not (partial / "trainer_state.json").exists()
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved, run / "checkpoints" / "step_000001")
    shutil.copytree(saved, run / "checkpoints" / "step_000009.tmp")
    assert latest_checkpoint(run) == run / "checkpoints" / "step_000001"

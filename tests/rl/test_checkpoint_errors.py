"""Resuming from a damaged checkpoint is one clear error naming the file, raised before anything is restored:
corrupt trainer_state.json, a negative step, a missing drafter/, truncated RNG or drafter weights, corrupt
rollout_selector.json, a co-training or history file the checkpoint recorded and lacks."""

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
        (
            lambda d: (d / "rollout_selector.json").write_text('{"workers": [{"strategy": "3_1_4"}]}'),
            r"rollout_selector.json: workers\[0\]: state_dict is for strategy '3_1_4'",
        ),
        (
            lambda d: (d / "rollout_selector.json").write_text('{"workers": [{}]}'),
            r"rollout_selector.json: workers\[0\]: KeyError",
        ),
        (
            lambda d: (d / "rollout_selector.json").write_text('{"workers": []}'),
            r"rollout_selector.json: expected \{'workers'",
        ),
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


def _cotrained(directory: Path) -> GRPOTrainer:
    """A run that co-trains its drafter and drafts from history: its checkpoints hold cotrain/ and history/."""
    sizes = dict(steps=1, prompts_per_step=1, samples_per_prompt=2, max_new_tokens=6, checkpoint_every=1)
    return digit_trainer(directory, "2_1_3+suffix_4", cotrain=True, **sizes)


@pytest.fixture(scope="module")
def cotrained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cotrained")
    _cotrained(root / "ckpt").train()
    return root / "ckpt" / "step_000001"


def _remove(name: str):
    return lambda d: shutil.rmtree(d / name) if (d / name).is_dir() else (d / name).unlink()


@pytest.mark.parametrize(
    "name, message",
    [
        ("cotrain/worker_0.json", r"cotrain/worker_0.json is missing \(the checkpoint recorded co-training state"),
        ("cotrain/worker_0.safetensors", r"cotrain/worker_0.safetensors is missing"),
        ("cotrain", r"cotrain is missing \(the checkpoint recorded co-training state for 1 worker slot\)"),
        ("history/worker_0.safetensors", r"history/worker_0.safetensors is missing \(the checkpoint recorded history"),
        ("history", r"history is missing \(the checkpoint recorded history indexes for 1 worker slot\)"),
    ],
)
def test_a_recorded_worker_file_that_is_missing_is_named(cotrained, tmp_path, name, message):
    """Each was resumed with an empty co-training buffer and optimiser or an empty history index, and the drafter
    then left the uninterrupted run's."""
    copy = tmp_path / "ckpt"
    shutil.copytree(cotrained, copy)
    _remove(name)(copy)
    trainer = _cotrained(tmp_path / "other")
    with pytest.raises(ValueError, match=message):
        trainer.resume(copy)
    assert trainer.step == 0 and trainer.backend.worker.cotrainer.total_steps == 0


def test_a_checkpoint_written_before_the_worker_slots_were_recorded_reads_what_it_holds(cotrained, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(cotrained, copy)
    meta = json.loads((copy / "trainer_state.json").read_text())
    assert (meta.pop("cotrain_workers"), meta.pop("history_workers")) == (1, 1)
    (copy / "trainer_state.json").write_text(json.dumps(meta))
    trainer = _cotrained(tmp_path / "kept")
    trainer.resume(copy)
    assert trainer.backend.history_state()[0].num_tokens > 0 and trainer.backend.worker.cotrainer.total_steps > 0
    shutil.rmtree(copy / "cotrain")
    shutil.rmtree(copy / "history")
    trainer = _cotrained(tmp_path / "older")
    trainer.resume(copy)  # as such a checkpoint always loaded: a run without co-training or history state
    assert trainer.step == 1 and trainer.backend.worker.cotrainer.total_steps == 0


def test_the_file_of_a_later_worker_slot_is_named(tmp_path):
    """A Ray run's checkpoint without worker 1's co-training file was refused as if it came from a run of one worker
    (naming rollout.num_workers), and one without worker 1's history index was resumed with an empty index there."""
    import torch

    from fastrl.rl.cotrain_checkpoint import read_cotrain_states, save_cotrain_states
    from fastrl.rl.history_checkpoint import read_history_states, save_history_states
    from fastrl.rollout.worker_cotrain import CotrainState
    from fastrl.speculative.history import HistoryState

    state = CotrainState({"optim.step": torch.zeros(1)}, {"buffer": {}, "trainer": {}})
    assert save_cotrain_states([state, state], tmp_path / "cotrain") == 2
    assert save_history_states([HistoryState([([1, 2], [[3]])])] * 2, tmp_path / "history") == 2
    (tmp_path / "cotrain" / "worker_1.json").unlink()
    (tmp_path / "history" / "worker_1.safetensors").unlink()
    with pytest.raises(ValueError, match=r"cotrain/worker_1.json is missing \(the checkpoint recorded co-training"):
        read_cotrain_states(tmp_path / "cotrain", 2)
    with pytest.raises(ValueError, match=r"history/worker_1.safetensors is missing \(the checkpoint recorded history"):
        read_history_states(tmp_path / "history", 10, 2)
    assert len(read_history_states(tmp_path / "history", 10)) == 1  # unrecorded (older checkpoints): as found


def test_settings_are_recorded_and_compared_key_by_key(tmp_path):
    """The caller's settings that change what the run computes (`fastrl train`'s drafter, strategy, engine dtype):
    another value is refused naming it; a key only one side has (another fastrl version's) and a checkpoint written
    before settings were kept are not compared."""
    run = _trainer(tmp_path / "run")
    run.settings = {"drafter.lr": 0.1, "gone": 1}
    run.train()
    saved = tmp_path / "run" / "step_000001"
    other = _trainer(tmp_path / "other")
    other.settings = {"drafter.lr": 0.2, "new": 2}
    with pytest.raises(ValueError, match=r"differ from the checkpoint's: drafter.lr: 0.1 in the checkpoint, 0.2 now$"):
        other.resume(saved)
    assert other.step == 0
    meta = json.loads((saved / "trainer_state.json").read_text())
    (saved / "trainer_state.json").write_text(json.dumps(meta | {"settings": None}))
    other.resume(saved)
    assert other.step == 1
    other.settings = {"drafter.lr": 0.1, "new": 2}
    (saved / "trainer_state.json").write_text(json.dumps(meta))
    other.resume(saved)


def test_missing_checkpoint_directory_is_named(tmp_path):
    with pytest.raises(ValueError, match="checkpoint directory .*nowhere does not exist"):
        _trainer(tmp_path / "run").resume(tmp_path / "nowhere")


def test_a_checkpoint_killed_while_written_is_never_the_latest(saved, tmp_path, monkeypatch):
    """A save stopped by an exception (Ctrl-C, a full disk) removes its ``step_N.tmp``; one killed outright (SIGKILL)
    leaves it without its state file (written last), and even a ``.tmp`` that has one is never what resuming picks:
    the last complete checkpoint is."""
    import fastrl.rl.checkpoint as checkpoint
    from fastrl.commands.run_dir import latest_checkpoint

    trainer = _trainer(tmp_path / "ckpt")
    trainer.train()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_cotrain_states", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_checkpoint(tmp_path / "ckpt" / "step_000004")
    assert not (tmp_path / "ckpt" / "step_000004.tmp").exists()  # nothing half-written holds the disk's space
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved, run / "checkpoints" / "step_000001")
    killed_dir = run / "checkpoints" / "step_000004.tmp"  # as SIGKILL leaves it: no state file
    shutil.copytree(saved, killed_dir)
    (killed_dir / "trainer_state.json").unlink()
    shutil.copytree(saved, run / "checkpoints" / "step_000009.tmp")
    assert latest_checkpoint(run) == run / "checkpoints" / "step_000001"

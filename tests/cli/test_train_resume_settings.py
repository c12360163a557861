"""`fastrl train resume=` refuses a setting that changes what the run computes (the drafter's co-training, the rollout
engines' dtype, the strategy, ...) with one error naming the key, the checkpoint's value and the new one, and leaves
the run as it was; a setting of speed, telemetry or placement may change. A checkpoint records every such setting
(`result_settings`); each key of the groups is one or the other."""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass

import pytest

from fastrl.cli import main
from fastrl.commands.train_config import TrainConfig
from fastrl.commands.train_setup import CHANGEABLE_ON_RESUME, RESULT_GROUPS, result_settings
from tests.cli.test_train_run_dirs import TINY, _rewards, _steps


@pytest.fixture(scope="module")
def one_step(policy_dir, tmp_path_factory):
    """A finished run of one step (checkpointed), and the same run of two steps uninterrupted."""
    root = tmp_path_factory.mktemp("settings")
    base = ["train", *TINY, f"model={policy_dir}", "rl.checkpoint_every=1", "strategy=static", "strategy.name=2_1_3"]
    assert main([*base, "rl.steps=1", f"hydra.run.dir={root / 'run'}"]) == 0
    assert main([*base, "rl.steps=2", f"hydra.run.dir={root / 'straight'}"]) == 0
    return root


@pytest.mark.parametrize(
    "override, said",
    [
        ("drafter.updates_per_rollout=2", "drafter.updates_per_rollout: 4 in the checkpoint, 2 now"),
        ("drafter.trainer.lr=0.01", "drafter.trainer.lr: 0.001 in the checkpoint, 0.01 now"),
        ("drafter.heldout_fraction=0.3", "drafter.heldout_fraction: 0.1 in the checkpoint, 0.3 now"),
        ("drafter=frozen", 'drafter.cotrain: true in the checkpoint, false now; drafter.path: "fresh" in the'),
        ("rollout.engine.dtype=float32", 'rollout.engine.dtype: "float64" in the checkpoint, "float32" now'),
        ("strategy.name=3_1_4", 'strategy.name: "2_1_3" in the checkpoint, "3_1_4" now'),
        (
            "rl.lr=0.5",
            "GRPOConfig keys differ from the checkpoint's: ['rl.lr'] (rl.lr: 0.001 in the checkpoint, 0.5 now)",
        ),
    ],
)
def test_a_setting_that_changes_the_run_is_refused_naming_it(one_step, tmp_path, capsys, override, said):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(one_step / "run", run)
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert main(["train", f"resume={run}", "rl.steps=2", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fastrl train: error: cannot resume" in err[0] and said in err[0], err
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


def test_speed_and_placement_settings_may_change_and_the_run_goes_on_exactly(one_step, policy_dir, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(one_step / "run", run)
    moved = tmp_path / "moved_policy"  # the model directory moved: the checkpoint holds the policy
    shutil.copytree(policy_dir, moved)
    faster = ["rollout.engine.max_batch_size=3", "rollout.round_timeout_s=30", "drafter.slice_seconds=0.1", "threads=2"]
    faster += [f"model.path={moved}", "rollout.engine.history_tokens=50000"]
    assert main(["train", f"resume={run}", "rl.steps=2", *faster]) == 0
    assert _steps(run) == [0, 1] and _rewards(run) == _rewards(one_step / "straight")
    saved = json.loads((run / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["settings"]
    assert saved["drafter.updates_per_rollout"] == 4 and "rollout.engine.max_batch_size" not in saved


def _keys(prefix: str, node: object) -> list[str]:
    out = []
    for f in fields(node):
        value = getattr(node, f.name)
        out += _keys(f"{prefix}.{f.name}", value) if is_dataclass(value) else [f"{prefix}.{f.name}"]
    return out


def test_every_key_is_recorded_or_changeable_on_resume():
    config = TrainConfig()
    keys = [k for group in RESULT_GROUPS for k in _keys(group, getattr(config, group))]
    recorded = result_settings(config)
    assert set(CHANGEABLE_ON_RESUME) <= set(keys)  # no name misspelled (it would be checked after all)
    assert sorted(recorded) == sorted(k for k in keys if k not in CHANGEABLE_ON_RESUME)
    assert {"drafter.trainer.lr", "rollout.engine.dtype", "strategy.name", "model.name"} <= set(recorded)

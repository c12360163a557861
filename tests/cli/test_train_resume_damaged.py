"""`fastrl train resume=` refuses a checkpoint whose small files are damaged (a truncated rollout_selector.json, one
that is not an object, a missing rng.safetensors) before any rollout engine is built and calibrated, with the
message the checkpoint's load gives, and leaves the checkpoint as it was."""

from __future__ import annotations

import shutil

import pytest

from fastrl.cli import main
from tests.cli.test_train_run_dirs import TINY


@pytest.fixture(scope="module")
def one_step(policy_dir, tmp_path_factory):
    """A finished run of one step, checkpointed."""
    run = tmp_path_factory.mktemp("damaged") / "run"
    args = ["train", *TINY, f"model={policy_dir}", "rl.checkpoint_every=1", "rl.steps=1", f"hydra.run.dir={run}"]
    assert main(args) == 0
    return run


def _truncate(file):
    file.write_bytes(file.read_bytes()[:20])


@pytest.mark.parametrize(
    "name, damage, said",
    [
        ("rollout_selector.json", _truncate, "rollout_selector.json is not valid JSON"),
        ("rollout_selector.json", lambda f: f.write_text("[]"), "rollout_selector.json must hold a JSON object"),
        ("rng.safetensors", lambda f: f.unlink(), "rng.safetensors is missing"),
    ],
)
def test_a_damaged_checkpoint_is_refused_before_any_engine_is_built(
    policy_dir, one_step, tmp_path, monkeypatch, capsys, name, damage, said
):
    checkpoint = tmp_path / "step_000001"
    shutil.copytree(one_step / "checkpoints" / "step_000001", checkpoint)
    damage(checkpoint / name)
    before = {p: p.read_bytes() for p in sorted(checkpoint.rglob("*")) if p.is_file()}

    def built(cfg):
        raise AssertionError("the rollout engines were built before the damaged checkpoint was refused")

    monkeypatch.setattr("fastrl.commands.train.build_backend", built)
    capsys.readouterr()
    args = ["train", *TINY, f"model={policy_dir}", "rl.checkpoint_every=1", "rl.steps=2", f"resume={checkpoint}"]
    assert main([*args, f"hydra.run.dir={tmp_path / 'resumed'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fastrl train: error:" in err[0] and said in err[0], err
    assert {p: p.read_bytes() for p in sorted(checkpoint.rglob("*")) if p.is_file()} == before

"""`fastrl train-drafter` resuming its stream: a stream_dir inside the output resumes by the same command, a resume
naming the same inputs by other spellings (a relative or absolute prompts path, model="" or the bundled model's
path) is the same run, and a resume of other settings names each of them with both values before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastrl.assets_path import bundled_model_dir
from fastrl.cli import main
from fastrl.cotrain.rollout_plan import RolloutPlan
from fastrl.cotrain.stream_trainer import StreamRun

TINY = [
    "num_prompts=4", "eval_prompts=2", "max_new_tokens=12", "shard_requests=2", "epochs=1", "accept_requests=1",
    "accept_batch_size=1", "gen_batch_size=4", "accept_strategies=[3_1_4]",
]  # fmt: skip


@pytest.fixture
def trained(monkeypatch) -> list[int]:
    """The shards each train-drafter run trains on (one list entry per shard, across runs)."""
    shards: list[int] = []
    real = StreamRun.train_shard

    def train_shard(self, state, bar):
        shards.append(state.shard)
        real(self, state, bar)

    monkeypatch.setattr(StreamRun, "train_shard", train_shard)
    return shards


def _interrupted(monkeypatch, args: list[str]) -> None:
    """Run `args`, interrupted (as by Ctrl-C) right after the stream saved its first shard."""
    real = StreamRun.save

    def save(self, state):
        real(self, state)
        raise KeyboardInterrupt

    monkeypatch.setattr(StreamRun, "save", save)
    assert main(["train-drafter", *args]) == 130
    monkeypatch.setattr(StreamRun, "save", real)


def test_an_interrupt_says_where_the_state_is_and_that_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    """It said "interrupted" alone: nothing told a user that the same command continues the run."""
    out = tmp_path / "out"
    _interrupted(monkeypatch, [f"output={out}", *TINY])
    err = capsys.readouterr().err
    said = f"fastrl train-drafter: interrupted; its state after the last whole shard is in {out}.stream"
    assert said in err and "Run the same command again to resume from there." in err
    assert err.count("interrupted") == 1


def test_a_stream_inside_the_output_resumes_by_the_same_command(tmp_path, monkeypatch, capsys, trained):
    """The run's own stream inside its output does not make the output "not empty" (the rerun needed
    overwrite=true); anything else there still does."""
    out = tmp_path / "out"
    args = [f"output={out}", f"stream_dir={out / 'stream'}", *TINY]
    _interrupted(monkeypatch, args)
    assert main(["train-drafter", *args]) == 0, capsys.readouterr().err
    assert trained == [0, 1]  # the rerun resumed at the second shard
    assert (out / "drafter.safetensors").is_file() and (out / "stream" / "resume").is_dir()
    assert main(["train-drafter", *args]) == 2  # finished: the output holds its drafter
    assert f"output={out} is a directory that is not empty" in capsys.readouterr().err

    other = tmp_path / "other"
    args = [f"output={other}", f"stream_dir={other / 'runs' / 'stream'}", *TINY]
    _interrupted(monkeypatch, args)
    (other / "notes.txt").write_text("mine")
    assert main(["train-drafter", *args]) == 2
    assert f"output={other} is a directory that is not empty" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "mine"


def test_the_same_inputs_by_other_spellings_resume_and_other_settings_are_named(tmp_path, monkeypatch, capsys, trained):
    monkeypatch.chdir(tmp_path)
    lines = [json.dumps({"prompt": f"{a}+{a + 1}="}) for a in range(6)]
    Path("p.jsonl").write_text("\n".join(lines) + "\n")
    base = ["output=out", *TINY]
    _interrupted(monkeypatch, [*base, "prompts=p.jsonl", "model="])

    calls: list[int] = []
    real = RolloutPlan.generate
    monkeypatch.setattr(RolloutPlan, "generate", lambda self, *a: calls.append(1) or real(self, *a))
    other = [*base, "prompts=./p.jsonl", "model=", "seed=7", "trainer.lr=0.002", "rollout_dtype=bfloat16"]
    assert main(["train-drafter", *other]) == 2
    err = capsys.readouterr().err
    # the seed splits the prompts file otherwise: other training prompts
    assert "out.stream holds a run with other settings (prompt_ids_sha256, rollout_dtype, seed, trainer.lr)" in err
    assert "rollout_dtype='float32' (now 'bfloat16'), seed=0 (now 7), trainer.lr=0.001 (now 0.002)" in err
    assert calls == [] and trained == [0]  # refused before the held-out rollouts

    respelled = [*base, f"prompts={tmp_path / 'p.jsonl'}", f"model={bundled_model_dir()}"]
    assert main(["train-drafter", *respelled]) == 0, capsys.readouterr().err
    assert trained == [0, 1]  # resumed at the second shard
    assert len(calls) == 2  # the held-out rollouts and the second shard (the first is done)


@pytest.mark.parametrize("change", ["weights", "config"])
def test_a_policy_saved_over_the_same_directory_is_not_resumed(tmp_path, monkeypatch, capsys, trained, change):
    """The stream named its policy by path alone: a checkpoint saved over the same directory (a later RL step, an
    edited config) resumed on the old policy's shards and training, exit 0."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    model = tmp_path / "policy"
    shutil.copytree(bundled_model_dir(), model)
    args = [f"output={tmp_path / 'out'}", f"model={model}", *TINY]
    _interrupted(monkeypatch, args)
    if change == "weights":
        tensors = load_file(str(model / "model.safetensors"))
        name = sorted(tensors)[0]
        tensors[name] = tensors[name] + 1e-3 * torch.ones_like(tensors[name])  # a training step, saved in place
        save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    else:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    assert main(["train-drafter", *args]) == 2
    key, what = ("policy_weights", "weights") if change == "weights" else ("policy_config", "config.json")
    err = capsys.readouterr().err
    assert f"out.stream holds a run with other settings ({key})" in err and f"the model's {what}" in err
    assert trained == [0]

"""Streamed drafter training: the rollout plan's order and seeds, shards kept on disk, and a run interrupted and
resumed ending with exactly the weights of an uninterrupted one; a resume with other settings is refused."""

from __future__ import annotations

import copy

import pytest
import torch

from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.features import policy_features
from fastrl.cotrain.rollout_plan import RolloutPlan, RolloutShards
from fastrl.cotrain.stream_trainer import StreamRun
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import make_hf_model


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama").save_pretrained(path)
    return load_model(path)


def plan() -> RolloutPlan:
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    return RolloutPlan(prompts, [0.0, 1.0], samples=2, max_new_tokens=6, seed=3)


def test_plan_orders_samples_within_temperature_passes():
    p = plan()
    assert len(p) == 12
    requests = [p.request(r) for r in range(len(p))]
    assert [r.prompt_ids for r in requests[:6]] == [[5, 6, 7]] * 2 + [[8, 9]] * 2 + [[10, 11, 12, 13]] * 2
    assert [r.params.temperature for r in requests] == [0.0] * 6 + [1.0] * 6
    assert len({r.params.seed for r in requests}) == 12


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return float(self.calls)


def make_run(policy, directory, drafter: EagleDrafter, held) -> StreamRun:
    trainer = DrafterTrainer(copy.deepcopy(drafter), policy, DrafterTrainerConfig(ttt_steps=2, warmup_steps=1))
    shards = RolloutShards(plan(), shard_size=5, directory=directory)
    return StreamRun(policy, trainer, shards, held, Counter(), 2, 0, 4, "cpu", "test")


def test_resumed_run_equals_uninterrupted_run(policy, tmp_path):
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config)
    held = policy_features(policy, [[5, 6, 7, 20, 21, 22, 23]])
    whole = make_run(policy, tmp_path / "whole", drafter, held)
    end = whole.run({"k": 1})
    assert (end.epoch, end.shard, len(end.epochs)) == (2, 0, 2) and whole.accept_length.calls == 2
    assert sorted(p.name for p in (tmp_path / "whole").glob("shard_*.json")) == [
        f"shard_0000{i}.json" for i in range(3)
    ]

    first = make_run(policy, tmp_path / "split", drafter, held)
    middle = first.run({"k": 1}, stop_after_shards=4)
    assert (middle.epoch, middle.shard, len(middle.epochs)) == (1, 1, 1)
    shard0 = (tmp_path / "split" / "shard_00000.json").read_text()
    second = make_run(policy, tmp_path / "split", drafter, held)  # a restart: fresh objects, the same directory
    resumed = second.run({"k": 1})
    assert (tmp_path / "split" / "shard_00000.json").read_text() == shard0
    assert resumed.steps == end.steps and resumed.tokens == end.tokens and resumed.total_steps == end.total_steps
    a, b = whole.trainer.drafter.state_dict(), second.trainer.drafter.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [e.metrics.loss for e in resumed.epochs] == [e.metrics.loss for e in end.epochs]

    with pytest.raises(ValueError, match="other settings \\(k\\)"):
        make_run(policy, tmp_path / "split", drafter, held).run({"k": 2})

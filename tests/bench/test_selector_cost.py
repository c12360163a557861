"""The selector-cost bench replays a run's rounds through a copy of its bandit taken before the run: the copy makes
the run's choices again (or the replay stops), and it counts the rounds a stretch held."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.factory import build_selector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.bench.selector_cost import record, replay, selector_cost
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter


@pytest.mark.parametrize("decide_every_s", [0.0, 0.05])
def test_the_replay_makes_the_runs_choices_and_counts_held_rounds(decide_every_s):
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    config = BanditConfig(strategies=["5_1_6", "3_1_4", "disable"], calibrate=False, decide_every_s=decide_every_s)
    selector = build_selector("bandit", config)
    engine = Engine(policy, EngineConfig(max_batch_size=1, max_model_len=256), drafter, selector)
    inputs = [GenerateInput([1, 2, 3, 4], SamplingParams(max_new_tokens=40, temperature=1.0, seed=s)) for s in (0, 1)]
    before, rounds = record(engine, inputs)
    assert rounds

    def forward() -> None:
        with torch.no_grad():
            policy(torch.tensor([[1]]), torch.tensor([[4]]))

    row = selector_cost("case", before, rounds, forward, repeats=1)
    assert row.rounds == len(rounds) and row.beside_forwards_us > 0 and row.back_to_back_us > 0
    held = sum(1 for c in engine.selector.telemetry().timeline if c.reason == "held")
    assert row.decisions == len(rounds) - held
    assert held == 0 if decide_every_s == 0 else held > 0
    changed = [dataclasses.replace(rounds[0], strategy=next(a for a in before.strategies if a != rounds[0].strategy))]
    with pytest.raises(RuntimeError, match="round 0: the replay chose"):
        replay(copy.deepcopy(before), changed + rounds[1:], None)

"""The reproducible co-training schedule: a worker's updates do not depend on how they are split into slices, its
buffer does not depend on the order requests finished in, and its state survives a checkpoint round trip."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.cotrain.buffer import FeatureBuffer
from fastrl.cotrain.cotrainer import CoTrainer
from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.cotrain.features import policy_features
from fastrl.cotrain.schedule import CotrainSchedule
from fastrl.models.checkpoint import load_model
from fastrl.rollout.worker_cotrain import CotrainState, WorkerCoTraining
from fastrl.speculative.drafter import EagleDrafter
from tests.helpers import make_hf_model

CONFIG = DrafterTrainerConfig(lr=3e-3, warmup_steps=0, max_tokens_per_batch=64, feature_noise=0.05)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("policy")
    make_hf_model("llama").save_pretrained(path)
    policy = load_model(path)
    torch.manual_seed(0)
    drafter = EagleDrafter(policy.config).eval()
    g = torch.Generator().manual_seed(0)
    seqs = policy_features(policy, [torch.randint(3, 97, (20,), generator=g).tolist() for _ in range(12)])
    return policy, drafter, seqs


def cotraining(policy, seqs, updates: int = 5, order: list[int] | None = None) -> WorkerCoTraining:
    schedule = CotrainSchedule("steps", updates, heldout_fraction=0.25)
    worker = WorkerCoTraining(policy, FeatureBuffer(10_000), CoTrainer(policy, CONFIG), schedule, seed=3)
    for i in order if order is not None else range(len(seqs)):
        worker.add(f"req{i:02d}", seqs[i], [i])  # prompt [i]: every sequence its own prompt
    worker.commit()
    return worker


def run_round(worker: WorkerCoTraining, live: EagleDrafter, slices: list[int]) -> dict:
    """Slices that stop after the given numbers of steps, then the rest of the quota in one go."""
    for n in slices:
        calls = iter(range(10**6))
        worker.train(live, 0, 60.0, lambda n=n, calls=calls: next(calls) >= n, [])
    worker.train(live, 0, 60.0, lambda: False, [])
    return worker.cotrainer.trained().state


def test_updates_do_not_depend_on_slices_or_finish_order(setup):
    policy, live, seqs = setup
    whole = cotraining(policy, seqs)
    state = run_round(whole, live, [])
    assert whole.train(live, 0, 60.0, lambda: False, []).skipped  # the quota is spent
    totals = whole.take_round()
    shuffled = list(range(len(seqs)))
    random.Random(1).shuffle(shuffled)
    split = cotraining(policy, seqs, order=shuffled)
    split_state = run_round(split, live, [2, 0, 1])
    split_totals = split.take_round()
    assert totals.steps == split_totals.steps == 5
    assert totals == split_totals  # loss and top-1 sums included, bit for bit
    assert all(torch.equal(state[k], split_state[k]) for k in state)
    assert whole.heldout_top1(live) == split.heldout_top1(live) and whole.heldout_top1(live)[0] > 0


def test_state_round_trip_continues_exactly(setup):
    policy, live, seqs = setup
    straight = cotraining(policy, seqs, updates=3)
    run_round(straight, live, [])
    straight.take_round()
    straight.cotrainer.prepare(live, 1)  # a new version was published; the optimiser carries on
    saved = straight.state()
    expected = run_round(straight, live, [1])
    resumed = cotraining(policy, [], updates=3)
    resumed.load_state(live, 1, CotrainState({k: v.clone() for k, v in saved.tensors.items()}, saved.meta))
    assert resumed.buffer.num_tokens == straight.buffer.num_tokens
    got = run_round(resumed, live, [])
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_schedule_keys_are_validated():
    with pytest.raises(ValueError, match="drafter.schedule"):
        CotrainSchedule("wallclock")
    with pytest.raises(ValueError, match="drafter.updates_per_rollout"):
        CotrainSchedule("steps", -1)
    with pytest.raises(ValueError, match="drafter.heldout_fraction"):
        CotrainSchedule("steps", 4, 1.0)
    schedule = CotrainSchedule("steps", 4, 0.5)
    held = [schedule.is_heldout([1, 5 + i, 7]) for i in range(200)]
    assert held == [schedule.is_heldout([1, 5 + i, 7]) for i in range(200)] and 60 < sum(held) < 140
    assert CotrainSchedule("time").quota(10**6) is None and schedule.quota(3) == 1

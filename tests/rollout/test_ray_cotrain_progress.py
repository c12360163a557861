"""A co-training round longer than the per-round deadline on real Ray workers: the workers are judged by their
progress (a drafter step started within the deadline), not by one deadline for the whole call, so a round of many
updates is neither cut short nor taken for a hung worker."""

from __future__ import annotations

import math
import time

import pytest
import torch

from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig
from fastrl.cotrain.features import policy_features
from fastrl.cotrain.schedule import CotrainSchedule
from fastrl.models.checkpoint import load_model
from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.manager_config import RolloutManagerConfig
from fastrl.speculative.drafter_checkpoint import load_drafter
from tests.rollout.conftest import assert_same_tokens, mixed_requests, reference, worker_config

DEADLINE_S = 3.0  # generous: the suite runs two pytest workers beside the Ray workers on a 2-core machine
MIN_UPDATES = 800  # ~11 s of updates on a quiet 2-core machine (7 ms each): the round outlasts 2 deadlines there too
TRAINER = DrafterTrainerConfig(max_tokens_per_batch=1024, warmup_steps=0)


def updates_outlasting(checkpoint, seconds: float) -> int:
    """Updates a worker takes longer than `seconds` for on this machine: a drafter step of the workers' settings
    timed here, on this process's threads (a worker has fewer, so its steps take no less), with a factor 2 of
    margin; never below MIN_UPDATES. A fixed count would finish within the deadline on a machine fast enough."""
    policy = load_model(checkpoint.policy)
    trainer = DrafterTrainer(load_drafter(checkpoint.drafter, policy, "cpu")[0].float(), policy, TRAINER)
    g = torch.Generator().manual_seed(0)
    seqs = policy_features(policy, [torch.randint(3, 90, (24,), generator=g).tolist() for _ in range(8)])
    trainer.train_step(seqs)  # the first step allocates the optimiser state
    start = time.perf_counter()
    for _ in range(5):
        trainer.train_step(seqs)
    step_s = (time.perf_counter() - start) / 5
    return max(MIN_UPDATES, math.ceil(2 * seconds / step_s))


@pytest.fixture(scope="module")
def long_rounds(checkpoint, ray_cluster):
    updates = updates_outlasting(checkpoint, 2 * DEADLINE_S)
    schedule = CotrainSchedule(mode="steps", updates_per_rollout=updates, heldout_fraction=0.0)
    config = RolloutManagerConfig(
        worker=worker_config(checkpoint, schedule=schedule, trainer=TRAINER),
        num_workers=2,
        round_timeout_s=DEADLINE_S,
        liveness_interval_s=0.1,
        cotrain_in_tail=False,  # every update in the one finish_drafter_round call
    )
    mgr = RayRolloutManager(config)
    yield mgr, updates
    mgr.shutdown()


def test_a_round_of_many_updates_outlasts_the_deadline_and_no_worker_is_taken_for_hung(long_rounds, checkpoint):
    long_rounds, updates = long_rounds
    long_rounds.generate(mixed_requests(12, prefix="fill"))  # every worker's buffer holds sequences now
    requests = mixed_requests(12, prefix="long-round")
    start = time.monotonic()
    batch = long_rounds.generate(requests)
    elapsed = time.monotonic() - start
    assert elapsed > 2 * DEADLINE_S  # the round outlasted the deadline (else this test shows nothing)
    assert batch.drafter.failures == []
    assert batch.drafter.steps == 2 * updates  # both workers' updates all count
    assert long_rounds.replaced_workers == 0 and not batch.replacements
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))

"""A co-training round longer than the per-round deadline on real Ray workers: the workers are judged by their
progress (a drafter step started within the deadline), not by one deadline for the whole call, so a round of many
updates is neither cut short nor taken for a hung worker."""

from __future__ import annotations

import time

import pytest

from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.cotrain.schedule import CotrainSchedule
from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.manager_config import RolloutManagerConfig
from tests.rollout.conftest import assert_same_tokens, mixed_requests, reference, worker_config

DEADLINE_S = 3.0  # generous: the suite runs two pytest workers beside the Ray workers on a 2-core machine
UPDATES = 800  # ~11 s of updates on a quiet 2-core machine (7 ms each): the round outlasts 2 deadlines there too


@pytest.fixture(scope="module")
def long_rounds(checkpoint, ray_cluster):
    schedule = CotrainSchedule(mode="steps", updates_per_rollout=UPDATES, heldout_fraction=0.0)
    trainer = DrafterTrainerConfig(max_tokens_per_batch=1024, warmup_steps=0)
    config = RolloutManagerConfig(
        worker=worker_config(checkpoint, schedule=schedule, trainer=trainer),
        num_workers=2,
        round_timeout_s=DEADLINE_S,
        liveness_interval_s=0.1,
        cotrain_in_tail=False,  # every update in the one finish_drafter_round call
    )
    mgr = RayRolloutManager(config)
    yield mgr
    mgr.shutdown()


def test_a_round_of_many_updates_outlasts_the_deadline_and_no_worker_is_taken_for_hung(long_rounds, checkpoint):
    long_rounds.generate(mixed_requests(12, prefix="fill"))  # every worker's buffer holds sequences now
    requests = mixed_requests(12, prefix="long-round")
    start = time.monotonic()
    batch = long_rounds.generate(requests)
    elapsed = time.monotonic() - start
    assert elapsed > 2 * DEADLINE_S  # the round outlasted the deadline (else this test shows nothing)
    assert batch.drafter.failures == []
    assert batch.drafter.steps == 2 * UPDATES  # both workers' updates all count
    assert long_rounds.replaced_workers == 0 and not batch.replacements
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))

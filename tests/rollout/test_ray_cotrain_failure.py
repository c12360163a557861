"""Co-training failures on real Ray workers: an idle worker with nothing to learn from skips quietly; a diverging
drafter (a poisoned learning rate) is reported in DrafterTrainingStats.failures, never published, and the
rollouts finish with exact results."""

from __future__ import annotations

import pytest
import torch

from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.rollout.manager import RayRolloutManager
from fastrl.rollout.manager_config import RolloutManagerConfig
from tests.rollout.conftest import assert_same_tokens, mixed_requests, reference, worker_config
from tests.rollout.tail_requests import tail_batch


@pytest.fixture(scope="module")
def poisoned(checkpoint, ray_cluster):
    trainer = DrafterTrainerConfig(warmup_steps=0, max_tokens_per_batch=512)
    trainer.lr = float("inf")  # past the config's own check: every training step then fails
    mgr = RayRolloutManager(RolloutManagerConfig(worker=worker_config(checkpoint, trainer=trainer), num_workers=2))
    yield mgr
    mgr.shutdown()


def test_failing_slices_are_reported_and_rollouts_finish(poisoned, checkpoint):
    # both workers past their first requests (a cold worker under load could finish its one-token requests after the
    # other's long ones, leaving the worker that holds features idle); requests that stop at once give no features
    poisoned.generate(tail_batch(prefix="cold")[16:])
    first = poisoned.generate(tail_batch(prefix="empty"))  # the idle worker's buffer is empty: it skips
    assert first.drafter.failures == [] and first.drafter.steps == 0 and first.drafter_version == 0
    poisoned.generate(mixed_requests(8, prefix="warm"))
    requests = tail_batch(prefix="poison")
    batch = poisoned.generate(requests)
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
    assert batch.drafter.failures and all("FloatingPointError" in f for f in batch.drafter.failures)
    short_worker = batch.results[-1].worker_id
    assert batch.drafter.failures[0].startswith(short_worker)
    assert batch.drafter_version == 0 and {s.drafter_version for s in poisoned.worker_stats()} == {0}
    version, state = poisoned.drafter_state()
    assert version == 0 and all(torch.isfinite(v).all() for v in state.values())

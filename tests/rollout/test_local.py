"""LocalRollout: the in-process backend gives the engine's outputs in order, co-trains after the batch and
publishes a new drafter version; a failing slice is reported and changes nothing else."""

from __future__ import annotations

import torch

from fastrl.cotrain.drafter_trainer import DrafterTrainerConfig
from fastrl.models.checkpoint import load_model
from fastrl.rollout.backend import RolloutBackend
from fastrl.rollout.local import LocalRollout
from tests.rollout.conftest import assert_same_tokens, mixed_requests, reference, worker_config


def test_local_rollout_cotrains_and_publishes(checkpoint):
    backend: RolloutBackend = LocalRollout(worker_config(checkpoint, slice_seconds=0.1))
    requests = mixed_requests(9)
    batch = backend.generate(requests)
    assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
    assert batch.drafter.steps > 0 and batch.drafter.failures == [] and batch.drafter.loss is not None
    assert batch.drafter_version == 1 == backend.drafter_state()[0]
    assert all(r.drafter_version == 0 for r in batch.results)
    assert batch.rounds and batch.workers[0].requests == 9 and batch.workers[0].cotrain_steps == batch.drafter.steps
    state = backend.selector_state()
    backend.load_selector_state(state)
    backend.update_policy(1, load_model(checkpoint.policy_v1).state_dict())
    again = backend.generate(requests)
    assert_same_tokens(again.results, reference(checkpoint.policy_v1, requests))
    assert all(r.policy_version == 1 and r.drafter_version == 1 for r in again.results)
    assert again.drafter_version == 2
    backend.shutdown()


def test_failing_slice_is_reported_and_rollouts_go_on(checkpoint):
    poisoned = DrafterTrainerConfig(warmup_steps=0, max_tokens_per_batch=512)
    poisoned.lr = float("inf")  # past the config's own check: every training step then fails
    backend = LocalRollout(worker_config(checkpoint, trainer=poisoned, slice_seconds=0.1))
    requests = mixed_requests(6)
    for _ in range(2):
        batch = backend.generate(requests)
        assert_same_tokens(batch.results, reference(checkpoint.policy, requests))
        assert len(batch.drafter.failures) == 1 and "local-0" in batch.drafter.failures[0]
        assert batch.drafter.steps == 0 and batch.drafter_version == 0
    version, state = backend.drafter_state()
    assert version == 0 and all(torch.isfinite(v).all() for v in state.values())

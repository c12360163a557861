"""RolloutWorkerConfig / RolloutManagerConfig: bad values raise ValueErrors naming the key."""

from __future__ import annotations

import pytest

from fastrl.rollout.manager_config import RolloutManagerConfig
from fastrl.rollout.worker_config import RolloutWorkerConfig


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"model_dir": ""}, "model_dir"),
        ({"strategy": "9_9"}, "strategy"),
        ({"engine": {"max_batch_size": 0}}, "engine.max_batch_size"),
        ({"engine": {"dtype": "int8"}}, "engine.dtype"),
        ({"engine": {"page_sise": 8}}, "engine.page_sise"),
        ({"engine": 3}, "engine"),
        ({"torch_threads": 0}, "torch_threads"),
        ({"num_cpus": -1}, "num_cpus"),
        ({"buffer_tokens": 1}, "buffer_tokens"),
        ({"retention_versions": -1}, "retention_versions"),
        ({"recency_decay": 1.5}, "recency_decay"),
        ({"slice_seconds": 0}, "slice_seconds"),
        ({"cotrain": "yes"}, "cotrain"),
        ({"trainer": 3}, "trainer"),
    ],
)
def test_worker_config_names_the_bad_key(overrides, key):
    with pytest.raises(ValueError, match=key):
        RolloutWorkerConfig(**{"model_dir": "m", **overrides})


def test_worker_config_accepts_policies_and_trainer_dicts():
    config = RolloutWorkerConfig(model_dir="m", strategy="bandit", bandit={"strategies": ["3_1_4", "disable"]})
    assert config.needs_drafter()
    assert RolloutWorkerConfig(model_dir="m", trainer={"lr": 1e-4}).trainer.lr == 1e-4
    assert not RolloutWorkerConfig(model_dir="m", cotrain=False).needs_drafter()
    engine = RolloutWorkerConfig(model_dir="m", engine={"page_size": 8, "kv_cache_tokens": 512}).engine
    assert (engine.page_size, engine.kv_cache_tokens, engine.max_batch_size) == (8, 512, 64)


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"num_workers": 0}, "num_workers"),
        ({"ray_num_cpus": 0}, "ray_num_cpus"),
        ({"ray_address": None}, "ray_address"),
        ({"worker_start_timeout_s": 0}, "worker_start_timeout_s"),
        ({"restart_failed_workers": 1}, "restart_failed_workers"),
    ],
)
def test_manager_config_names_the_bad_key(overrides, key):
    with pytest.raises(ValueError, match=key):
        RolloutManagerConfig(worker=RolloutWorkerConfig(model_dir="m"), **overrides)

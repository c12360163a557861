"""``FastrlReplica``'s driver checks of verl's sampling keys and of the memory release the replica's mode allows:
one ValueError naming verl's key when the replicas are built, before any server actor (no Ray needed)."""

from __future__ import annotations

import asyncio
import re

import pytest

pytest.importorskip("verl")

from fastrl.integrations.verl.local import FASTRL  # noqa: E402
from tests.integrations.verl_setup import verl_config  # noqa: E402

R = "actor_rollout_ref.rollout."


def _replica(extra: list[str]):
    from fastrl.integrations.verl.replica import FastrlReplica

    config = verl_config(extra)
    rollout, model = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model
    return FastrlReplica(replica_rank=0, config=rollout, model_config=model, gpus_per_node=2)


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [  # each built its replicas, then failed every request (or every validation request) as sampling_params.KEY
        ("temperature", -1, r"temperature must be a finite number >= 0, got -1$"),
        ("top_p", 0, r"top_p must satisfy 0 < top_p <= 1, got 0"),
        ("top_k", 1.5, r"top_k must be an integer .*got 1\.5$"),
        ("calculate_log_probs", "maybe", r"calculate_log_probs must be a bool or a count >= 0, got 'maybe'$"),
        ("val_kwargs.temperature", -1, r"val_kwargs\.temperature must be a finite number >= 0, got -1$"),
        ("val_kwargs.top_p", 1.5, r"val_kwargs\.top_p must satisfy 0 < top_p <= 1, got 1\.5$"),
    ],
)
def test_sampling_values_verl_sends_are_checked_in_the_driver_naming_verls_key(key, value, said):
    with pytest.raises(ValueError, match="^" + re.escape(R) + said):
        _replica([f"{R}{key}={value}"])


def test_valid_sampling_values_and_verls_off_values_build_the_replica():
    _replica([f"{R}top_k=-1", f"{R}temperature=0", f"{R}val_kwargs.top_k=5", f"{R}val_kwargs.temperature=0"])


def test_a_forced_release_verl_never_resumes_is_refused_in_the_driver_before_any_actor(monkeypatch):
    """It was refused only inside the server actor's constructor: the driver got a Ray actor-death error of 15
    lines wrapping the ValueError."""
    from verl.workers.rollout.replica import RolloutMode

    from fastrl.integrations.verl import replica as replica_module

    def no_ray():
        raise AssertionError("launch_servers reached Ray before refusing the options")

    replica = _replica([f"{FASTRL}release_at_sleep=true", f"{R}free_cache_engine=false", f"{FASTRL}cotrain=false"])
    replica.rollout_mode = RolloutMode.HYBRID  # what init_hybrid sets before launch_servers
    monkeypatch.setattr(replica_module.ray, "get_runtime_context", no_ray)
    monkeypatch.setattr(replica, "workers", [])
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.rollout\.custom\.fastrl\.release_at_sleep=true with "
                       r"actor_rollout_ref\.rollout\.free_cache_engine=false in hybrid mode"):  # fmt: skip
        asyncio.run(replica.launch_servers())

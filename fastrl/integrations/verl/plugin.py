"""Registers the fastrl backend with verl when imported.

verl imports this module itself in every process that imports verl: through the ``verl.plugins`` entry point
that fastrl's package metadata declares (``pip install fastrl[verl]``), or through
``VERL_USE_EXTERNAL_MODULES=fastrl.integrations.verl.plugin``. Afterwards ``actor_rollout_ref.rollout.name=fastrl``
resolves to ``FastrlReplica`` (servers) and ``FastrlServerAdapter`` (weight sync in trainer workers).
"""

from __future__ import annotations

NAME = "fastrl"
ADAPTER = "fastrl.integrations.verl.adapter.FastrlServerAdapter"


def _load_replica() -> type:
    from fastrl.integrations.verl.replica import FastrlReplica

    return FastrlReplica


def register() -> None:
    """Add fastrl to verl's replica registry and rollout-class registry (idempotent)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, _load_replica)
    _ROLLOUT_REGISTRY[(NAME, "async")] = ADAPTER


register()

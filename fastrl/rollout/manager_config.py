"""Configuration of the Ray rollout manager."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastrl.rollout.worker_config import RolloutWorkerConfig


@dataclass
class RolloutManagerConfig:
    """How many workers, where Ray runs, and what happens in the tail and on failures.

    worker: every worker's configuration.
    num_workers: rollout worker actors.
    ray_address: join this Ray cluster (``"auto"``, ``host:port``); ``""`` starts a private local Ray.
    ray_num_cpus: CPUs of a local Ray (default: every core); ignored when joining a cluster.
    cotrain_in_tail: give idle workers co-training slices while the tail runs (needs ``worker.cotrain``).
    overlap_drafter_round: ``generate`` returns as soon as the rollout is done, leaving the updates the tail did
        not cover (``steps`` schedule), a tail slice still in its training step, the merge and the push running;
        they finish at the next call (the trainer calls ``finish_rollout`` after its policy update, so they
        overlap it). The same updates either way.
    restart_failed_workers: replace a worker that died (after the rollout it died in; its work is re-run on the
        survivors at once) with a fresh actor brought to the current policy and drafter versions.
    worker_start_timeout_s: how long a worker may take to start (load its models) before it is given up.
    round_timeout_s: the per-round deadline: a worker holding work that finishes no decode round (or does not
        answer a health check or a call) for this long is hung: it is killed, replaced, its requests re-run.
    liveness_interval_s: how often busy workers are health-checked during a rollout.
    seed: seeds requests that bring none (so a re-run request reproduces its tokens on any worker).
    """

    worker: RolloutWorkerConfig
    num_workers: int = 2
    ray_address: str = ""
    ray_num_cpus: int | None = None
    cotrain_in_tail: bool = True
    overlap_drafter_round: bool = False
    restart_failed_workers: bool = True
    worker_start_timeout_s: float = 300.0
    round_timeout_s: float = 120.0
    liveness_interval_s: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.worker, RolloutWorkerConfig):
            raise ValueError(f"rollout.worker must be a RolloutWorkerConfig, got {type(self.worker).__name__}")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"rollout.num_workers must be an integer >= 1, got {self.num_workers!r}")
        if not isinstance(self.ray_address, str):
            raise ValueError(f"rollout.ray_address must be a string ('' = local Ray), got {self.ray_address!r}")
        n = self.ray_num_cpus
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"rollout.ray_num_cpus must be None or an integer >= 1, got {n!r}")
        for key in ("worker_start_timeout_s", "round_timeout_s", "liveness_interval_s"):
            t = getattr(self, key)
            if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf:
                raise ValueError(f"rollout.{key} must be a finite number > 0, got {t!r}")
        for key in ("cotrain_in_tail", "restart_failed_workers", "overlap_drafter_round"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"rollout.{key} must be a bool, got {getattr(self, key)!r}")


def check_fit(num_workers: int, num_cpus: float, num_gpus: float, total: dict[str, float]) -> None:
    """ValueError when ``num_workers`` actors of ``num_cpus`` CPUs and ``num_gpus`` GPUs each ask for more than a
    cluster of ``total`` resources has (Ray would queue them forever)."""
    for resource, per_worker in (("CPU", num_cpus), ("GPU", num_gpus)):
        need, have = num_workers * per_worker, total.get(resource, 0.0)
        if need > have + 1e-9:
            raise ValueError(
                f"rollout.num_workers={num_workers} workers of {per_worker:g} {resource} each need {need:g} "
                f"{resource}s, but this Ray cluster has {have:g} (rollout.ray_num_cpus or the machine's cores): "
                "lower rollout.num_workers"
            )

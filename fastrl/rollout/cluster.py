"""Joining or starting Ray for the rollout workers."""

from __future__ import annotations

import logging
import os

import ray


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Make Ray available to this process; returns True when this call initialised it (the caller then owns
    ``ray.shutdown()``), False when Ray was already initialised here.

    ``address`` given: join that cluster (``"auto"`` or ``host:port``; ``num_cpus`` is the cluster's business).
    Otherwise start a private local Ray (never an existing cluster found through RAY_ADDRESS) with ``num_cpus``
    CPUs (default: every core of this machine; more than ``os.cpu_count()`` is a ValueError), no dashboard, quiet
    logging and ports chosen by Ray.
    """
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, logging_level=logging.WARNING, include_dashboard=False)
        return True
    cores = os.cpu_count() or 1
    if num_cpus is None:
        num_cpus = cores
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1:
        raise ValueError(f"rollout.ray_num_cpus must be an integer >= 1, got {num_cpus!r}")
    if num_cpus > cores:
        raise ValueError(f"rollout.ray_num_cpus={num_cpus} exceeds this machine's {cores} cores")
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=True,
    )
    return True

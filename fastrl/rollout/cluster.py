"""Joining or starting Ray for the rollout workers. A Ray started here listens on 127.0.0.1 only."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import ray
from ray._private import ray_constants, services
from ray._private.authentication.authentication_token_setup import AUTH_MODE_ENV_VAR, _enable_token_auth
from ray._private.utils import detect_fate_sharing_support

LOOPBACK = "127.0.0.1"
# Ray replaces a node IP of 127.0.0.1 by the machine's external address unless "clusters" are off for the process
# (its switch for laptops); with them off, the node IP is 127.0.0.1 and the GCS, raylet, object manager, agents and
# every worker bind their ports to it. Child processes (GCS, raylet, workers) read the same switch from the env.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Make Ray available to this process; returns True when this call initialised it (the caller then owns
    ``ray.shutdown()``), False when Ray was already initialised here.

    ``address`` given: join that cluster (``"auto"`` or ``host:port``; ``num_cpus`` is the cluster's business).
    Otherwise start a private local Ray (never an existing cluster found through RAY_ADDRESS) with ``num_cpus``
    CPUs (default: every core of this machine; more than ``os.cpu_count()`` is a ValueError), bound to 127.0.0.1
    (node IP and every port), no dashboard, no usage reporting, quiet logging and ports chosen by Ray.
    """
    if ray.is_initialized():
        return False
    with _signal_handlers_kept():
        return _start_ray(address, num_cpus)


def shutdown_ray() -> None:
    """``ray.shutdown()``, this process's SIGTERM and SIGINT handlers kept: Ray's shutdown puts the signals' handling
    back to the default under Python's own record of the handler (``signal.getsignal`` still names fastrl's), so a
    SIGTERM after it (a scheduler's, ``timeout``'s, at the end of a run) killed the process outright, before its W&B
    run and report were written."""
    with _signal_handlers_kept():
        ray.shutdown()


@contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Restore this process's SIGTERM and SIGINT handlers after the block: ``ray.init`` installs its own SIGTERM
    handler (``sys.exit``), which skipped fastrl's (a SIGTERM from a scheduler or ``timeout`` then lost the
    interrupted run's checkpoint and message). Outside the main thread, where handlers cannot change, it does
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in kept.items():
            if handler is not None:
                signal.signal(number, handler)


def _start_ray(address: str | None, num_cpus: int | None) -> bool:
    """``ensure_ray``'s start, once it found Ray not initialised."""
    if address:
        _check_reachable(address)
        ray.init(address=address, logging_level=logging.WARNING, include_dashboard=False)
        return True
    cores = os.cpu_count() or 1
    if num_cpus is None:
        num_cpus = cores
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1:
        raise ValueError(f"rollout.ray_num_cpus must be an integer >= 1, got {num_cpus!r}")
    if num_cpus > cores:
        raise ValueError(f"rollout.ray_num_cpus={num_cpus} exceeds this machine's {cores} cores")
    _loopback_only()
    _token_auth_quietly()
    with _node_in_its_own_session():
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=True,
            _node_ip_address=LOOPBACK,
        )
    node_ip = ray.util.get_node_ip_address()
    if node_ip != LOOPBACK:
        shutdown_ray()
        raise RuntimeError(f"the local Ray bound to {node_ip}, not {LOOPBACK}; refusing to run on a public address")
    return True


@contextmanager
def _node_in_its_own_session() -> Iterator[None]:
    """Start the local Ray's node processes (GCS, raylet and, through the raylet, every worker) in sessions of their
    own. A signal to this command's process group (``timeout``, ``kill -TERM -PGID``, a terminal's hangup) reaches
    this process, which finishes its step and saves a checkpoint, and no longer the workers it needs for that (the
    raylet died with it, and the run lost its checkpoint and hung until Ray gave up on its GCS). They still end with
    this process: Ray's kernel fate sharing (a parent-death signal) does not depend on the group. Where the kernel
    has no fate sharing, Ray's reaper cleans up by process group, so the processes stay in this one."""
    if not detect_fate_sharing_support():
        yield
        return
    started = services.ConsolePopen

    class OwnSession(started):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSession
    try:
        yield
    finally:
        services.ConsolePopen = started


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """ValueError naming rollout.ray_address when nothing answers at ``host:port`` within ``timeout_s`` (``ray.init``
    retries an unreachable GCS for minutes, printing only its own connection warnings); "auto" and ray:// addresses
    are Ray's to resolve."""
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ValueError(
            f"rollout.ray_address={address}: no Ray cluster answers there ({err.strerror or err}); start one with "
            "`ray start --head` and give its address, or leave rollout.ray_address out for a local Ray"
        ) from None


def _loopback_only() -> None:
    """Turn off Ray's cluster addressing for this process and the processes it starts (see LOCAL_ONLY_ENV)."""
    os.environ[LOCAL_ONLY_ENV] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def _token_auth_quietly() -> None:
    """Token authentication on for the Ray started here, as Ray does by default for a new local cluster, but set
    explicitly, so Ray does not warn "Token authentication is enabled ... Set RAY_AUTH_MODE=disabled to opt out".

    The token (~/.ray/auth_token, made by Ray when missing) still matters on a loopback-only Ray: other users of
    this machine can reach 127.0.0.1. A RAY_AUTH_MODE the user set is kept as it is.
    """
    if AUTH_MODE_ENV_VAR not in os.environ:
        _enable_token_auth()  # sets RAY_AUTH_MODE=token for this process and its children, refreshes Ray's config

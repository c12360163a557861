"""verl's documented extension point resolves `rollout.name=fastrl` to fastrl's classes in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import get_rollout_replica_class
print(get_rollout_replica_class("fastrl").__name__, get_rollout_class("fastrl", "async").__name__)
"""


def test_verl_use_external_modules_registers_the_fastrl_rollout():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VERL_USE_EXTERNAL_MODULES": "fastrl.integrations.verl.plugin"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["FastrlReplica", "FastrlServerAdapter"]


def test_hybrid_server_takes_the_trainer_workers_device():
    from fastrl.integrations.verl.replica import worker_device

    assert worker_device("3", 0) == "3"
    assert worker_device("0,1,2,3", 2) == "2"  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: all GPUs visible
    assert worker_device("", 0) == ""

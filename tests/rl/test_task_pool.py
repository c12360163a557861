"""A pooled task is a fixed prompt set: draws repeat the pool's problems, reproducibly; 0 keeps fresh problems."""

from __future__ import annotations

import random

import pytest

from fastrl.rl.tasks.config import TaskConfig
from fastrl.rl.tasks.task import ArithChainTask


def test_pool_repeats_a_fixed_set():
    task = ArithChainTask(TaskConfig(pool_size=5, pool_seed=3))
    rng = random.Random(0)
    prompts = [task.sample_problem(rng).prompt for _ in range(200)]
    assert len(set(prompts)) == 5
    again = ArithChainTask(TaskConfig(pool_size=5, pool_seed=3))
    assert {again.sample_problem(random.Random(1)).prompt for _ in range(50)} <= set(prompts)
    other = ArithChainTask(TaskConfig(pool_size=5, pool_seed=4))
    assert {other.sample_problem(random.Random(0)).prompt for _ in range(50)} != set(prompts)


def test_no_pool_draws_fresh_problems():
    task = ArithChainTask(TaskConfig())
    rng = random.Random(0)
    assert len({task.sample_problem(rng).prompt for _ in range(200)}) > 150


def test_negative_pool_is_named():
    with pytest.raises(ValueError, match="pool_size"):
        TaskConfig(pool_size=-1)

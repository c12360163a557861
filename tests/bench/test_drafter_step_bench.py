"""The drafter-step microbenchmark compares like with like: both sides give the same forward, and its routing
column says what the engine does."""

from __future__ import annotations

import pytest

from fastrl.bench.drafter_step import time_case
from fastrl.speculative.cpu_drafter_step import MAX_ROWS, cpu_drafter_step


@pytest.mark.skipif(cpu_drafter_step() is None, reason="no C++ compiler: the kernel cannot be built")
def test_the_bench_times_both_sides_of_the_same_forward():
    for rows, queries in ((2, 1), (MAX_ROWS + 1, 1)):
        torch_us, kernel_us, diff, took = time_case(rows, queries, repeats=1)
        assert torch_us > 0 and kernel_us > 0
        assert diff < 1e-4  # the kernel ran past MAX_ROWS too, and gave PyTorch's forward to rounding
        assert took == (rows * queries <= MAX_ROWS)

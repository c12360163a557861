"""The sampler's uniform bits from the CPU kernel (`fastrl.sampling.cpu_noise`) equal PyTorch's ops bit for bit,
and the pure-Python reference's; `uniform_bits` runs the kernel on a CPU and PyTorch's ops without it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.sampling.cpu_noise import uniform_bits_kernel
from fastrl.sampling.noise import MAX_STREAM, lane_salts, uniform_bits, uniform_bits_torch
from tests.sampling.test_gumbel_noise import _ref_bits

SEEDS = st.integers(0, 2**63 - 1)
POSITIONS = st.one_of(st.integers(0, 10_000), st.integers(0, 2**63 - 1))


@pytest.fixture(scope="module")
def kernel():
    built = uniform_bits_kernel()
    if built is None:
        pytest.skip("no C++ compiler here: the kernel cannot be built (uniform_bits runs PyTorch's ops)")
    return built


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.tuples(SEEDS, POSITIONS), min_size=1, max_size=9),
    vocab=st.integers(1, 3000),
    stream=st.one_of(st.sampled_from([0, 1, 2, MAX_STREAM - 1]), st.integers(0, MAX_STREAM - 1)),
)
def test_the_kernel_gives_the_bits_of_pytorchs_ops(kernel, rows, vocab, stream):
    seeds = torch.tensor([s for s, _ in rows], dtype=torch.int64)
    positions = torch.tensor([p for _, p in rows], dtype=torch.int64)
    got = kernel(seeds, positions, vocab, lane_salts(stream))
    assert got.dtype == torch.int32 and got.shape == (len(rows), vocab)
    assert torch.equal(got, uniform_bits_torch(seeds, positions, vocab, stream))


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, position=POSITIONS, stream=st.integers(0, MAX_STREAM - 1), index=st.integers(0, 600))
def test_the_kernel_gives_the_references_bits(kernel, seed, position, stream, index):
    got = kernel(torch.tensor([seed]), torch.tensor([position]), index + 1, lane_salts(stream))
    assert int(got[0, index]) == _ref_bits(seed, position, index, stream) >> 8


def test_uniform_bits_runs_the_kernel_on_a_cpu_and_pytorchs_ops_without_it(kernel, monkeypatch):
    seeds, positions = torch.tensor([5, 2**62 + 7, 0]), torch.tensor([3, 0, 2**40])
    before = kernel.calls
    with_kernel = uniform_bits(seeds, positions, 257, stream=2)
    assert kernel.calls == before + 1
    monkeypatch.setattr("fastrl.sampling.noise.uniform_bits_kernel", lambda: None)
    assert torch.equal(uniform_bits(seeds, positions, 257, stream=2), with_kernel)
    assert kernel.calls == before + 1


def test_bad_arguments_are_refused_before_the_kernel_runs(kernel):
    before = kernel.calls
    with pytest.raises(ValueError, match="stream must be an integer in"):
        uniform_bits(torch.tensor([1]), torch.tensor([1]), 10, stream=MAX_STREAM)
    with pytest.raises(ValueError, match="vocab_size must be >= 1"):
        uniform_bits(torch.tensor([1]), torch.tensor([1]), 0)
    with pytest.raises(ValueError, match="1-D of equal length"):
        uniform_bits(torch.tensor([1, 2]), torch.tensor([1]), 10)
    assert kernel.calls == before

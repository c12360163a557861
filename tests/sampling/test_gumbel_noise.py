"""Counter-based noise: reference agreement, determinism, sensitivity, distribution and stream independence."""

import math

import pytest
import torch

from fastrl.sampling.goodness_of_fit import chi_square_test
from fastrl.sampling.noise import gumbel_noise, hash_bits, uniform_noise

M32 = 2**32 - 1


def _ref_mix(x: int) -> int:
    # lowbias-style mixer on unbounded Python ints, masked to 32 bits at each step (no overflow possible)
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & M32
    x ^= x >> 12
    x = (x * 0x297A2D39) & M32
    x ^= x >> 15
    return x


def _ref_bits(seed: int, position: int, index: int, stream: int) -> int:
    seed &= 2**64 - 1
    position &= 2**64 - 1
    words = [seed & M32, seed >> 32, position & M32, position >> 32]
    lanes = []
    for salt in (0x9E3779B9, 0x85EBCA6B):
        lane = _ref_mix(words[0] ^ _ref_mix(salt ^ stream))
        for word in words[1:]:
            lane = _ref_mix(lane ^ word)
        lanes.append(lane)
    h = _ref_mix(lanes[0] ^ _ref_mix(index ^ 0xC2B2AE35))
    return _ref_mix((h + lanes[1]) & M32)


CASES = [
    (0, 0),
    (1, 0),
    (0, 1),
    (12345, 678),
    (2**32 - 1, 2**32 - 1),
    (2**32, 2**32),
    (2**62, 17),
    (2**63 - 1, 2**40 + 3),
    (0xDEADBEEFCAFEBABE >> 1, 2**62 + 5),
]


@pytest.mark.parametrize("stream", [0, 1, 2, 2**32 - 1])
def test_matches_pure_python_reference(stream):
    seeds = torch.tensor([s for s, _ in CASES], dtype=torch.int64)
    positions = torch.tensor([p for _, p in CASES], dtype=torch.int64)
    vocab = 7
    bits = hash_bits(seeds, positions, vocab, stream=stream)
    uniforms = uniform_noise(seeds, positions, vocab, stream=stream)
    gumbels = gumbel_noise(seeds, positions, vocab, stream=stream)
    for row, (seed, position) in enumerate(CASES):
        for index in range(vocab):
            expected = _ref_bits(seed, position, index, stream)
            assert int(bits[row, index]) == expected
            u = ((expected >> 8) + 0.5) / 2**24
            assert float(uniforms[row, index]) == u
            g = torch.tensor(-math.log(-math.log(u)), dtype=torch.float64).float()
            assert torch.allclose(gumbels[row, index], g, rtol=1e-6, atol=0)


def test_bits_stay_32_bit_and_no_intermediate_overflow_on_extreme_inputs():
    seeds = torch.tensor([2**63 - 1, 2**63 - 1, 0, 2**62], dtype=torch.int64)
    positions = torch.tensor([2**63 - 1, 0, 2**63 - 1, 2**62], dtype=torch.int64)
    bits = hash_bits(seeds, positions, 1000)
    assert int(bits.min()) >= 0 and int(bits.max()) <= M32
    # spot-check the last column (index 999) against Python integers
    for row in range(4):
        assert int(bits[row, 999]) == _ref_bits(int(seeds[row]), int(positions[row]), 999, 0)


def test_deterministic_and_row_independent():
    seeds = torch.tensor([3, 2**62, 99, 3], dtype=torch.int64)
    positions = torch.tensor([10, 11, 12, 13], dtype=torch.int64)
    a = gumbel_noise(seeds, positions, 50)
    b = gumbel_noise(seeds, positions, 50)
    assert torch.equal(a, b)
    for row in range(4):
        alone = gumbel_noise(seeds[row : row + 1], positions[row : row + 1], 50)
        assert torch.equal(alone[0], a[row])


@pytest.mark.parametrize(
    ("seed_b", "pos_b"),
    [
        (5 ^ 1, 100),  # seed low bit
        (5 ^ 2**40, 100),  # seed high word
        (5 ^ 2**62, 100),  # seed top bit
        (5, 101),  # position low bit
        (5, 100 ^ 2**33),  # position high word
        (5, 100 ^ 2**62),  # position top bit
    ],
)
def test_each_input_bit_changes_the_output(seed_b, pos_b):
    vocab = 256
    a = uniform_noise(torch.tensor([5]), torch.tensor([100]), vocab)
    b = uniform_noise(torch.tensor([seed_b]), torch.tensor([pos_b]), vocab)
    differ = (a != b).float().mean().item()
    assert differ > 0.99
    # and the two rows look unrelated: correlation of an independent pair is ~N(0, 1/sqrt(256))
    corr = torch.corrcoef(torch.stack([a[0], b[0]]))[0, 1].item()
    assert abs(corr) < 0.25


def test_index_changes_the_output():
    u = uniform_noise(torch.tensor([7]), torch.tensor([0]), 4096)
    assert torch.unique(u).numel() > 4096 - 10  # 24-bit values: collisions are rare


def test_stream_changes_the_output():
    seeds, positions = torch.tensor([1, 2]), torch.tensor([3, 4])
    a = uniform_noise(seeds, positions, 64, stream=0)
    b = uniform_noise(seeds, positions, 64, stream=1)
    assert (a != b).float().mean().item() > 0.99


def _uniform_chi_square(values: torch.Tensor, bins: int) -> float:
    counts = torch.histc(values.float(), bins=bins, min=0.0, max=1.0)
    return chi_square_test(counts, torch.full((bins,), 1.0 / bins)).p_value


def test_uniform_over_index_position_seed():
    # across the vocabulary and positions of one seed
    u = uniform_noise(torch.full((400,), 42), torch.arange(400), 500)
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert _uniform_chi_square(u.flatten(), 256) > 1e-3
    assert abs(u.mean().item() - 0.5) < 0.002 and abs(u.var().item() - 1 / 12) < 0.001
    # across seeds at one position and index
    u_seed = uniform_noise(torch.arange(50000), torch.zeros(50000, dtype=torch.int64), 1)
    assert _uniform_chi_square(u_seed.flatten(), 100) > 1e-3
    # across seeds that differ only in their high word, and positions that differ only in their high word
    high = torch.arange(50000, dtype=torch.int64) << 32
    assert _uniform_chi_square(uniform_noise(high, torch.zeros_like(high), 1).flatten(), 100) > 1e-3
    assert _uniform_chi_square(uniform_noise(torch.zeros_like(high), high, 1).flatten(), 100) > 1e-3


def _pair_independence_p_value(a: torch.Tensor, b: torch.Tensor, bins: int = 16) -> float:
    cell = (a * bins).long().clamp(max=bins - 1) * bins + (b * bins).long().clamp(max=bins - 1)
    counts = torch.bincount(cell.flatten(), minlength=bins * bins)
    return chi_square_test(counts, torch.full((bins * bins,), 1.0 / bins**2)).p_value


def test_streams_are_independent():
    seeds = torch.arange(200, dtype=torch.int64)
    positions = torch.arange(200, dtype=torch.int64) * 7
    a = uniform_noise(seeds, positions, 300, stream=0)
    b = uniform_noise(seeds, positions, 300, stream=1)
    c = uniform_noise(seeds, positions, 300, stream=2)
    assert _pair_independence_p_value(a, b) > 1e-3
    assert _pair_independence_p_value(b, c) > 1e-3
    assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()) < 0.01


def test_neighbouring_positions_seeds_and_indices_are_independent():
    positions = torch.arange(60000, dtype=torch.int64)
    u = uniform_noise(torch.full_like(positions, 9), positions, 2)
    assert _pair_independence_p_value(u[:-1, 0], u[1:, 0]) > 1e-3  # position t vs t + 1
    assert _pair_independence_p_value(u[:, 0], u[:, 1]) > 1e-3  # index 0 vs 1
    v = uniform_noise(positions, torch.full_like(positions, 9), 1)
    assert _pair_independence_p_value(v[:-1, 0], v[1:, 0]) > 1e-3  # seed s vs s + 1


def test_gumbel_moments_and_finiteness():
    g = gumbel_noise(torch.tensor([2**62, 1]), torch.tensor([0, 2**62]), 200000)
    assert g.dtype == torch.float32
    assert torch.isfinite(g).all()
    assert abs(g.mean().item() - 0.5772156649) < 0.01
    assert abs(g.var().item() - math.pi**2 / 6) < 0.03


def test_extreme_uniforms_give_finite_gumbels():
    # the largest and smallest representable uniforms map to finite Gumbel values in float32
    u = torch.tensor([0.5 / 2**24, (2**24 - 0.5) / 2**24], dtype=torch.float64)
    g = u.log().neg().log().neg().float()
    assert torch.isfinite(g).all() and g[1] < 20


def test_device_argument_and_input_validation():
    seeds, positions = torch.tensor([1]), torch.tensor([2])
    assert torch.equal(gumbel_noise(seeds, positions, 8, device="cpu"), gumbel_noise(seeds, positions, 8))
    with pytest.raises(ValueError, match="stream"):
        uniform_noise(seeds, positions, 8, stream=-1)
    with pytest.raises(ValueError, match="stream"):
        uniform_noise(seeds, positions, 8, stream=2**32)
    with pytest.raises(ValueError, match="positions"):
        uniform_noise(seeds, torch.tensor([1, 2]), 8)
    with pytest.raises(ValueError, match="vocab_size"):
        uniform_noise(seeds, positions, 0)


@pytest.mark.gpu
def test_cpu_and_cuda_agree():
    seeds = torch.tensor([s for s, _ in CASES] + list(range(100)), dtype=torch.int64)
    positions = torch.tensor([p for _, p in CASES] + list(range(0, 1000, 10)), dtype=torch.int64)
    assert torch.equal(hash_bits(seeds, positions, 5000), hash_bits(seeds, positions, 5000, device="cuda").cpu())
    assert torch.equal(
        uniform_noise(seeds, positions, 5000), uniform_noise(seeds, positions, 5000, device="cuda").cpu()
    )
    cpu = gumbel_noise(seeds, positions, 5000)
    cuda = gumbel_noise(seeds, positions, 5000, device="cuda").cpu()
    assert (cpu != cuda).float().mean().item() < 1e-4
    assert torch.allclose(cpu, cuda, rtol=1e-6, atol=0)

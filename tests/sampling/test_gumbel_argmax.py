"""The lazy Gumbel-argmax picks, bit for bit, the token of the full computation."""

import pytest
import torch

from fastrl.sampling.gumbel_argmax import BOUND_BITS, LAZY_MIN_VOCAB, gumbel_argmax, gumbel_bound_table
from fastrl.sampling.noise import UNIFORM_BITS, gumbel_from_bits, gumbel_noise, uniform_bits
from fastrl.sampling.processing import process_logits
from fastrl.sampling.sampler import SamplingBatch, perturbed_logits, sample


def _full(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    return (x + gumbel_from_bits(bits)).argmax(dim=-1)


def test_bound_table_bounds_every_24_bit_integer():
    everything = torch.arange(2**UNIFORM_BITS, dtype=torch.int32)
    values = gumbel_from_bits(everything)
    bound = gumbel_bound_table()[everything >> (UNIFORM_BITS - BOUND_BITS)]
    assert bool((values <= bound).all())
    # and the bound is tight where it can be: the bucket's largest integer is one ulp under it
    tops = values[(everything & (2 ** (UNIFORM_BITS - BOUND_BITS) - 1)) == 2 ** (UNIFORM_BITS - BOUND_BITS) - 1]
    assert torch.equal(torch.nextafter(tops, torch.full_like(tops, float("inf"))), gumbel_bound_table())


def test_a_value_does_not_depend_on_the_tensor_it_is_computed_in():
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 2**UNIFORM_BITS, (20000,), generator=gen, dtype=torch.int32)
    whole = gumbel_from_bits(bits)
    start = 0
    for size in [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100] * 12:
        assert torch.equal(gumbel_from_bits(bits[start : start + size]), whole[start : start + size])
        start += size
    assert torch.equal(gumbel_from_bits(bits.view(100, 200).t().contiguous()).t(), whole.view(100, 200))


def _rows(kind: str, n: int, v: int, bits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    # [N,V] logits that make the argmax hard
    scale = float(torch.rand(1, generator=gen)) * 8 + 0.01
    x = torch.randn(n, v, generator=gen) * scale
    g = gumbel_from_bits(bits)
    if kind == "integer_ties":
        x = x.round()
    elif kind == "all_equal":  # x + g == 0 exactly everywhere: the first index wins
        x = -g
    elif kind == "near_ties":  # x + g within a few ulps of one value
        x = -g + torch.randint(-2, 3, (n, v), generator=gen).float() * 1e-6
    elif kind == "two_way":  # two entries a hair apart at the top, the rest far below
        x = torch.full((n, v), -50.0)
        cols = torch.randint(0, v, (n, 2), generator=gen)
        top = -g.gather(1, cols)
        x.scatter_(1, cols, top + torch.tensor([0.0, 1e-7]))
    elif kind == "masked":
        x[torch.rand(n, v, generator=gen) < 0.9] = float("-inf")
    elif kind == "all_masked_but_few":
        x[:] = float("-inf")
        x[torch.arange(n), torch.randint(0, v, (n,), generator=gen)] = 0.0
    elif kind == "all_masked":
        x[: n // 2] = float("-inf")
    elif kind == "non_finite":
        x[torch.rand(n, v, generator=gen) < 0.01] = float("nan")
        x[torch.rand(n, v, generator=gen) < 0.01] = float("inf")
    return x


KINDS = ["random", "integer_ties", "all_equal", "near_ties", "two_way", "masked", "all_masked_but_few",
         "all_masked", "non_finite"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_lazy_equals_full_on_adversarial_rows(kind):
    gen = torch.Generator().manual_seed(KINDS.index(kind))
    for _ in range(40):
        n = int(torch.randint(1, 24, (1,), generator=gen))
        v = int(torch.randint(1, 600, (1,), generator=gen))
        seeds = torch.randint(0, 2**63 - 1, (n,), generator=gen)
        positions = torch.randint(0, 2**20, (n,), generator=gen)
        bits = uniform_bits(seeds, positions, v)
        x = _rows(kind, n, v, bits, gen)
        for dtype in (torch.float32, torch.float64):
            assert torch.equal(gumbel_argmax(x.to(dtype), bits), _full(x.to(dtype), bits)), (kind, n, v, dtype)


def test_sample_on_wide_rows_equals_the_perturbed_argmax_with_filters_and_greedy_rows():
    gen = torch.Generator().manual_seed(7)
    v = LAZY_MIN_VOCAB + 123
    n = 24
    temperature = torch.tensor([0.0, 0.3, 1.0, 1.7] * 6)
    top_k = torch.tensor([0, 0, 50, 0, 1, 7] * 4)
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 1.0, 0.99] * 4)
    for trial in range(6):
        seeds = torch.randint(0, 2**63 - 1, (n,), generator=gen)
        batch = SamplingBatch(temperature, top_k, top_p, seeds, all_greedy=False, any_filter=True)
        positions = torch.randint(0, 5000, (n,), generator=gen)
        logits = torch.randn(n, v, generator=gen) * (trial + 1)
        logits[:, ::5] = logits[:, :1]  # ties with the first column
        for dtype in (torch.float32, torch.float64):
            got = sample(logits.to(dtype), batch, positions)
            want = perturbed_logits(logits.to(dtype), batch, positions).argmax(dim=-1)
            assert torch.equal(got.tokens, want)
            processed = process_logits(logits.to(dtype), temperature, top_k, top_p)
            assert torch.equal(got.logprobs, torch.log_softmax(processed, -1).gather(1, want[:, None]).squeeze(1))
            noise = gumbel_noise(seeds, positions, v)
            assert torch.equal(sample(logits.to(dtype), batch, positions, noise).tokens, want)
    # a row gives the same token alone as in the batch
    batched = sample(logits, batch, positions).tokens
    for row in range(n):
        alone = sample(logits[row : row + 1], batch.index(torch.tensor([row])), positions[row : row + 1])
        assert int(alone.tokens[0]) == int(batched[row])


def test_lazy_rejects_mismatched_or_non_cpu_inputs():
    bits = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="gumbel_argmax"):
        gumbel_argmax(torch.zeros(2, 4), bits)
    with pytest.raises(ValueError, match="gumbel_argmax"):
        gumbel_argmax(torch.zeros(3), bits[0])

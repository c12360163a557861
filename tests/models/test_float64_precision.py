"""A float64 model computes in float64 throughout: no step rounds through float32 (the RMSNorm statistics, the
sampler's logit processing). A float32 rounding inside a float64 engine turns a last-bit difference between a plain
row and a verify row (~1e-16) into a float32 ulp (~1e-7) now and then, and that was once seen to change a log-prob
in the exactness fuzz (seed 20491)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.models.layers import RMSNorm
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.processing import process_logits
from fastrl.sampling.sampler import SamplingBatch, sample


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dim=st.integers(1, 300), scale=st.floats(1e-3, 1e3))
def test_rms_norm_of_float64_is_float64_math(seed, dim, scale):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, dim, generator=gen, dtype=torch.float64) * scale
    norm = RMSNorm(dim, 1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(dim, generator=gen, dtype=torch.float64) + 0.5)
        out = norm(x)
    exact = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert out.dtype == torch.float64
    assert torch.allclose(out, exact, rtol=1e-13, atol=0)  # float32 statistics would be ~1e-7 off


def test_rms_norm_of_float32_keeps_float32_statistics():
    x = torch.randn(3, 64)
    norm = RMSNorm(64, 1e-6)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(norm(x), expected, rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    temperature=st.floats(0.05, 2.0),
    top_p=st.floats(0.05, 1.0),
    top_k=st.sampled_from([0, 1, 3, 20]),
)
def test_sampler_keeps_float64_logits_in_float64(seed, temperature, top_p, top_k):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, 50, generator=gen, dtype=torch.float64) * 4
    params = [SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed + i) for i in range(5)]
    batch = SamplingBatch.from_params(params, [p.seed for p in params], torch.device("cpu"))
    processed = process_logits(logits, batch.temperature, batch.top_k, batch.top_p)
    assert processed.dtype == torch.float64
    kept = torch.isfinite(processed)
    scale = batch.temperature.to(torch.float64)[:, None]
    assert torch.equal(processed[kept], (logits / scale)[kept])  # no float32 rounding of the kept entries
    result = sample(logits, batch, torch.arange(5))
    assert result.logprobs.dtype == torch.float64
    # A logit moved by one float64 ulp moves the log-prob by ~1e-16, not by a float32 ulp.
    nudged = sample(torch.nextafter(logits, torch.full_like(logits, float("inf"))), batch, torch.arange(5))
    same = nudged.tokens == result.tokens  # a token may only change at an exact tie of perturbed logits
    assert same.any()
    assert (nudged.logprobs[same] - result.logprobs[same]).abs().max() < 1e-13

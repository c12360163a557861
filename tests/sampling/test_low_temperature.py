"""At a low temperature a float32 row's draw follows the distribution its log-prob reports.

The scaled logits of such a row are large (30 / 1e-5 = 3e6, where a float32 step is 0.25), and adding the Gumbel
noise to them rounded the noise to that step: the ties it made went to the lower index, so two equal logits were
drawn 73/27 at T = 1e-6 while `sample` reported log(0.5) for each. The noise is now added to the row less its
maximum (`sampler.centred`), where float32 keeps its precision. Seeds are fixed, so the counts are deterministic;
the bound is 5 standard errors of a fair binomial draw."""

from __future__ import annotations

import math

import pytest
import torch

from fastrl.sampling.params import SamplingParams
from fastrl.sampling.sampler import SamplingBatch, sample

DRAWS = 200_000


@pytest.mark.parametrize(
    ("logits", "temperature"),
    [
        ([30.0, 30.0], 1e-6),  # an exact tie, at the lowest temperature SamplingParams takes
        ([30.0, 30.0], 1e-5),
        ([30.0, 30.0 - 1e-5], 1e-5),  # one unit apart once scaled
        ([30.0 - 1e-5, 30.0], 1e-5),  # the same, the order swapped (the old bias favoured index 0 either way)
        ([1e6, 1e6], 1.0),  # large logits at T = 1: the same rounding
        ([1e5, 1e5 - 1.0, 1e5 - 0.5], 1.0),
    ],
)
def test_a_float32_draw_follows_its_log_prob(logits, temperature):
    rows = torch.tensor(logits, dtype=torch.float32)[None].expand(DRAWS, len(logits))
    batch = SamplingBatch.from_params([SamplingParams(temperature=temperature)] * DRAWS, list(range(DRAWS)))
    drawn = sample(rows, batch, torch.full((DRAWS,), 11))
    for token in range(len(logits)):
        picked = drawn.tokens == token
        p = float(torch.exp(drawn.logprobs[picked][0].double())) if bool(picked.any()) else 0.0
        reported = torch.log_softmax(rows[0] / temperature, dim=-1)[token].exp().item()
        assert p == pytest.approx(reported, abs=1e-6)  # what the log-prob says (of the float32 scaled row)
        freq = float(picked.double().mean())
        bound = 5 * math.sqrt(max(reported * (1 - reported), 1e-12) / DRAWS)
        assert abs(freq - reported) < bound, (token, freq, reported)

"""process_logits: temperature, top-k, top-p (after top-k), value cutoffs, greedy rows untouched."""

import math

import pytest
import torch

from fastrl.sampling.processing import log_probs, process_logits

NEG_INF = float("-inf")


def _reference_row(logits: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    # a plain-Python statement of the documented rule, row by row
    if temperature == 0:
        return list(logits)
    scaled = [x / temperature for x in logits]
    order = sorted(scaled, reverse=True)
    cutoff = NEG_INF
    if 0 < top_k < len(scaled):
        cutoff = order[top_k - 1]
    kept = [x for x in order if x >= cutoff]
    if top_p < 1:
        top = kept[0]
        weights = [math.exp(x - top) for x in kept]
        total = sum(weights)
        mass, last = 0.0, kept[0]
        for x, w in zip(kept, weights, strict=True):
            if mass >= top_p:
                break
            last = x
            mass += w / total
        cutoff = max(cutoff, last)
    return [x if x >= cutoff else NEG_INF for x in scaled]


def _process(logits, temperature, top_k, top_p):
    n = logits.shape[0]
    return process_logits(
        logits,
        torch.as_tensor(temperature, dtype=torch.float32).expand(n),
        torch.as_tensor(top_k, dtype=torch.int64).expand(n),
        torch.as_tensor(top_p, dtype=torch.float32).expand(n),
    )


def test_matches_reference_on_mixed_rows():
    gen = torch.Generator().manual_seed(0)
    settings = [
        (1.0, 0, 1.0),
        (0.7, 5, 1.0),
        (1.3, 0, 0.9),
        (1.0, 5, 0.8),
        (0.0, 3, 0.5),
        (0.5, 40, 0.3),
        (2.0, 1, 1.0),
    ]
    logits = torch.randn(len(settings), 40, generator=gen) * 3
    temperature = torch.tensor([s[0] for s in settings])
    top_k = torch.tensor([s[1] for s in settings])
    top_p = torch.tensor([s[2] for s in settings])
    out = process_logits(logits, temperature, top_k, top_p)
    assert out.dtype == torch.float32
    for row, (t, k, p) in enumerate(settings):
        expected = torch.tensor(_reference_row(logits[row].tolist(), t, k, p))
        assert torch.equal(torch.isinf(out[row]), torch.isinf(expected)), row
        finite = torch.isfinite(expected)
        assert torch.allclose(out[row][finite], expected[finite], rtol=1e-6, atol=1e-6), row


def test_temperature_scales_and_greedy_rows_are_raw():
    logits = torch.tensor([[1.0, 2.0, -3.0], [1.0, 2.0, -3.0]])
    out = process_logits(logits, torch.tensor([0.5, 0.0]), torch.tensor([2, 2]), torch.tensor([0.1, 0.1]))
    assert torch.equal(out[0], torch.tensor([NEG_INF, 4.0, NEG_INF]))  # top-p 0.1 keeps only the top token
    scaled = process_logits(logits, torch.tensor([0.5, 2.0]), torch.tensor([2, 0]), torch.tensor([1.0, 1.0]))
    assert torch.equal(scaled, torch.tensor([[2.0, 4.0, NEG_INF], [0.5, 1.0, -1.5]]))
    assert torch.equal(out[1], logits[1])  # greedy: no scaling, no filtering


def test_top_k_keeps_ties_at_the_kth_value():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    out = _process(logits, 1.0, 2, 1.0)
    assert torch.isfinite(out[0]).tolist() == [True, False, True, True, False]


def test_top_k_at_least_vocab_is_off():
    logits = torch.randn(2, 6)
    assert torch.equal(_process(logits, 1.0, 6, 1.0), logits)
    assert torch.equal(_process(logits, 1.0, 100, 1.0), logits)


def test_top_p_smallest_set_reaching_the_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert torch.isfinite(_process(logits, 1.0, 0, 0.75)).sum().item() == 2
    assert torch.isfinite(_process(logits, 1.0, 0, 0.85)).sum().item() == 3
    assert torch.isfinite(_process(logits, 1.0, 0, 0.99)).sum().item() == 4
    assert torch.isfinite(_process(logits, 1.0, 0, 0.4)).sum().item() == 1


def test_top_p_always_keeps_the_top_token():
    logits = torch.tensor([[0.0, 0.0, 5.0, 1.0]])
    out = _process(logits, 1.0, 0, 1e-6)
    assert torch.isfinite(out).tolist() == [[False, False, True, False]]


def test_top_p_keeps_the_whole_tie_group_at_the_boundary():
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]])  # probs ~ .58 .21 .21 .08: the cut falls inside the tie
    out = _process(logits, 1.0, 0, 0.7)
    assert torch.isfinite(out).tolist() == [[True, True, True, False]]


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # after top-k 2 the distribution is (4/7, 3/7): mass 4/7 before rank 1 already reaches top_p = 0.5
    assert torch.isfinite(_process(logits, 1.0, 2, 0.5)).sum().item() == 1
    # on the unfiltered distribution 0.4 < 0.5 would have kept two tokens
    assert torch.isfinite(_process(logits, 1.0, 0, 0.5)).sum().item() == 2


def test_permuting_the_vocabulary_permutes_the_output():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randint(-3, 4, (6, 30), generator=gen).float()  # many exact ties
    temperature = torch.tensor([1.0, 0.8, 1.0, 1.2, 1.0, 0.9])
    top_k = torch.tensor([0, 4, 7, 0, 3, 10])
    top_p = torch.tensor([0.6, 1.0, 0.9, 0.3, 0.8, 0.95])
    perm = torch.randperm(30, generator=gen)
    out = process_logits(logits, temperature, top_k, top_p)
    out_perm = process_logits(logits[:, perm], temperature, top_k, top_p)
    assert torch.equal(out[:, perm], out_perm)


def test_skipping_filters_equals_filters_that_are_off():
    logits = torch.randn(3, 20)
    temperature, top_k, top_p = torch.tensor([1.0, 0.5, 0.0]), torch.zeros(3, dtype=torch.int64), torch.ones(3)
    a = process_logits(logits, temperature, top_k, top_p)
    b = process_logits(logits, temperature, top_k, top_p, apply_filters=False)
    assert torch.equal(a, b)


def test_low_precision_and_infinite_inputs():
    logits = torch.tensor([[1.0, NEG_INF, 3.0, 2.0]], dtype=torch.bfloat16)
    out = _process(logits, 1.0, 3, 0.95)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).tolist() == [[True, False, True, True]]
    lp = log_probs(out)
    assert lp.exp().sum().item() == pytest.approx(1.0, abs=1e-6)

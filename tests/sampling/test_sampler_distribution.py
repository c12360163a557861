"""The seed-coupled sampler: exact distribution, masking, greedy, log-probs, batch independence."""

import pytest
import torch

from fastrl.sampling.goodness_of_fit import chi_square_test
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.processing import process_logits
from fastrl.sampling.sampler import SamplingBatch, perturbed_logits, sample

VOCAB = 12
NUM_SAMPLES = 20000


def _logits(seed: int = 0, rows: int = 1, vocab: int = VOCAB) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=gen) * 1.5


def _batch(params: SamplingParams, n: int, seed: int = 1234) -> SamplingBatch:
    return SamplingBatch.from_params([params] * n, [seed] * n)


SETTINGS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7": SamplingParams(temperature=0.7),
    "t1.3": SamplingParams(temperature=1.3),
    "topk5": SamplingParams(top_k=5),
    "topp0.9": SamplingParams(top_p=0.9),
    "topk5_topp0.8_t0.8": SamplingParams(temperature=0.8, top_k=5, top_p=0.8),
}


def _target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    if params.top_k == 0 and params.top_p == 1.0:  # stated independently of process_logits
        return (logits[0].double() / params.temperature).softmax(-1)
    processed = process_logits(
        logits, torch.tensor([params.temperature]), torch.tensor([params.top_k]), torch.tensor([params.top_p])
    )
    return processed.softmax(-1)[0]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_frequencies_over_positions_match_processed_softmax(name):
    params = SETTINGS[name]
    logits = _logits(seed=3).expand(NUM_SAMPLES, VOCAB)
    result = sample(logits, _batch(params, NUM_SAMPLES), torch.arange(NUM_SAMPLES) + 100)
    counts = torch.bincount(result.tokens, minlength=VOCAB)
    probs = _target_probs(logits[:1], params)
    test = chi_square_test(counts, probs)
    assert test.impossible == 0  # masked tokens are never sampled
    assert test.p_value > 1e-3, (name, counts.tolist(), probs.tolist())


def test_frequencies_over_seeds_match_processed_softmax():
    params = SamplingParams(temperature=0.9, top_k=8)
    logits = _logits(seed=4).expand(NUM_SAMPLES, VOCAB)
    batch = SamplingBatch.from_params([params] * NUM_SAMPLES, list(range(NUM_SAMPLES)))
    result = sample(logits, batch, torch.full((NUM_SAMPLES,), 7))
    test = chi_square_test(torch.bincount(result.tokens, minlength=VOCAB), _target_probs(logits[:1], params))
    assert test.impossible == 0 and test.p_value > 1e-3


def test_masked_tokens_are_never_sampled():
    logits = _logits(seed=5, vocab=50).expand(5000, 50)
    for params in (SamplingParams(top_k=3, temperature=2.0), SamplingParams(top_p=0.5, temperature=3.0)):
        allowed = torch.isfinite(
            process_logits(
                logits[:1],
                torch.tensor([params.temperature]),
                torch.tensor([params.top_k]),
                torch.tensor([params.top_p]),
            )[0]
        )
        tokens = sample(logits, _batch(params, 5000), torch.arange(5000)).tokens
        assert allowed[tokens].all()
        assert allowed.sum() < 50 and torch.unique(tokens).numel() == allowed.sum()


def test_greedy_is_argmax_with_first_index_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 2.0, 5.0], [-2.0, -1.0, -3.0, -1.5]])
    batch = SamplingBatch.from_params([SamplingParams(temperature=0.0, top_k=1)] * 3, [1, 2, 3])
    assert batch.all_greedy
    result = sample(logits, batch, torch.tensor([0, 5, 9]))
    assert result.tokens.tolist() == [1, 0, 1]
    assert torch.allclose(result.logprobs, logits.log_softmax(-1)[torch.arange(3), result.tokens])


def test_logprobs_are_log_softmax_of_processed_at_token():
    params_list = [
        SamplingParams(temperature=0.7),
        SamplingParams(top_k=4),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5, top_k=2, top_p=0.9),
    ]
    n = len(params_list)
    logits = _logits(seed=6, rows=n, vocab=30)
    batch = SamplingBatch.from_params(params_list, [11, 12, 13, 14, 15])
    for start in range(0, 400, 40):
        positions = torch.arange(n) + start
        result = sample(logits, batch, positions)
        processed = process_logits(logits, batch.temperature, batch.top_k, batch.top_p)
        expected = processed.log_softmax(-1).gather(1, result.tokens[:, None]).squeeze(1)
        assert result.logprobs.dtype == torch.float32
        assert torch.isfinite(result.logprobs).all()
        assert torch.equal(result.logprobs, expected)
    # the greedy row reports the temperature-1, unfiltered log-prob
    assert torch.allclose(result.logprobs[3], logits[3].log_softmax(-1)[result.tokens[3]])


def test_a_row_is_the_same_alone_or_in_a_mixed_batch():
    params_list = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.6, top_k=5),
        SamplingParams(temperature=1.4, top_p=0.7),
        SamplingParams(temperature=1.0, top_k=3, top_p=0.9),
    ]
    seeds = [7, 7, 2**62 + 1, 0, 99]
    n = len(params_list)
    logits = _logits(seed=7, rows=n, vocab=64) * 2
    changed = 0
    for start in range(0, 200, 20):
        positions = torch.arange(n) * 3 + start
        together = sample(logits, SamplingBatch.from_params(params_list, seeds), positions)
        for row in range(n):
            alone = sample(
                logits[row : row + 1],
                SamplingBatch.from_params([params_list[row]], [seeds[row]]),
                positions[row : row + 1],
            )
            assert alone.tokens[0] == together.tokens[row]
            assert torch.equal(alone.logprobs[0], together.logprobs[row])
        changed += int(together.tokens[0] != together.tokens[1])
    assert changed > 0  # the sampled row is not simply the greedy choice


def test_deterministic_and_seed_dependent():
    logits = _logits(seed=8, vocab=100).expand(500, 100)
    positions = torch.arange(500)
    a = sample(logits, _batch(SamplingParams(), 500, seed=1), positions).tokens
    b = sample(logits, _batch(SamplingParams(), 500, seed=1), positions).tokens
    c = sample(logits, _batch(SamplingParams(), 500, seed=2), positions).tokens
    assert torch.equal(a, b)
    assert (a != c).float().mean().item() > 0.5


def test_index_and_expand_repeat_rows():
    params_list = [SamplingParams(temperature=0.0), SamplingParams(top_k=3), SamplingParams(top_p=0.5)]
    batch = SamplingBatch.from_params(params_list, [5, 6, 7])
    expanded = batch.expand(torch.tensor([2, 0, 3]))
    assert len(expanded) == 5
    assert expanded.seeds.tolist() == [5, 5, 7, 7, 7]
    assert expanded.top_k.tolist() == [0, 0, 0, 0, 0] and expanded.top_p.tolist() == [1.0, 1.0, 0.5, 0.5, 0.5]
    same = batch.expand(torch.tensor([2, 0, 3]), total=5)
    assert torch.equal(same.seeds, expanded.seeds)
    indexed = batch.index(torch.tensor([2, 2, 0]))
    assert indexed.seeds.tolist() == [7, 7, 5] and indexed.temperature.tolist() == [1.0, 1.0, 0.0]
    # tree nodes of one request at different positions sample as that request would at those positions
    logits = _logits(seed=9, rows=3, vocab=20)
    positions = torch.tensor([40, 41, 42])
    tree = sample(logits, indexed, positions)
    for node in range(3):
        own = sample(logits[node : node + 1], batch.index(torch.tensor([[2, 2, 0][node]])), positions[node : node + 1])
        assert own.tokens[0] == tree.tokens[node]


def test_perturbed_logits_argmax_is_the_sample_and_topk_is_sampling_without_replacement():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]]).expand(NUM_SAMPLES, 5)
    batch = _batch(SamplingParams(), NUM_SAMPLES)
    positions = torch.arange(NUM_SAMPLES)
    perturbed = perturbed_logits(logits, batch, positions)
    assert torch.equal(perturbed.argmax(-1), sample(logits, batch, positions).tokens)
    first, second = perturbed.topk(2, dim=-1).indices.unbind(-1)
    p = logits[0].softmax(-1)
    pair_probs = (p[:, None] * p[None, :] / (1 - p[:, None])).fill_diagonal_(0.0)
    test = chi_square_test(torch.bincount(first * 5 + second, minlength=25), pair_probs.flatten())
    assert test.impossible == 0 and test.p_value > 1e-3


def test_greedy_batch_with_bf16_logits_and_shape_checks():
    logits = _logits(seed=10, rows=4, vocab=16).to(torch.bfloat16)
    batch = SamplingBatch.from_params([SamplingParams(temperature=0.0)] * 4, [0, 1, 2, 3])
    result = sample(logits, batch, torch.arange(4))
    assert torch.equal(result.tokens, logits.float().argmax(-1))
    with pytest.raises(ValueError, match="positions"):
        sample(logits, batch, torch.arange(3))
    with pytest.raises(ValueError, match="seeds"):
        SamplingBatch.from_params([SamplingParams()], [1, 2])
    with pytest.raises(ValueError, match="seeds"):
        SamplingBatch.from_params([SamplingParams()], [-1])

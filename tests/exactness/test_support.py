"""The filter's support up to rounding: every rounding within the slack keeps a set between the certain and the
possible prefix (randomised, with ties made on purpose at both filters' edges); a token past the top-p edge by less
than rounding is a near-tie when its noise wins, a bug when the bound is tighter; equal tokens whose log-probs differ
by what that edge moves are a near-tie, by more a bug."""

from __future__ import annotations

import itertools
import random

import torch

from fastrl.engine.engine import GenerateInput
from fastrl.engine.request import FinishReason, RequestOutput, Timings
from fastrl.exactness.compare import compare_runs
from fastrl.exactness.mismatch import analyse_mismatch
from fastrl.exactness.support import support_range
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.processing import process_logits
from fastrl.sampling.sampler import SamplingBatch, perturbed_logits, sampling_noise
from tests.rl.grpo_setup import tiny_policy


def _kept(values: torch.Tensor, top_k: int, top_p: float) -> set[int]:
    out = process_logits(values[None], torch.ones(1, dtype=values.dtype), torch.tensor([top_k]), torch.tensor([top_p]))
    return set(torch.nonzero(out[0] > float("-inf")).flatten().tolist())


def test_every_rounding_keeps_a_set_between_the_certain_and_the_possible_prefix():
    rng = random.Random(0)
    widened = narrowed = 0
    for case in range(300):
        vocab = rng.choice([2, 3, 8, 40])
        values = torch.tensor([rng.gauss(0, 2) for _ in range(vocab)], dtype=torch.float64)
        slack = rng.choice([1e-6, 1e-3, 0.05, 0.3])
        top_k = rng.choice([0, 1, 2, 3, vocab - 1, vocab])
        top_p = rng.choice([1.0, 0.3, 0.8, 0.95])
        ordered = values.sort(descending=True).values
        if case % 3 == 0 and 0 < top_k < vocab:  # the (k+1)-th logit just under the k-th
            values[values == ordered[top_k]] = float(ordered[top_k - 1]) - slack * rng.random()
        edge = support_range(values, top_k, top_p, slack)
        assert 0 <= edge.certain <= edge.possible <= vocab and edge.possible >= 1
        certain = set(edge.order[: edge.certain].tolist())
        possible = set(edge.order[: edge.possible].tolist())
        assert certain <= _kept(values, top_k, top_p) <= possible
        for trial in range(12):
            if trial % 4 == 3 and 0 < top_k < vocab:  # ties every logit within reach of the k-th one with it
                kth = float(values.sort(descending=True).values[top_k - 1])
                near = (values >= kth - 2 * slack) & (values <= kth)
                moved = torch.where(near, torch.full_like(values, kth - slack), values - slack)
            else:
                moved = values + slack * (2 * torch.rand(vocab, dtype=torch.float64) - 1)
            kept = _kept(moved, top_k, top_p)
            assert certain <= kept <= possible, (case, trial)
            widened += len(kept) > len(_kept(values, top_k, top_p))
            narrowed += len(kept) < len(_kept(values, top_k, top_p))
    assert widened and narrowed  # roundings moved the edge both ways


def test_no_slack_is_the_filter_itself():
    rng = random.Random(1)
    for _ in range(100):
        values = torch.tensor([rng.gauss(0, 3) for _ in range(30)], dtype=torch.float64)
        top_k, top_p = rng.choice([0, 5, 29]), rng.choice([1.0, 0.5, 0.9])
        edge = support_range(values, top_k, top_p, 0.0)
        assert edge.certain == edge.possible == len(_kept(values, top_k, top_p))


def _edge_case(policy, prompt, seed):
    """top_p just below the nucleus mass before the third token: the fresh forward removes it by ~1e-7."""
    context = torch.tensor([prompt])
    logits = policy(context, torch.arange(len(prompt)).unsqueeze(0)).logits[:, -1]
    probs = torch.softmax(logits[0].float(), dim=-1)
    ranked = torch.argsort(probs, descending=True)
    third = int(ranked[2])
    top_p = float(probs[ranked[:2]].sum()) - 1e-7
    params = SamplingParams(temperature=1.0, top_p=top_p)
    batch = SamplingBatch.from_params([params], [seed])
    position = torch.tensor([len(prompt)])
    assert perturbed_logits(logits, batch, position)[0, third] == float("-inf")
    noisy = (logits.float() + sampling_noise(batch, position, logits.shape[-1]))[0]
    return params, third, ranked, noisy, logits


@torch.inference_mode()
def test_a_token_past_the_top_p_edge_by_less_than_rounding_is_a_near_tie():
    policy = tiny_policy(seed=3)
    prompt = [1, 5, 9, 4]
    found = 0
    for seed in range(300):
        params, third, ranked, noisy, logits = _edge_case(policy, prompt, seed)
        if not noisy[third] > noisy[ranked[:2]].max():
            continue  # the third token's noise would not win where it is kept
        found += 1
        batch = SamplingBatch.from_params([params], [seed])
        plain_token = int(perturbed_logits(logits, batch, torch.tensor([len(prompt)]))[0].argmax())
        tie = analyse_mismatch(policy, prompt, [plain_token], [third], params, seed, bound=1e-3)
        assert tie is not None and tie.near_tie and tie.spec_prob == 0.0 and tie.gap == 0.0
        tight = analyse_mismatch(policy, prompt, [plain_token], [third], params, seed, bound=1e-9)
        assert tight is not None and tight.kind == "bug" and tight.gap == float("inf")
        far = int(ranked[-1])  # the least likely token: no rounding keeps it
        assert analyse_mismatch(policy, prompt, [plain_token], [far], params, seed, bound=1e-3).kind == "bug"
    assert found >= 3


@torch.inference_mode()
def test_equal_tokens_whose_log_probs_differ_by_the_edge_are_a_near_tie():
    policy = tiny_policy(seed=3)
    prompt = [1, 5, 9, 4]
    params, third, ranked, _, logits = _edge_case(policy, prompt, 0)
    top = int(ranked[0])
    two = torch.log_softmax(logits[0, ranked[:2]].double(), dim=0)[0]
    three = torch.log_softmax(logits[0, ranked[:3]].double(), dim=0)[0]
    moved = float(two - three)  # how far the third token in or out moves the top token's log-prob
    assert moved > 0.01

    def output(logprob: float) -> RequestOutput:
        done = FinishReason.LENGTH
        return RequestOutput("r", prompt, [top], [logprob], done, None, 0, [1], [], None, None, Timings())

    def judged(difference: float, request_params: SamplingParams):
        inputs = [GenerateInput(prompt, request_params)]
        return compare_runs(policy, inputs, [output(float(two))], [output(float(two) - difference)]).items[0]

    tie = judged(moved, params)
    assert tie.logprob_tie and tie.near_tie and not tie.is_bug()
    beyond = judged(moved + 0.01, params)
    assert not beyond.logprob_tie and beyond.is_bug()
    unfiltered = judged(moved, SamplingParams(temperature=1.0))  # no filter: nothing moves an edge
    assert not unfiltered.logprob_tie and unfiltered.is_bug()
    report = compare_runs(policy, [GenerateInput(prompt, params)], [output(float(two))], [output(float(two) - moved)])
    assert (report.identical, report.near_ties, len(report.bugs)) == (0, 1, 0)
    assert report.to_dict()["items"][0]["logprob_tie"] is True


@torch.inference_mode()
def test_top_k_one_between_two_logits_a_rounding_apart_is_a_near_tie():
    """Two LM-head rows a hair apart put two logits ~1e-6 apart at the top: under top_k=1 a forward of another shape
    can keep either, so the other token is a near-tie at float32's bound, and a bug at a bound below their gap."""
    policy = tiny_policy(seed=5)
    prompt = [1, 5, 9, 4]
    context = (torch.tensor([prompt]), torch.arange(len(prompt)).unsqueeze(0))
    top = int(policy(*context).logits[0, -1].argmax())
    twin = (top + 1) % policy.config.vocab_size
    policy.lm_head.weight[twin] = policy.lm_head.weight[top] * (1 + 1e-6)
    logits = policy(*context).logits[0, -1].double()
    first, second = (top, twin) if logits[top] > logits[twin] else (twin, top)
    gap = float(logits[first] - logits[second])
    assert 0 < gap < 1e-4
    params = SamplingParams(temperature=1.0, top_k=1)
    for seed in range(5):
        tie = analyse_mismatch(policy, prompt, [first], [second], params, seed, bound=1e-3)
        assert tie is not None and tie.near_tie and tie.spec_prob == 0.0
        tight = analyse_mismatch(policy, prompt, [first], [second], params, seed, bound=gap / 4)
        assert tight is not None and tight.kind == "bug"


def _adversarial_roundings(values: torch.Tensor, slack: float) -> torch.Tensor:
    """Every rounding of a small vocabulary's logits that moves each by -slack, 0 or +slack, or onto a point where it
    ties another logit moved by +-slack (ties are where both filters' edges turn).  # [V] -> [R, V]"""
    anchors = sorted({float(v) + d for v in values for d in (-slack, slack)})
    choices = []
    for v in values.tolist():
        points = {v - slack, v, v + slack} | {min(max(a, v - slack), v + slack) for a in anchors}
        choices.append(sorted(points))
    return torch.tensor(list(itertools.product(*choices)), dtype=torch.float64)


def test_the_prefixes_hold_against_every_adversarial_rounding_of_small_vocabularies():
    """No rounding keeps a token beyond the possible prefix or drops one of the certain prefix (a token called
    impossible that rounding keeps would be a false bug; one called certain that rounding drops would make its
    rivals' gaps too strict); and the possible prefix is that tight but in rare cases where both filters' edges
    are within rounding at once (the widest top-k set is taken for the normaliser whatever the k-th token does)."""
    rng = random.Random(7)
    wide = 0
    for _ in range(300):
        vocab = rng.choice([2, 3, 4])
        slack = rng.choice([0.05, 0.3])
        values = [rng.gauss(0, 1) for _ in range(vocab)]
        if rng.random() < 0.5:  # near ties
            values[rng.randrange(vocab)] = values[rng.randrange(vocab)] - rng.uniform(0, 3 * slack)
        logits = torch.tensor(values, dtype=torch.float64)
        top_k, top_p = rng.choice([0, 1, 2, 3]), rng.choice([1.0, 0.3, 0.5, 0.7, 0.9])
        edge = support_range(logits, top_k, top_p, slack)
        rows = _adversarial_roundings(logits, slack)
        n = rows.shape[0]
        kept = process_logits(rows, torch.ones(n, dtype=rows.dtype), torch.full((n,), top_k), torch.full((n,), top_p))
        kept = kept > float("-inf")  # [R, V]
        possible = torch.zeros(vocab, dtype=torch.bool)
        possible[edge.order[: edge.possible]] = True
        certain = torch.zeros(vocab, dtype=torch.bool)
        certain[edge.order[: edge.certain]] = True
        assert not (kept.any(0) & ~possible).any(), (values, top_k, top_p, slack)
        assert not (certain & ~kept.all(0)).any(), (values, top_k, top_p, slack)
        wide += bool((possible & ~kept.any(0)).any())
    assert wide <= 3


def test_a_token_that_stays_above_is_a_rival_even_when_not_certain():
    """Under top_p=0.9 with bfloat16's slack, the second token (p=0.06) is not certain, but it lies more than a
    rounding above the third (p=0.03): every rounding that keeps the third keeps it, so the third is judged against
    it (its noise beating the third's by more than the bound makes the third impossible, not a near-tie)."""
    probs = torch.full((300,), 0.06 / 297, dtype=torch.float64)
    probs[:3] = torch.tensor([0.85, 0.06, 0.03], dtype=torch.float64)
    edge = support_range(probs.log(), 0, 0.9, 0.25)
    assert edge.certain == 1 and edge.is_possible(1) and edge.is_possible(2)
    assert set(edge.rivals(2).tolist()) == {0, 1}
    assert set(edge.rivals(1).tolist()) == {0}

"""Chains with a confidence stop (`S_1_N@P`): the same tokens as plain decoding whatever the stop, and the rule
itself (a round's chain ends at the first level where the rows' mean probability that their chain so far is right,
the product of their drafts' probabilities, is below P)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

import fastrl.speculative.draft_chain as draft_chain
from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.sampling.params import SamplingParams
from fastrl.strategy.strategy import Strategy
from tests.speculative.exactness_cases import make_case, models, run_case


def _stop_chain(rng: random.Random) -> Strategy:
    """A chain of 1-8 drafts with a stop drawn log-uniformly in [1e-3, 0.95] (random drafters give ~1/V to
    their picks, trained ones up to ~1), sometimes with a history part."""
    steps = rng.randint(1, 8)
    stop = math.exp(rng.uniform(math.log(1e-3), math.log(0.95)))
    history = rng.choice([0, 0, rng.randint(2, 16)])
    return Strategy(steps, 1, steps + 1, history, stop)


@pytest.mark.parametrize("seed", range(31000, 31012))
def test_chain_stop_matches_plain(seed):
    """Seeded cases of every model family (float64 engines, arrivals, mixed sampling, reduced draft vocabularies,
    fused drafters as `make_case` draws them) with the strategy replaced by a stopping chain."""
    case = make_case(seed, max_new_tokens=40)
    case = dataclasses.replace(case, strategy=_stop_chain(random.Random(seed)), switch_space=())
    report = run_case(case)
    assert report.identical == len(report.items), f"{case.describe()}: {report.to_dict()['items'][:2]}"


def _spy_levels(monkeypatch) -> list[torch.Tensor]:
    """Every draft log-prob row the stopping chains compute, in order (the real `sample`, observed)."""
    seen: list[torch.Tensor] = []
    real = draft_chain.sample

    def spy(*args, **kwargs):
        drawn = real(*args, **kwargs)
        seen.append(drawn.logprobs.clone())
        return drawn

    monkeypatch.setattr(draft_chain, "sample", spy)
    return seen


@pytest.mark.parametrize(("stop", "temperature", "batch"), [(0.3, 1.0, 3), (0.2, 0.0, 2), (0.5, 0.8, 1)])
def test_chain_stops_where_every_row_is_unsure(monkeypatch, stop, temperature, batch):
    """Replays the rule on the log-probs the rounds drew: each round's chain has exactly the length the rule gives
    (the first level where the rows' mean chain probability is below the stop, that level's token included), its
    stats say so, and the runs stop early in some rounds and run the full chain in others."""
    policy, drafter = models("bundled")
    strategy = Strategy(6, 1, 7, stop_below=stop)
    seen = _spy_levels(monkeypatch)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 91) for _ in range(rng.randint(4, 12))] for _ in range(batch)]
    params = [SamplingParams(max_new_tokens=60, temperature=temperature, seed=i, ignore_eos=True) for i in range(batch)]
    config = EngineConfig(max_batch_size=batch, dtype="float64")
    engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(strategy))
    engine.generate([GenerateInput(p, sp) for p, sp in zip(prompts, params, strict=True)])
    lengths = []
    cursor = 0
    for stats in engine.round_stats:
        if not stats.strategy.uses_drafter:
            continue
        chain_logprob = torch.zeros(stats.batch_size, dtype=torch.float64)
        drafted = 0
        while drafted < strategy.steps:
            chain_logprob += seen[cursor]
            cursor += 1
            drafted += 1
            if float(chain_logprob.exp().mean()) < stop:
                break
        assert stats.drafted_tokens == [drafted] * stats.batch_size
        assert all(a <= drafted for a in stats.accepted_tokens)
        lengths.append(drafted)
    assert cursor == len(seen), "every level the chains drew belongs to a round"
    assert min(lengths) < strategy.steps and max(lengths) == strategy.steps, lengths


def test_tiny_stop_drafts_the_whole_chain_when_greedy():
    """A greedy drafter's pick has probability >= 1/V, so a 5-token chain is right with probability >= V**-5: a stop
    below that never ends it early."""
    policy, drafter = models("bundled")
    strategy = Strategy(5, 1, 6, stop_below=0.5 * policy.config.vocab_size**-5)
    engine = Engine(
        policy, EngineConfig(max_batch_size=2, dtype="float64"), drafter=drafter, selector=FixedSelector(strategy)
    )
    params = SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True)
    engine.generate([GenerateInput([5, 6, 7, 8], params), GenerateInput([9, 10, 11], params)])
    rounds = [s for s in engine.round_stats if s.strategy.uses_drafter]
    assert rounds and all(s.drafted_tokens == [5] * s.batch_size for s in rounds)


def test_a_row_whose_drafter_is_not_finite_is_sure_of_nothing(monkeypatch):
    """A NaN in one row's drafter output made the batch's mean confidence NaN, and `NaN < P` never stops: every round
    drafted the whole chain (12 levels against 5.5). That row now counts as unsure, the others' confidence still
    stops the chain, and the tokens stay plain decoding's."""
    import copy

    policy, drafter = models("bundled")
    drafter = copy.deepcopy(drafter)

    def nan_row(module, args, out):
        out = out.clone()
        out[0] = float("nan")
        return out

    drafter.layer.register_forward_hook(nan_row)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 91) for _ in range(rng.randint(4, 12))] for _ in range(3)]
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=40, temperature=0.0, seed=i, ignore_eos=True))
        for i, p in enumerate(prompts)
    ]
    config = EngineConfig(max_batch_size=3, dtype="float64", attention_kernel=False)  # the drafter in PyTorch
    engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(Strategy(12, 1, 13, stop_below=0.5)))
    tokens = [o.token_ids for o in engine.generate(inputs)]
    plain = Engine(policy, config).generate(inputs)
    assert tokens == [o.token_ids for o in plain]
    drafted = [s.drafted_tokens[0] for s in engine.round_stats if s.strategy.uses_drafter]
    assert min(drafted) < 12, drafted

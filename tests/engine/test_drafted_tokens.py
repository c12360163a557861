"""Each request counts the draft tokens its decode rounds proposed to it (`RequestOutput.drafted_tokens`, what the
verl backend reports as `spec_num_draft_tokens`): the rounds' own counts, whichever strategy each round ran and
however early a request finished."""

from __future__ import annotations

import random

import pytest

from fastrl.adaptive.factory import build_selector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.round_stats import RoundTotals
from fastrl.strategy.strategy import Strategy


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir()).eval()
    return policy, load_drafter(bundled_drafter_dir(), policy)[0]


def _inputs(seed: int, count: int) -> list[GenerateInput]:
    rng = random.Random(seed)
    return [
        GenerateInput(
            [1, *(rng.randrange(3, 40) for _ in range(rng.randint(2, 12)))],
            SamplingParams(max_new_tokens=rng.randint(1, 40), temperature=rng.choice([0.0, 1.0]), seed=i),
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("name", ["disable", "3_1_4", "8_4_32", "suffix_8", "3_1_4+suffix_8"])
def test_a_fixed_strategy_drafts_its_tree_every_round(models, name):
    policy, drafter = models
    strategy = Strategy.parse(name)
    engine = Engine(policy, EngineConfig(max_batch_size=4, max_model_len=128), drafter, build_selector(name))
    outputs = engine.generate(_inputs(11, 9))
    rounds = {s.strategy for s in engine.round_stats}
    assert rounds <= {strategy}
    for out in outputs:
        accepted = sum(out.accept_lengths) - len(out.accept_lengths)
        assert accepted <= out.drafted_tokens
        if not strategy.is_history:  # EAGLE trees have a fixed size; a history tree is what the index matched
            assert out.drafted_tokens == len(out.accept_lengths) * (strategy.max_tree_nodes - 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_requests_counts_add_up_to_the_rounds_counts(models, seed):
    policy, drafter = models
    selector = build_selector("bandit", bandit={"strategies": ["3_1_4", "5_1_6@0.3", "suffix_8", "disable"]})
    engine = Engine(policy, EngineConfig(max_batch_size=5, max_model_len=128, seed=seed), drafter, selector)
    outputs = engine.generate(_inputs(100 + seed, 12))
    assert sum(o.drafted_tokens for o in outputs) == sum(sum(s.drafted_tokens) for s in engine.round_stats)
    assert sum(len(o.accept_lengths) for o in outputs) == sum(s.batch_size for s in engine.round_stats)
    assert len({s.strategy for s in engine.round_stats}) > 1


@pytest.mark.parametrize(("seed", "name"), [(3, "7_1_8"), (4, "5_1_6"), (5, "8_4_32"), (6, "bandit")])
def test_the_rounds_accept_length_is_the_requests(models, seed, name):
    """One accept length: tokens a round added to a request (accepted drafts + 1, cut where it finished), whether
    summed over the rounds (`RoundTotals`: train-drafter's held-out figure, worker stats, telemetry) or over the
    requests (`RequestOutput.accept_lengths`: RL metrics, verl's counts). Drafts accepted past a request's end
    (EOS, a stop id, its token budget) were never emitted and count in neither."""
    policy, drafter = models
    engine = Engine(policy, EngineConfig(max_batch_size=3, max_model_len=128, seed=seed), drafter, build_selector(name))
    outputs = engine.generate(_inputs(200 + seed, 10))
    rounds = RoundTotals.of(engine.round_stats)
    per_request = sum(sum(o.accept_lengths) for o in outputs) / sum(len(o.accept_lengths) for o in outputs)
    assert rounds.mean_accept_length == pytest.approx(per_request, rel=1e-12)
    cut = [s for s in engine.round_stats if sum(s.emitted_tokens) < sum(s.accepted_tokens) + s.batch_size]
    assert cut, "no request stopped inside an accepted path: the case tests nothing"
    assert all(s.mean_accept_length == sum(s.emitted_tokens) / s.batch_size for s in engine.round_stats)

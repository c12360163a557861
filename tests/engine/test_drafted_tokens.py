"""Each request counts the draft tokens its decode rounds proposed to it (`RequestOutput.drafted_tokens`, what the
verl backend reports as `spec_num_draft_tokens`): the rounds' own counts, whichever strategy each round ran and
however early a request finished."""

from __future__ import annotations

import random

import pytest

from fastrl.adaptive.depth_acceptance import is_chain
from fastrl.adaptive.factory import build_selector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
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


@pytest.mark.parametrize("name", ["disable", "7_1_8", "12_1_13@0.3", "8_4_8", "8_4_32", "suffix_8", "3_1_4+suffix_8"])
def test_each_round_says_how_deep_each_rows_draft_went(models, name):
    """`RoundStats.reached`: 0 for plain rounds; a chain drafts every level up to where it stopped, so a row went
    one past its accepted tokens unless it accepted the whole chain; a tree's accepted path may end at a leaf. The
    graph path (a replay runs the round again here) reports what the eager path does."""
    from fastrl.bench.eager_ops import OpCounter, graph_path_counted

    policy, drafter = models
    strategy = Strategy.parse(name)
    config = EngineConfig(max_batch_size=4, max_model_len=128)
    engine = Engine(policy, config, drafter, build_selector(name))
    engine.generate(_inputs(21, 10))
    with graph_path_counted(OpCounter()):
        graphed = Engine(policy, config, drafter, build_selector(name))
    assert graphed.runner.graphs is not None
    graphed.generate(_inputs(21, 10))
    assert [s.reached for s in graphed.round_stats] == [s.reached for s in engine.round_stats]
    leaves = 0
    for stats in engine.round_stats:
        assert stats.reached is not None
        for reached, accepted, drafted in zip(stats.reached, stats.accepted_tokens, stats.drafted_tokens, strict=True):
            if strategy.is_disabled:
                assert reached == 0
            elif is_chain(strategy):  # a chain of `drafted` levels this round
                assert reached == min(accepted + 1, drafted)
            leaves += reached == accepted < strategy.steps
    if name == "8_4_8":  # 7 nodes over 8 levels: some accepted paths end at a leaf short of the depth
        assert leaves > 0

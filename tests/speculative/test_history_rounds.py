"""History and hybrid rounds in the engine: exact against plain decoding with and without a drafter, across
RL steps with a kept index, against HF transformers greedy; merged trees are well formed."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.draft_tree import ancestor_matrix, merge_trees
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.history import HistoryIndex
from fastrl.speculative.history.draft import HistoryDraft
from fastrl.speculative.history.tree import history_draft_tree
from fastrl.strategy.round_stats import RoundTotals
from fastrl.strategy.strategy import Strategy
from tests.engine.test_engine import _hf_greedy, assert_matches_hf
from tests.helpers import FLOAT64_LOGPROB_TOL, make_hf_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    hf = make_hf_model("qwen2", seed=6, vocab_size=23)  # a small vocabulary repeats itself: history drafts hit
    hf.save_pretrained(path)
    model = load_model(path).double()
    torch.manual_seed(3)
    return hf, model, EagleDrafter(model.config).double()


def _groups(vocab: int, prompts: int, n: int, seed: int, greedy: bool = False) -> list[GenerateInput]:
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 8))]
        for i in range(n):
            t = 0.0 if greedy else rng.choice([0.0, 0.8, 1.3])
            params = SamplingParams(
                max_new_tokens=rng.randint(8, 40), temperature=t, seed=1000 * p + i, ignore_eos=True
            )
            out.append(GenerateInput(prompt, params, request_id=f"s{seed}-p{p}-{i}"))
    return out


def _engine(model, strategy: str, batch_size: int, drafter=None, history=None) -> Engine:
    config = EngineConfig(max_batch_size=batch_size, dtype="float64")
    return Engine(model, config, drafter=drafter, selector=FixedSelector(strategy), history=history)


@settings(max_examples=10, deadline=None)
@given(
    strategy=st.sampled_from(["suffix_2", "suffix_5", "suffix_16", "3_1_4+suffix_8", "4_3_10+suffix_12"]),
    batch_size=st.integers(1, 12),
    seed=st.integers(0, 1000),
)
def test_history_arms_equal_plain(setup, strategy, batch_size, seed):
    _, model, drafter = setup
    inputs = _groups(model.config.vocab_size, 3, 4, seed)
    plain = _engine(model, "disable", 12).generate(inputs)
    engine = _engine(model, strategy, batch_size, drafter if "+" in strategy else None)
    spec = engine.generate(inputs)
    for a, b in zip(plain, spec, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, rel=0, abs=FLOAT64_LOGPROB_TOL)
    assert (engine.runner.drafter is None) == ("+" not in strategy)


def test_history_without_a_drafter_accepts_and_matches_hf(setup):
    hf, model, _ = setup
    inputs = _groups(model.config.vocab_size, 2, 3, seed=7, greedy=True)
    engine = _engine(model, "suffix_8", 6)
    outs = engine.generate(inputs)
    assert engine.runner.drafter is None
    assert RoundTotals.of(engine.round_stats).mean_accept_length > 1.2  # siblings and repetition are drafted
    for inp, out in zip(inputs, outs, strict=True):
        theirs, gaps = _hf_greedy(hf, inp.prompt_ids, inp.params.max_new_tokens)
        assert_matches_hf(out.token_ids, theirs, gaps)


def test_kept_index_carries_history_across_steps(setup):
    _, model, _ = setup
    inputs = _groups(model.config.vocab_size, 3, 4, seed=11)
    plain = _engine(model, "disable", 12).generate(inputs)
    index = HistoryIndex()
    first = _engine(model, "suffix_16", 12, history=index)
    first.generate(inputs)
    assert index.num_groups == 3
    again = [GenerateInput(i.prompt_ids, i.params, request_id=i.request_id + "-epoch2") for i in inputs]
    second = _engine(model, "suffix_16", 12, history=index)
    outs = second.generate(again)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    # the same prompts and seeds again: the kept responses predict the new ones
    before = RoundTotals.of(first.round_stats).mean_accept_length
    after = RoundTotals.of(second.round_stats).mean_accept_length
    assert after > before


def test_bandit_over_eagle_and_history_arms(setup):
    _, model, drafter = setup
    inputs = _groups(model.config.vocab_size, 3, 4, seed=5)
    plain = _engine(model, "disable", 12).generate(inputs)
    arms = ["3_1_4", "suffix_8", "3_1_4+suffix_8", "disable"]
    bandit = BanditSelector(BanditConfig(strategies=arms, min_pulls=1, epsilon=0.3))
    engine = Engine(model, EngineConfig(max_batch_size=12, dtype="float64"), drafter=drafter, selector=bandit)
    outs = engine.generate(inputs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert {str(s.strategy) for s in engine.round_stats} >= {"suffix_8", "3_1_4+suffix_8"}


def test_history_strategy_without_an_index_is_refused(setup):
    from fastrl.engine.runner import ModelRunner
    from fastrl.strategy.strategy import Strategy

    _, model, _ = setup
    with pytest.raises(ValueError, match="HistoryIndex"):
        ModelRunner(model, EngineConfig(max_batch_size=2), None, [Strategy.parse("suffix_4")])
    with pytest.raises(ValueError, match="need a drafter"):
        _engine(model, "3_1_4+suffix_4", 2)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_merged_trees_are_ancestor_consistent(data):
    n = data.draw(st.integers(2, 6))
    m = data.draw(st.integers(2, 6))

    def random_draft(size: int) -> HistoryDraft:
        parents = [-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, size)]
        tokens = [data.draw(st.integers(0, 9)) for _ in range(size)]
        return HistoryDraft(tuple(tokens), tuple(parents), tuple(1.0 for _ in range(size)))

    first = history_draft_tree([random_draft(n)], n, n - 1)
    second = history_draft_tree([random_draft(m)], m, m - 1)
    merged = merge_trees(first, second)
    assert merged.num_nodes == n + m - 1
    assert torch.equal(merged.ancestors, ancestor_matrix(merged.parents, n + m))
    assert bool((merged.parents[0, 1:] < torch.arange(1, n + m - 1)).all())
    depth = merged.depths[0]
    parents = merged.parents[0]
    assert all(depth[i] == depth[parents[i]] + 1 for i in range(1, n + m - 1))


class _Alternating:
    """Plain and a history arm in turn, each a few rounds: every history stretch starts with a backlog to index."""

    def __init__(self, arm: str, every: int) -> None:
        self.arms, self.every, self.round = [Strategy.parse("disable"), Strategy.parse(arm)], every, 0

    @property
    def strategies(self):
        return list(self.arms)

    def choose(self, batch_size: int):
        self.round += 1
        return self.arms[(self.round // self.every) % 2]

    def observe(self, stats) -> None:
        pass


def test_a_history_round_reports_the_indexing_of_what_came_before_it(setup):
    """The engine indexes a history round's backlog (text emitted since its groups' last history draft) inside the
    round and says how long it took (`catch_up_time_s`, which the bandit does not learn as the arm's cost); the
    same tokens as indexing on arrival would draft."""
    _, model, _ = setup
    inputs = _groups(23, 3, 2, seed=5)
    config = EngineConfig(max_batch_size=6, dtype="float64")
    engine = Engine(model, config, selector=_Alternating("suffix_8", 4))
    outs = engine.generate(inputs)
    plain = _engine(model, "disable", 6).generate(inputs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    history = [s for s in engine.round_stats if s.strategy.is_history]
    others = [s for s in engine.round_stats if not s.strategy.is_history]
    assert history and others and all(s.catch_up_time_s == 0.0 for s in others)
    assert all(0.0 < s.catch_up_time_s < s.wall_time_s for s in history)

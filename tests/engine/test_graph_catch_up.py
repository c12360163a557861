"""A graphed speculative round catches its drafter up inside the graph (no drafter forward launched around it);
rows with more pending entries than the graph reads have the earlier ones caught up eagerly first, timed when
plain rounds left them. On the CPU through the runner's graph path (`ModelRunner(graph_capture=...)`)."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.bench.eager_ops import OpCounter, graph_path_counted
from fastrl.engine.calibration import ScriptedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.speculative.drafting import DrafterInput, split_pending
from fastrl.strategy.strategy import DISABLE, Strategy


def test_split_pending_keeps_each_rows_last_entries_and_the_rest_before_them():
    """Random counts and widths: the last part holds each row's last min(count, width) entries in order, the rest
    are the entries before them, and nothing is lost or repeated."""
    rng = random.Random(0)
    for _ in range(50):
        b, k, width, f = rng.randint(1, 6), rng.randint(1, 9), rng.randint(1, 11), rng.randint(1, 3)
        counts = torch.tensor([rng.randint(1, k) for _ in range(b)])
        tokens = torch.randint(0, 1000, (b, k))
        features = torch.randn(b, k, f)
        last, earlier, taken = split_pending(DrafterInput(tokens, features, counts), width)
        assert last.tokens.shape == (b, width) and torch.equal(taken, counts.clamp(max=width))
        for row in range(b):
            c, t = int(counts[row]), int(taken[row])
            assert int(earlier.counts[row]) == c - t and torch.equal(last.counts[row], taken[row])
            assert last.tokens[row, :t].tolist() == tokens[row, c - t : c].tolist()
            assert torch.equal(last.features[row, :t], features[row, c - t : c])
            assert earlier.tokens[row, : c - t].tolist() == tokens[row, : c - t].tolist()


@pytest.fixture(scope="module")
def models():
    policy = load_model(bundled_model_dir()).eval()
    return policy, load_drafter(bundled_drafter_dir(), policy)[0]


def _graphed_engine(policy, drafter, selector) -> Engine:
    # PyTorch's attention (not the CPU kernels): every op a GPU would launch shows up as an aten op here
    config = EngineConfig(max_batch_size=4, max_model_len=256, attention_kernel=False)
    return _with_requests(Engine(policy, config, drafter=drafter, selector=selector))


def _with_requests(engine: Engine) -> Engine:
    """Three requests of 4-6 prompt tokens, 80 new tokens each at T=1 (seeds 0-2), EOS ignored."""
    for seed in range(3):
        params = SamplingParams(max_new_tokens=80, temperature=1.0, seed=seed, ignore_eos=True)
        engine.add_request([1, 5 + seed, 7, 9, 11, 13][: 4 + seed], params)
    return engine


def _plain_rollouts(policy) -> list[list[int]]:
    """The three requests' tokens under eager plain decoding, sorted."""
    reference = _with_requests(Engine(policy, EngineConfig(max_batch_size=4, max_model_len=256)))
    done = []
    while reference.has_unfinished():
        done += _finished(reference.step())
    assert len(done) == 3
    return sorted(o.token_ids for o in done)


@pytest.mark.parametrize("arm", ["3_1_4", "2_2_4"])
def test_a_graphed_round_launches_no_drafter_forward_around_its_graph(models, arm):
    """A static strategy's rounds: the catch-up runs in the graph (no linear layer outside the replays), and the
    tokens are plain decoding's."""
    policy, drafter = models
    ops = OpCounter()
    with graph_path_counted(ops):
        engine = _graphed_engine(policy, drafter, FixedSelector(Strategy.parse(arm)))
        engine.step()  # the prefill feeds the drafter the prompts eagerly
        with ops:
            for _ in range(6):
                engine.step()
    assert ops.ops["linear"] == 0 and ops.ops["mm"] == 0, ops.ops.most_common(8)
    assert all(s.catch_up_time_s == 0.0 for s in engine.round_stats)


def test_entries_past_the_graphs_width_are_caught_up_first_and_timed(models):
    """Plain rounds leave a row more pending entries than a `3_1_4` graph reads (4): the next `3_1_4` round
    catches up on the earlier ones eagerly (a drafter forward outside the graph, timed as the plain rounds'
    cost), and the rollout is plain decoding's token for token."""
    policy, drafter = models
    strategy = Strategy.parse("3_1_4")
    script = ScriptedSelector([strategy, DISABLE])
    ops = OpCounter()
    plan = [strategy, DISABLE, strategy, DISABLE, DISABLE, DISABLE, DISABLE, DISABLE, strategy, strategy]
    linears = []
    with graph_path_counted(ops):
        engine = _graphed_engine(policy, drafter, script)
        done = _finished(engine.step())
        with ops:
            for chosen in plan:
                script.next = chosen
                before = ops.ops["linear"]
                done += _finished(engine.step())
                linears.append(ops.ops["linear"] - before)
        script.next = strategy
        while engine.has_unfinished():
            done += _finished(engine.step())
    rounds = engine.round_stats
    assert [s.strategy for s in rounds[: len(plan)]] == plan
    assert linears[8] > 0 and rounds[8].catch_up_time_s > 0.0  # five plain rounds: 6+ entries pending
    assert linears[9] == 0 and rounds[9].catch_up_time_s == 0.0  # after a 3_1_4 round: at most 4 pending
    assert sorted(o.token_ids for o in done) == _plain_rollouts(policy)


def _finished(outputs: list) -> list:
    return [o for o in outputs if o.finished]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_strategy_switches_through_the_graph_path_equal_plain_decoding(models, seed):
    """Each round a random arm (plain, chains and trees of depths 2-7), so rows reach a graph with backlogs of every
    width (a deep chain's round before a shallow tree's): the rollouts are plain decoding's, token for token, and
    every round accepts what the same rounds accept eagerly (the drafter caught up on the same entries, in the
    graph or before it: a wrong catch-up would change the drafts, not the tokens)."""
    policy, drafter = models
    rng = random.Random(seed)
    arms = [Strategy.parse(s) for s in ("disable", "3_1_4", "2_2_4", "7_1_8", "6_4_24")]
    script = ScriptedSelector(arms)
    done, chosen = [], []
    with graph_path_counted(OpCounter()):
        engine = _graphed_engine(policy, drafter, script)
        while engine.has_unfinished():
            script.next = rng.choice(arms)
            chosen.append(script.next)
            done += _finished(engine.step())
    assert len(set(chosen)) >= 4
    assert sorted(o.token_ids for o in done) == _plain_rollouts(policy)
    eager = _with_requests(
        Engine(
            policy,
            EngineConfig(max_batch_size=4, max_model_len=256, attention_kernel=False),
            drafter=drafter,
            selector=script,
        )
    )
    again = []
    for strategy in chosen:
        script.next = strategy
        again += _finished(eager.step())
    accepted = {o.request_id: o.accept_lengths for o in done}
    assert {o.request_id: o.accept_lengths for o in again} == accepted

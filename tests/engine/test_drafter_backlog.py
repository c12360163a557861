"""A request's unread drafter entries (the text rounds without the drafter emitted, with the features the drafter
reads it by) stay within the engine's ``drafter_backlog``: a round that could pass it has the drafter read them
first. Tokens equal plain decoding's, drafts equal those of an engine that let the entries grow, and the feed's
memory stays bounded however long plain rounds run."""

from __future__ import annotations

import random

import pytest
import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.adaptive.round_times import RoundTimes
from fastrl.bench.workload import bench_prompts
from fastrl.engine.calibration import ScriptedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.drafter_feed import BACKLOG_BYTES, MIN_BACKLOG, DrafterFeed, backlog_limit
from fastrl.engine.engine import Engine
from fastrl.sampling.params import SamplingParams
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.selector import plain_time_estimate
from fastrl.strategy.strategy import DISABLE, Strategy
from tests.speculative.exactness_cases import _bundled_tokenizer, models

ARMS = [Strategy.parse(a) for a in ("3_1_4", "5_1_6", "2_2_4", "suffix_4", "3_1_4+suffix_4")]


def _run(policy, drafter, inputs, script: list[Strategy], backlog: int | None, batch: int):
    """Outputs (request order), round statistics, the feed's widest width, its limit and the engine's lookahead, of
    an engine stepping ``script`` (plain decoding without a drafter when ``drafter`` is None)."""
    selector = ScriptedSelector([*ARMS, DISABLE]) if drafter is not None else FixedSelector(DISABLE)
    config = EngineConfig(max_batch_size=batch, dtype="float64", drafter_backlog=backlog)
    engine = Engine(policy, config, drafter=drafter, selector=selector)
    ids = [engine.add_request(prompt, params) for prompt, params in inputs]
    finished, widest, step = {}, 0, 0
    while engine.has_unfinished():
        if drafter is not None:
            selector.next = script[step % len(script)]
        step += 1
        finished.update({o.request_id: o for o in engine.step() if o.finished})
        if drafter is not None:
            widest = max(widest, engine.runner.feed.tokens.shape[1])
    limit = engine.runner.feed.max_width if drafter is not None else None
    return [finished[i] for i in ids], list(engine.round_stats), widest, limit, engine.runner.lookahead


@pytest.mark.parametrize("seed", range(4))
def test_a_bounded_backlog_decodes_and_drafts_as_an_unbounded_one(seed):
    """Random task prompts, budgets, temperatures and batch sizes; a script of long plain stretches between drafter,
    history and hybrid rounds: the bounded engine's tokens are plain decoding's, its accept lengths the unbounded
    engine's (the drafter read the same entries, in chunks), and no slot ever held more than the limit."""
    rng = random.Random(seed)
    policy, drafter = models("bundled", "float64")
    prompts = bench_prompts(_bundled_tokenizer(), "auto", 4, seed)
    inputs = []
    for i in range(rng.randint(3, 6)):
        temperature = rng.choice([0.0, 1.0, 0.7])
        params = SamplingParams(max_new_tokens=rng.randint(20, 120), temperature=temperature, seed=100 * seed + i)
        inputs.append((rng.choice(prompts), params))
    script = []
    while len(script) < 300:
        script += [DISABLE] * rng.randint(3, 40) + [rng.choice(ARMS) for _ in range(rng.randint(1, 3))]
    batch, backlog = rng.randint(1, 4), rng.randint(1, 12)
    bounded, rounds, widest, limit, lookahead = _run(policy, drafter, inputs, script, backlog, batch)
    unbounded, unbounded_rounds, unbounded_widest, *_ = _run(policy, drafter, inputs, script, 10**6, batch)
    plain, *_ = _run(policy, None, inputs, [DISABLE], None, batch)
    assert [o.token_ids for o in bounded] == [o.token_ids for o in plain] == [o.token_ids for o in unbounded]
    assert [o.accept_lengths for o in bounded] == [o.accept_lengths for o in unbounded]
    assert limit == max(backlog, lookahead + 1)  # a round's entries after the root always fit
    assert widest <= limit < unbounded_widest  # the unbounded feed grew past it
    caught = [s for s in rounds if s.strategy.is_disabled and s.catch_up_time_s > 0]
    assert caught and all(s.own_time_s < s.wall_time_s for s in caught)  # timed, apart from the round's own time
    # the engine says what a drafter round would catch up on: nothing right after one, never past the limit
    assert all(s.drafter_backlog == 0 for s in rounds + unbounded_rounds if s.strategy.uses_drafter)
    assert all(0 <= s.drafter_backlog <= s.batch_size * (limit - 1) for s in rounds)
    assert not [s for s in unbounded_rounds if s.strategy.is_disabled and s.catch_up_time_s > 0]


def test_the_default_backlog_holds_the_feeds_within_its_budget():
    """Unless configured: as many entries as keep every slot's tokens and features within ``BACKLOG_BYTES``, at
    least ``MIN_BACKLOG``, at most the context, never fewer than a round's entries after the root."""
    f64, bf16 = torch.float64, torch.bfloat16
    bundled = backlog_limit(None, 64, 3 * 192, f64, 4096, 14)
    assert bundled == BACKLOG_BYTES // (64 * (3 * 192 * 8 + 8)) and 64 * bundled * (3 * 192 * 8 + 8) <= BACKLOG_BYTES
    assert backlog_limit(None, 256, 3 * 3584, bf16, 32768, 9) == MIN_BACKLOG  # a 7B policy's fused features
    assert backlog_limit(None, 4, 64, f64, 300, 9) == 300  # a small engine: the whole context
    assert backlog_limit(5, 64, 64, f64, 300, 9) == 10 and backlog_limit(50, 64, 64, f64, 300, 9) == 50


def test_a_feed_never_grows_past_its_limit():
    feed = DrafterFeed(3, 4, torch.float32, torch.device("cpu"), width=2, max_width=6)
    tokens, features = torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, 4)
    feed.append([1], tokens, features, [3])
    assert feed.full([0, 1], 3) == [] and feed.full([0, 1], 4) == [1]
    feed.append([1], tokens, features, [3])
    assert feed.tokens.shape[1] == 6  # doubled to 4, then 8 cut to the limit
    with pytest.raises(RuntimeError, match="7 entries asked of a slot, at most 6 held"):
        feed.append([1], tokens[:, :1], features[:, :1], [1])
    with pytest.raises(ValueError, match="max_width must be >= 2"):
        DrafterFeed(3, 4, torch.float32, torch.device("cpu"), width=2, max_width=1)


@pytest.mark.parametrize("bad", [0, -3, 1.5, "64", True])
def test_a_bad_backlog_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="engine.drafter_backlog must be"):
        EngineConfig(drafter_backlog=bad)


def test_a_plain_rounds_own_time_leaves_its_catch_up_out():
    """The plain-time estimate of a plain round is what plain decoding took: its time less a drafter catch-up it
    ran (a plain engine has no drafter to feed)."""
    stats = RoundStats(DISABLE, 2, [0, 0], [0, 0], [1, 1], 0.010, catch_up_time_s=0.004)
    assert stats.own_time_s == pytest.approx(0.006)
    assert plain_time_estimate(FixedSelector(DISABLE), stats) == pytest.approx(0.006)
    assert RoundTimes(None).plain_estimate(stats) == pytest.approx(0.006)


@pytest.mark.parametrize("limit", [None, 12])
def test_the_backlog_a_round_reports_is_what_the_next_drafter_round_reads_first(limit):
    """One request: after a drafter round that emitted e tokens, j plain rounds leave e + j - 1 entries for the next
    drafter round's catch-up (its root aside), or, under a limit, what the last forced reading left; the bandit's
    catch-up costs take the engine's count."""
    from fastrl.adaptive.catch_up import CatchUpCosts

    policy, drafter = models("bundled", "float64")
    chain = Strategy.parse("3_1_4")
    script = [chain] + [DISABLE] * 12 + [chain] + [DISABLE] * 3 + [chain]
    params = SamplingParams(max_new_tokens=200, temperature=1.0, seed=7, ignore_eos=True)
    inputs = [([5, 9, 4, 11, 6], params)]
    _, rounds, _, max_width, lookahead = _run(policy, drafter, inputs, [DISABLE, *script], limit, 1)
    costs = CatchUpCosts()
    pending, expected = 1, []  # the slot's pending entries, its root included
    for stats in rounds[: len(script)]:
        if stats.strategy.uses_drafter:
            pending = stats.emitted_tokens[0]
            expected.append(0)
        else:
            if limit is not None and pending + lookahead > max_width:
                pending = 1  # the drafter read all but the root first
            pending += 1
            expected.append(pending - 1)
        costs.observe(stats)
        assert costs.backlog["drafter"] == stats.drafter_backlog
    assert [s.drafter_backlog for s in rounds[: len(script)]] == expected
    # unbounded: the whole plain stretch; bounded: the most a slot holds before a round's entries would not fit
    assert max(expected) == (12 + rounds[0].emitted_tokens[0] - 1 if limit is None else max_width - lookahead)

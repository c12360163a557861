"""The plain-overhead bench pairs a drafter-free engine with one that has a drafter and runs only plain rounds: the
second really feeds its drafter, both decode the same tokens, and every timed round gives one ratio."""

from __future__ import annotations

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.bench.plain_overhead import PlainAmongDrafterArms, paired_ratios
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.strategy import Strategy


def test_plain_rounds_with_a_fed_drafter_decode_what_a_drafter_free_engine_does():
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    inputs = [GenerateInput([1, 5, 9, 4], SamplingParams(max_new_tokens=24, temperature=1.0, seed=s)) for s in (3, 4)]
    config = EngineConfig(max_batch_size=2, max_model_len=64)
    fed = Engine(policy, config, drafter=drafter, selector=PlainAmongDrafterArms(Strategy.parse("3_1_4")))
    assert fed.drafter is not None
    free = Engine(policy, config)
    assert [o.token_ids for o in fed.generate(inputs)] == [o.token_ids for o in free.generate(inputs)]
    assert {r.strategy for r in fed.round_stats} == {Strategy.parse("disable")}
    ratios = paired_ratios(policy, drafter, batch_size=2, rounds=14, repeats=2)
    assert len(ratios) == 8 and all(r > 0 for r in ratios)
    hybrid = Strategy.parse("3_1_4+suffix_8")  # an engine that also keeps the history index, every round
    assert Engine(policy, config, drafter, PlainAmongDrafterArms(hybrid)).history is not None
    assert len(paired_ratios(policy, drafter, batch_size=2, rounds=12, repeats=1, arm=hybrid)) == 2

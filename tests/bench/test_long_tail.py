"""The long-tail bench's selector names (`bandit:KEY=VALUE`) and its warm start from what an earlier run learned."""

from __future__ import annotations

import pytest

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.bench.long_tail import _engine, _selector, learned_state, main
from fastrl.engine.engine import GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter

ARMS = ["5_1_6", "3_1_4", "disable"]


def test_a_bandit_setting_changed_by_name():
    base = BanditConfig(strategies=ARMS)
    selector = _selector("bandit:explore_budget=0.02", base)
    assert isinstance(selector, BanditSelector)
    assert selector.config.explore_budget == 0.02 and selector.config.strategies == ARMS
    assert _selector("bandit:explore_budget=null", base).config.explore_budget is None
    assert _selector("bandit", base).config == base


@pytest.mark.parametrize(
    ("name", "named"),
    [("bandit:explore_budgt=0.02", "explore_budgt"), ("bandit:explore_budget=0.0.2", "0.0.2"), ("bandit:=1", "''")],
)
def test_a_bad_bandit_setting_is_named(name, named):
    with pytest.raises(ValueError, match=named):
        _selector(name, BanditConfig(strategies=ARMS))


def test_bandits_start_from_what_an_earlier_run_learned():
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    config = BanditConfig(strategies=ARMS, calibrate=False)
    earlier = [GenerateInput([1, 2, 3, 4], SamplingParams(max_new_tokens=30, temperature=1.0, seed=s)) for s in (7, 8)]
    state = learned_state(policy, drafter, earlier, 2, config, 256)
    assert any(any(trials) for _, trials in state["acceptance"].values())  # it did learn something
    warm = _engine(policy, drafter, "bandit", 2, config, 256, state).selector
    cold = _engine(policy, drafter, "bandit", 2, config, 256).selector
    assert warm.acceptance.state() == state["acceptance"]
    assert warm.acceptance.state() != cold.acceptance.state()
    assert not isinstance(_engine(policy, drafter, "3_1_4", 2, config, 256, state).selector, BanditSelector)


def test_a_prompts_file_runs_in_lockstep_at_a_temperature(tmp_path, capsys, monkeypatch):
    """`--prompts-file` (its first lines timed, the next ones warming the bandit up) and `--temperature`: the table
    prints each selector against plain (once, with an untimed `--warmup` pass first); a file with fewer prompts than
    asked is refused, naming the count."""
    monkeypatch.setenv("FASTRL_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt_ids": [1, {t}, 3, 4]}}\n' for t in range(5, 9)))
    common = ["--prompts-file", str(prompts), "--batch-size", "1", "--max-new-tokens", "6", "--temperature", "0"]
    main([*common, "--requests", "2", "--selectors", "3_1_4", "--arms", "3_1_4,disable"])
    out = capsys.readouterr().out
    assert "disable wall" in out and "3_1_4 wall" in out
    main([*common, "--requests", "2", "--selectors", "3_1_4", "--arms", "3_1_4,disable", "--warmup"])
    assert capsys.readouterr().out.count("3_1_4 wall") == 1  # the untimed pass prints nothing
    with pytest.raises(SystemExit):
        main([*common, "--requests", "3", "--warm-start", "2"])
    assert "--prompts-file has 4 prompts, 3 timed + 2 warm-up asked" in capsys.readouterr().err

"""The cache warm-up bench times plain rounds by their position after another engine's or another arm's rounds, and
refuses settings whose rows would run past the model's context."""

from __future__ import annotations

import pytest

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.bench.cache_warmup import WarmupSetting, main, tokens_needed, warmup_ratios
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.strategy.strategy import Strategy


@pytest.mark.parametrize("other_batch", [4, None])
def test_every_position_is_timed_against_the_last(other_batch):
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    setting = WarmupSetting(2, Strategy.parse("3_1_4"), other_batch, before=2, positions=3, cycles=2)
    ratios = warmup_ratios(policy, drafter, setting)
    assert len(ratios) == 3 and ratios[-1] == 1.0 and all(r > 0 for r in ratios)


def test_rows_past_the_context_are_refused_naming_the_flags(capsys):
    with pytest.raises(SystemExit):
        main(["--after", "arm", "--cycles", "500"])
    assert "fewer --cycles or --positions" in capsys.readouterr().err
    for bad, said in (("disable", "another arm's, not disable"), ("3_1_x", "--arm")):
        with pytest.raises(SystemExit):
            main(["--after", "arm", "--arm", bad])
        assert said in capsys.readouterr().err
    arm = WarmupSetting(1, Strategy.parse("7_1_8"), None, before=3, positions=16, cycles=10)
    assert tokens_needed(arm) - tokens_needed(WarmupSetting(1, arm.arm, 64, 3, 16, 10)) == 10 * 3 * 8

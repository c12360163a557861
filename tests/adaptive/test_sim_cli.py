"""``python -m fastrl.adaptive.sim`` refuses what it cannot simulate with one usage error, before printing anything."""

import json

import pytest

from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.sim import main
from fastrl.strategy.strategy import DISABLE, Strategy


def rows(*arms: str) -> list[dict]:
    return [
        {"strategy": arm, "batch_size": b, "seconds": 0.01 * (i + 1) * (1 + b / 64)}
        for i, arm in enumerate(arms)
        for b in (1, 8, 64)
    ]


def test_costs_without_plain_timings_are_a_usage_error(tmp_path, capsys):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(rows("3_1_4", "8_4_32")))
    with pytest.raises(SystemExit) as raised:
        main(["--costs", str(path), "--rollouts", "2"])
    assert raised.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # no table header before the error
    assert f"--costs {path} has no 'disable' timings" in err


def test_costs_with_plain_timings_still_print_the_table(tmp_path, capsys):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(rows("disable", "3_1_4")))
    main(["--costs", str(path), "--rollouts", "2", "--strategies", "3_1_4,disable"])
    assert "workload: stationary" in capsys.readouterr().out


def test_history_arms_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--strategies", "3_1_4,suffix_8,disable", "--rollouts", "2"])
    assert raised.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "--strategies suffix_8: history arms cannot be simulated" in err


def test_has_strategy_answers_what_round_time_can_time():
    measured = CostModel.fit([(Strategy.parse("3_1_4"), 1, 0.01), (Strategy.parse("3_1_4"), 8, 0.02)])
    assert measured.has_strategy(Strategy.parse("3_1_4"))
    assert not measured.has_strategy(DISABLE)  # no timings and no parametric fallback
    with pytest.raises(ValueError):
        measured.round_time(DISABLE, 1)
    parametric = CostModel.default_gpu()
    assert parametric.has_strategy(DISABLE) and parametric.has_strategy(Strategy.parse("8_4_32"))
    assert not parametric.has_strategy(Strategy.parse("suffix_8"))  # the parametric model is EAGLE's

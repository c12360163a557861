"""Config values past their limits are one ValueError naming the key or the string: a strategy number of thousands
of digits (Python's int-parsing limit spoke instead), a `fastrl bench` list that repeats an entry (its rows were
printed twice)."""

from __future__ import annotations

import pytest

from fastrl.cli import main
from fastrl.commands.bench_config import BenchConfig
from fastrl.strategy.strategy import Strategy


@pytest.mark.parametrize("text", ["9" * 5000 + "_1_2", "suffix_" + "9" * 5000, "8_4_32+suffix_" + "7" * 5000])
def test_a_strategy_number_of_thousands_of_digits_names_the_string(text):
    with pytest.raises(ValueError, match="a number of 5000 digits; steps <= 64") as raised:
        Strategy.parse(text)
    assert f"strategy '{text[:40]}...{text[-12:]}'" in str(raised.value)


def test_leading_zeros_stay_part_of_the_grammar():
    assert str(Strategy.parse("8_4_32+suffix_" + "0" * 4999 + "8")) == "8_4_32+suffix_8"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"long_tail_selectors": ["bandit", "3_1_4", "bandit"]}, "bench.long_tail_selectors: 'bandit' is listed twice"),
        (
            {"bs1_strategies": ["8_4_32", "3_1_4", "8_4_32 "]},
            "bench.bs1_strategies: '8_4_32 ' is listed twice (as '8_4_32')",
        ),
        ({"groups_selectors": ["suffix_8", "SUFFIX_8"]}, "bench.groups_selectors: 'SUFFIX_8' is listed twice"),
        ({"batch_sizes": [1, 8, 1]}, "bench.batch_sizes: 1 is listed twice"),
        ({"bs1_temperatures": [0.0, 1.0, 0.0]}, "bench.bs1_temperatures: 0.0 is listed twice"),
    ],
)
def test_a_bench_list_that_repeats_an_entry_is_refused(values, message):
    with pytest.raises(ValueError) as raised:
        BenchConfig(**values)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"seed": -1}, "bench.seed must be an integer in [0, 2**63), got -1"),
        ({"seed": 2**63}, "bench.seed must be an integer in [0, 2**63)"),
        ({"bs1_temperatures": [1.0, 1e-9]}, "bench.bs1_temperatures[1] must be 0 (greedy) or at least 1e-06"),
        ({"groups_temperatures": [float("nan")]}, "bench.groups_temperatures[0] must be a finite number >= 0"),
        ({"groups_temperatures": []}, "bench.groups_temperatures must name at least one temperature"),
        ({"bs1_max_new_tokens": 2**64}, "bench.bs1_max_new_tokens must be an integer in [1, 2**62)"),
        ({"long_tail_max_new_tokens": 0}, "bench.long_tail_max_new_tokens must be an integer in [1, 2**62)"),
    ],
)
def test_bench_values_every_request_would_refuse_are_refused_before_any_suite(values, message):
    """Checked where the config is read, naming the bench key: they failed after the model loaded (or the earlier
    suites ran), naming a request's field, and a negative seed killed the kv_memory suite's child process."""
    with pytest.raises(ValueError) as raised:
        BenchConfig(**values)
    assert message in str(raised.value)


def test_the_bench_command_names_the_repeated_entry(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", f"output={out}", "suites=[long_tail]", "long_tail_selectors=[bandit,bandit]"]) == 2
    assert "bench.long_tail_selectors: 'bandit' is listed twice; list each once" in capsys.readouterr().err
    assert not out.exists()

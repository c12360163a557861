"""The standalone benchmark scripts refuse a bad argument with argparse's one-line usage error naming the flag
(before any model loads), and answer --help."""

from __future__ import annotations

import pytest

from fastrl.bench import attention_lengths, eager_ops, host_time, long_tail, plain_overhead, selector_cost


@pytest.mark.parametrize(
    ("main", "argv", "said"),
    [
        (long_tail.main, ["--requests", "0"], "argument --requests: must be >= 1, got 0"),
        (long_tail.main, ["--group", "x"], "argument --group: 'x' is not an integer"),
        (long_tail.main, ["--temperature", "-1"], "--temperature must be a finite number >= 0"),
        (long_tail.main, ["--arms", "3_1_4,nope"], "--arms: strategy 'nope'"),
        (long_tail.main, ["--selectors", "bandit:epsilon=x"], "--selectors: selector 'bandit:epsilon=x'"),
        (long_tail.main, ["--device", "gpu"], "--device='gpu' is not a torch device"),
        (plain_overhead.main, ["--rounds", "5"], "argument --rounds: must be >= 11, got 5"),
        (selector_cost.main, ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (eager_ops.main, ["bogus"], "strategy 'bogus'"),
    ],
)
def test_a_bad_argument_is_a_usage_error(main, argv, said, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and said in capsys.readouterr().err


def test_help_is_answered_without_running(capsys, monkeypatch):
    for main in (eager_ops.main, long_tail.main):
        with pytest.raises(SystemExit) as stopped:
            main(["--help"])
        assert stopped.value.code == 0
    monkeypatch.setattr("sys.argv", ["attention_lengths", "--help"])
    with pytest.raises(SystemExit):
        attention_lengths.main()
    host_time.main(["--help"])
    assert "usage: python -m fastrl.bench.host_time" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="usage: python -m fastrl.bench.host_time"):
        host_time.main(["nothing"])

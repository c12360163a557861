"""The drafter-backlog bench: each limit's engine decodes the same tokens, a limit bounds the feed and forces
catch-ups inside plain rounds, none forces nothing; bad limits are refused by flag."""

from __future__ import annotations

import pytest

from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.bench.drafter_backlog import UNBOUNDED, backlog_run, main
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter_checkpoint import load_drafter


def test_a_limit_bounds_the_feed_and_reads_early_what_none_reads_late():
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    none = backlog_run(policy, drafter, "none", rows=3, tokens=40, switch=30, dtype="float64")
    eight = backlog_run(policy, drafter, "8", rows=3, tokens=40, switch=30, dtype="float64")
    assert none.outputs == eight.outputs and all(len(o) == 40 for o in none.outputs)
    assert none.limit == UNBOUNDED and none.forced_catch_up_s == 0.0 and none.drafter_catch_up_s > 0.0
    assert eight.limit == 8 and eight.forced_catch_up_s > 0.0 and eight.feed_mib < none.feed_mib


@pytest.mark.parametrize("bad", ["0", "-4", "many", "none,"])
def test_bad_backlogs_are_refused_by_flag(bad, capsys):
    with pytest.raises(SystemExit):
        main(["--backlogs", bad, "--rows", "1", "--tokens", "4"])
    assert "argument --backlogs" in capsys.readouterr().err

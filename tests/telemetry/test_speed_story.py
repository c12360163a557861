"""The speed story: tokens/s, accept length, time against the estimated plain-decoding time (from hand-built rounds
that carry estimates, and "no estimate" without), the strategy chosen per batch-size bucket; in the train metrics,
the closing summaries, W&B's flat view and report.png's panels."""

from __future__ import annotations

import dataclasses
import io

import matplotlib
import pytest

from fastrl.rl.metrics import StepMetrics
from fastrl.rl.rollout_speed import (
    SpeedStory,
    count_arm_rounds,
    estimated_plain_time,
    rollout_plain_time,
    step_speed_fields,
)
from fastrl.rollout.types import DrafterTrainingStats, RolloutBatch, RoundRecord, WorkerTiming
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import Strategy
from fastrl.telemetry.report_panels import choice_panel
from fastrl.telemetry.speed_summary import print_speed_summary, rounds_speed, steps_speed
from fastrl.telemetry.train_report import _reward_panel

matplotlib.use("Agg")
THRESHOLDS = (1, 2, 5, 21)


def _round(strategy: str, batch: int, accepted: int, wall: float, plain: float = 0.0) -> RoundStats:
    drafted = 0 if strategy == "disable" else 8
    return RoundStats(
        Strategy.parse(strategy), batch, [drafted] * batch, [accepted] * batch, [accepted + 1] * batch, wall,
        plain_time_estimate_s=plain,
    )  # fmt: skip


def test_rounds_with_estimates_tell_the_speedup():
    rounds = [
        _round("5_1_6", 1, 3, 0.5, plain=1.0),
        _round("5_1_6", 1, 3, 0.5, plain=1.0),
        _round("3_1_4", 8, 1, 1.0, 1.5),
    ]
    story = rounds_speed(rounds, THRESHOLDS)
    assert story.tokens == 4 + 4 + 16 and story.wall_time_s == 2.0 and story.tokens_per_s == 12.0
    assert story.accept_length == pytest.approx((3 + 3 + 8) / 10 + 1)
    assert story.plain_time_estimate_s == pytest.approx(3.5) and story.speedup == pytest.approx(1.75)
    assert story.choices == {"1": "5_1_6", "5-20": "3_1_4"}
    out = io.StringIO()
    print_speed_summary("fastrl generate", story, out)
    text = out.getvalue()
    assert "24 tokens in 2.0 s, 12 tok/s" in text and "accept length 2.40" in text
    assert "plain decoding est. 3.5 s: 1.75x" in text and "1: 5_1_6, 5-20: 3_1_4" in text


def test_without_estimates_it_says_so():
    story = rounds_speed([_round("disable", 2, 0, 0.25), _round("disable", 3, 0, 0.25)], THRESHOLDS)
    assert story.speedup is None and story.plain_words() == "no plain-decoding estimate"
    assert story.postfix()["vs_plain"] == "no estimate" and story.postfix()["bs:strategy"] == "2-4:disable"
    assert "no plain-decoding estimate" in story.line()


def test_partly_estimated_rounds_scale_the_wall_time():
    # only the estimated rounds' ratio counts: 2 s estimated for 1 s of estimated rounds -> 2x the whole wall time
    assert estimated_plain_time(10.0, [(1.0, 2.0), (3.0, 0.0)]) == pytest.approx(20.0)
    assert estimated_plain_time(10.0, [(1.0, 0.0)]) is None


def test_a_rollout_estimate_swaps_each_workers_rounds_and_keeps_the_time_outside_generation():
    records = [
        RoundRecord("w0", "5_1_6", 1, 3.0, 4, 1.0, 1.5),
        RoundRecord("w0", "5_1_6", 1, 3.0, 4, 1.0, 1.5),
        RoundRecord("w0", "7_1_8", 1, 3.0, 4, 1.0, 0.0),
        RoundRecord("w1", "3_1_4", 4, 2.0, 8, 1.0, 3.0),
    ]
    workers = [WorkerTiming("w0", 4, 3.5, 0.5), WorkerTiming("w1", 4, 2.0, 2.0)]
    batch = RolloutBatch([], 5.0, 1.5, workers, records, DrafterTrainingStats(), 0)
    # w0 -> 3.5 + (4.5 - 3.0) = 5.0; w1 -> 2.0 + (3.0 - 1.0) = 4.0; outside generation: 5.0 - 3.5 = 1.5
    assert rollout_plain_time(batch) == pytest.approx(1.5 + 5.0)
    assert step_speed_fields(batch, THRESHOLDS)["estimated_speedup"] == pytest.approx(6.5 / 5.0)
    # a worker whose rounds carry no estimate keeps its time; without timings the wall time is scaled
    batch.rounds = records[2:]
    assert rollout_plain_time(batch) == pytest.approx(1.5 + max(3.5, 4.0))
    batch.workers = []
    assert rollout_plain_time(batch) == pytest.approx(5.0 * 3.0 / 1.0)
    batch.rounds = records[2:3]
    assert rollout_plain_time(batch) is None


def test_ties_choose_deterministically_and_buckets_keep_their_order():
    arms = count_arm_rounds([(30, "disable"), (1, "7_1_8"), (1, "3_1_4"), (3, "5_1_6")], THRESHOLDS)
    assert list(arms) == ["1", "2-4", "21+"]
    assert SpeedStory(1, 1.0, 1.0, arm_rounds=arms).choices == {"1": "7_1_8", "2-4": "5_1_6", "21+": "disable"}


def _batch(records: list[RoundRecord], wall: float) -> RolloutBatch:
    return RolloutBatch([], wall, 0.0, [], records, DrafterTrainingStats(), 0)


def test_train_step_fields_and_the_run_summary():
    records = [RoundRecord("w0", "5_1_6", 1, 3.0, 4, 0.5, 1.0), RoundRecord("w1", "disable", 8, 1.0, 8, 0.5, 0.5)]
    fields = step_speed_fields(_batch(records, 2.0), THRESHOLDS)
    assert fields["plain_time_estimate_s"] == pytest.approx(3.0) and fields["estimated_speedup"] == pytest.approx(1.5)
    assert fields["arm_rounds"] == {"1": {"5_1_6": 1}, "5-20": {"disable": 1}}
    assert fields["strategy_choices"] == {"1": "5_1_6", "5-20": "disable"}
    none = step_speed_fields(_batch([RoundRecord("w0", "5_1_6", 1, 3.0, 4, 0.5)], 2.0), THRESHOLDS)
    assert none["plain_time_estimate_s"] is None and none["estimated_speedup"] is None
    assert fields["speculative_accept_length"] == 3.0  # the plain round's 8 rows are left out

    history = [_metrics(0, fields, tokens=100, rollout=2.0), _metrics(1, fields, tokens=300, rollout=4.0)]
    story = steps_speed(history, THRESHOLDS)
    assert story.tokens == 400 and story.wall_time_s == 6.0 and story.plain_time_estimate_s == pytest.approx(9.0)
    assert story.speedup == pytest.approx(1.5)
    assert story.arm_rounds == {"1": {"5_1_6": 2}, "5-20": {"disable": 2}}
    # a step without an estimate (no round carried one) is scaled like the steps with one, as rounds are within a
    # step; it used to erase the whole run's estimate
    partial = steps_speed([history[0], _metrics(2, none, 10, 1.0)], THRESHOLDS)
    assert partial.plain_time_estimate_s == pytest.approx(3.0 * 1.5) and partial.speedup == pytest.approx(1.5)
    assert steps_speed([_metrics(2, none, 10, 1.0)], THRESHOLDS).speedup is None  # no step carries one
    flat = history[0].to_flat_dict()
    assert flat["arm_rounds/1/5_1_6"] == 1.0 and flat["estimated_speedup"] == pytest.approx(1.5)
    assert all(isinstance(v, float) for v in flat.values())


def test_speculative_accept_length_weighs_rows_and_leaves_plain_rounds_out():
    records = [
        RoundRecord("w0", "5_1_6", 2, 3.0, 6, 0.5),
        RoundRecord("w0", "suffix_8", 6, 2.0, 12, 0.5),
        RoundRecord("w1", "disable", 30, 1.0, 30, 0.5),
    ]
    fields = step_speed_fields(_batch(records, 2.0), THRESHOLDS)
    assert fields["speculative_accept_length"] == pytest.approx((2 * 3.0 + 6 * 2.0) / 8)
    plain = step_speed_fields(_batch(records[2:], 2.0), THRESHOLDS)
    assert plain["speculative_accept_length"] is None


def _metrics(step: int, speed: dict, tokens: int, rollout: float) -> StepMetrics:
    numbers = {f.name: 0.5 for f in dataclasses.fields(StepMetrics)}
    numbers.update(step=step, policy_version=step, response_len_max=9, accuracy_by_bucket={}, drafter_version=1)
    numbers.update(speed, response_tokens=tokens, rollout_time_s=rollout)
    numbers.update(plain_time_estimate_s=None if speed["plain_time_estimate_s"] is None else rollout * 1.5)
    return StepMetrics(**numbers)


def test_reward_equal_to_accuracy_is_one_line_with_a_legend():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    history = [_metrics(s, step_speed_fields(_batch([], 1.0), THRESHOLDS), 10, 1.0) for s in range(3)]
    _reward_panel(ax, history)
    assert len(ax.get_lines()) == 1 and "reward = accuracy" in ax.get_legend().get_texts()[0].get_text()
    ax.clear()
    _reward_panel(ax, [dataclasses.replace(history[0], accuracy=0.25), *history[1:]])
    assert len(ax.get_lines()) == 2
    plt.close(fig)


def test_choice_panel_one_row_per_bucket_one_colour_per_strategy():
    import matplotlib.pyplot as plt

    records = [RoundRecord("w0", "5_1_6", 1, 3.0, 4, 0.5), RoundRecord("w1", "disable", 8, 1.0, 8, 0.5)]
    fields = step_speed_fields(_batch(records, 2.0), THRESHOLDS)
    fig, ax = plt.subplots()
    choice_panel(ax, [_metrics(s, fields, 10, 1.0) for s in range(3)])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "5-20"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["disable", "5_1_6"]
    plt.close(fig)


def test_generate_says_what_it_counted_and_when_no_decode_round_ran():
    """generate's summary counts the tokens of decode rounds (each request's first token comes from its prefill)
    and says so; a run whose requests all ended at their first token says there is no speed to report."""
    from fastrl.adaptive.fixed import FixedSelector
    from fastrl.strategy.strategy import DISABLE
    from fastrl.telemetry.speed_summary import print_generate_summary

    out = io.StringIO()
    print_generate_summary([], FixedSelector("disable"), out)
    assert out.getvalue().startswith("fastrl generate: no decode round ran (every request ended at its first token")
    out = io.StringIO()
    print_generate_summary([RoundStats(DISABLE, 2, [0, 0], [0, 0], [1, 1], 0.5)], FixedSelector("disable"), out)
    assert "fastrl generate: 2 tokens from decode rounds in 0.5 s, 4 tok/s" in out.getvalue()
    said = "accept length 1.00 (tokens per request per decode round, accepted drafts + 1; 1.00 = plain)"
    assert said in out.getvalue()


def test_a_runs_accept_length_is_its_tokens_over_its_request_rounds():
    """The run's figure was the token-weighted mean of the steps' accept lengths (5.5 here, where the run's decode
    rounds added 1.82 tokens per request-round); a step logged before decode_rows counts tokens / accept length."""
    fields = step_speed_fields(_batch([RoundRecord("w0", "5_1_6", 1, 3.0, 4, 0.5)], 2.0), THRESHOLDS)
    long_step = dataclasses.replace(_metrics(0, fields, tokens=1000, rollout=2.0), mean_accept_length=10.0)
    short_step = dataclasses.replace(_metrics(1, fields, tokens=1000, rollout=2.0), mean_accept_length=1.0)
    steps = [dataclasses.replace(long_step, decode_rows=10), dataclasses.replace(short_step, decode_rows=100)]
    assert steps_speed(steps, THRESHOLDS).accept_length == pytest.approx((10 * 10 + 100 * 1) / 110)
    older = [dataclasses.replace(long_step, decode_rows=None), dataclasses.replace(short_step, decode_rows=None)]
    assert steps_speed(older, THRESHOLDS).accept_length == pytest.approx(2000 / (100 + 1000))
    assert steps_speed([], THRESHOLDS).accept_length == 0.0


def test_wandb_arm_accept_lengths_pool_the_rounds_rows():
    """W&B's arms/<bucket>/<strategy>/accept_length was the mean over rounds, a batch-4 round weighing what a
    batch-2 round does; it is the accept length of the rows, as every other accept length."""
    from fastrl.commands.train import _arm_means

    rounds = [RoundRecord("w0", "5_1_6", 2, 5.0, 10, 0.5), RoundRecord("w0", "5_1_6", 4, 2.0, 8, 1.0)]
    means = _arm_means(rounds, THRESHOLDS)
    assert means["arms/2-4/5_1_6/accept_length"] == pytest.approx((10 + 8) / 6)
    assert means["arms/2-4/5_1_6/goodput"] == pytest.approx((10 / 0.5 + 8 / 1.0) / 2)

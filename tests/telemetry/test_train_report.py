"""report.png of `fastrl train`: drawn with and without co-training metrics; the new metrics reach W&B's flat view."""

from __future__ import annotations

import dataclasses

import pytest

from fastrl.rl.metrics import StepMetrics
from fastrl.telemetry.train_report import plot_train_report


def metrics(step: int, cotrained: bool) -> StepMetrics:
    numbers = {f.name: 0.5 for f in dataclasses.fields(StepMetrics)}
    numbers.update(step=step, policy_version=step, response_len_max=9, response_tokens=90, accuracy_by_bucket={})
    numbers.update(
        arm_rounds={"1": {"5_1_6": 3}, "2-4": {"disable": 1}}, strategy_choices={"1": "5_1_6", "2-4": "disable"}
    )
    numbers.update(plain_time_estimate_s=0.9 if cotrained else None, estimated_speedup=1.8 if cotrained else None)
    numbers.update(drafter_version=step + 1 if cotrained else 0, drafter_steps=6 if cotrained else 0)
    for key in ("drafter_loss", "drafter_top1", "drafter_heldout_top1_before", "drafter_heldout_top1", "drift_kl"):
        numbers[key] = 0.6 + 0.01 * step if cotrained else None
    return StepMetrics(**numbers)


def test_report_with_and_without_cotraining(tmp_path, monkeypatch):
    for cotrained in (True, False):
        history = [metrics(s, cotrained) for s in range(3)]
        png = plot_train_report(history, [3, 5, 9], tmp_path / f"report_{cotrained}.png", "test")
        assert png.is_file() and png.stat().st_size > 10_000
    # a resumed run: lengths of the steps this process ran only, and the histogram says which
    import matplotlib.axes

    labels = []
    real = matplotlib.axes.Axes.hist

    def hist(self, *args, **kwargs):
        labels.append(kwargs.get("label"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "hist", hist)
    plot_train_report(history, [3, 5], tmp_path / "resumed.png", "test", length_steps=[2])
    plot_train_report(history, [3, 5, 9, 4], tmp_path / "whole.png", "test")
    assert labels == ["2 responses of step 2", "4 responses of steps 0-2"]
    flat = metrics(1, True).to_flat_dict()
    assert flat["drafter_heldout_top1"] == 0.61 and flat["drafter_steps"] == 6.0 and flat["drafter_version"] == 2.0
    assert "drafter_heldout_top1" not in metrics(1, False).to_flat_dict()


def test_a_non_finite_metric_is_null_in_metrics_jsonl_and_named_in_the_log(tmp_path, caplog):
    """json.dumps wrote inf as the bare token Infinity: metrics.jsonl stopped being JSON for strict readers."""
    import json

    from fastrl.commands.train import LOG_NAME, RunRecorder
    from fastrl.json_values import finite_json

    step = dataclasses.replace(
        metrics(3, True), drift_kl=float("inf"), loss=float("nan"), accuracy_by_bucket={"2": 0.5}
    )
    with caplog.at_level("WARNING", logger=LOG_NAME):
        RunRecorder(tmp_path).log(step, 3)
    line = (tmp_path / "metrics.jsonl").read_text()
    record = json.loads(line, parse_constant=lambda token: pytest.fail(f"{token} is not JSON"))
    assert record["drift_kl"] is None and record["loss"] is None and record["drafter_loss"] == 0.63
    assert "step 3: loss, drift_kl not finite" in caplog.text
    assert finite_json({"a": [1.0, float("-inf")], "b": {"c": float("nan")}, "d": "x"}) == (
        {"a": [1.0, None], "b": {"c": None}, "d": "x"},
        ["a[1]", "b.c"],
    )

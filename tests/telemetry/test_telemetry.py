"""Telemetry: a real offline W&B run writes its files; plots are written as PNG; round summaries add up."""

from __future__ import annotations

from pathlib import Path

from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy
from fastrl.telemetry.arm_plots import plot_rounds
from fastrl.telemetry.round_summary import summarize_rounds
from fastrl.telemetry.wandb_logger import WandbConfig, WandbLogger


def _rounds() -> list[RoundStats]:
    spec = Strategy.parse("3_1_4")
    out = []
    for i in range(30):
        bs = max(1, 16 - i)
        strategy = spec if i % 3 else DISABLE
        acc = [2 if strategy is spec else 0] * bs
        drafted = [3 if strategy is spec else 0] * bs
        out.append(RoundStats(strategy, bs, drafted, acc, [a + 1 for a in acc], wall_time_s=0.01 + 0.001 * i))
    return out


def test_offline_wandb_run_writes_files(tmp_path):
    logger = WandbLogger(WandbConfig(dir=str(tmp_path / "w"), run_name="t"), {"k": 1})
    logger.log({"reward": 0.5}, step=0)
    logger.log_histogram("lengths", [1.0, 2.0, 5.0], step=1)
    logger.finish()
    runs = list((tmp_path / "w" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_round_summary_and_plot(tmp_path):
    stats = _rounds()
    summary = summarize_rounds(stats)
    assert summary.rounds == 30
    assert summary.emitted_tokens == sum(s.total_emitted for s in stats)
    by = {s.strategy: s for s in summary.strategies}
    assert by["disable"].mean_accept_length == 1.0 and by["3_1_4"].mean_accept_length == 3.0
    png = plot_rounds(stats, [0 if s.batch_size < 5 else 1 for s in stats], ["1-4", "5+"], tmp_path / "p.png")
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

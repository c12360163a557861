"""The stats of an interrupted, then resumed `fastrl generate` describe the results in its output: the rows that
requests still running at the interrupt ran are thrown away with them (they are decoded again), so neither the
interrupted run's stats nor the merged ones count them; a round cut to its kept rows keeps their share of its time
and of its plain-decoding estimate, so goodput and the speedup estimate count what is counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastrl.cli import main
from fastrl.commands.result_stream import ResultStream
from fastrl.commands.round_ledger import without_rows
from fastrl.strategy.round_stats import RoundStats, RoundTotals
from fastrl.strategy.strategy import Strategy


def _args(model_dir, prompts: Path, out: Path) -> list[str]:
    return [
        "generate",
        f"model={model_dir}",
        f"prompts={prompts}",
        f"output={out}",
        f"stats_output={out.with_suffix('.stats.json')}",
        "max_new_tokens=24",
        "temperature=1.5",  # end-of-sequence now and then, and history drafts of varying length: rows end apart
        "n=4",
        "batch_size=8",
        "strategy=suffix_8",
        "progress=false",
    ]


def _decode_tokens(out: Path) -> tuple[int, int]:
    """Tokens from decode rounds and rows of them, as the output's results hold them (accept_lengths)."""
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return sum(sum(r["accept_lengths"]) for r in records), sum(len(r["accept_lengths"]) for r in records)


def _stats_tokens(out: Path) -> tuple[int, int]:
    stats = json.loads(out.with_suffix(".stats.json").read_text())
    log = stats["round_log"]
    assert stats["emitted_tokens"] == sum(sum(r["emitted_tokens"]) for r in log)
    return stats["emitted_tokens"], sum(r["batch_size"] for r in log)


@pytest.mark.parametrize("interrupt_after", [5, 13])
def test_resumed_stats_count_only_the_written_results(model_dir, tmp_path, monkeypatch, capsys, interrupt_after):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [5 + i, 6, 7]}) + "\n" for i in range(6)))
    out = tmp_path / "out.jsonl"
    write = ResultStream.write

    def interrupting(self, record):
        write(self, record)
        if len(self.done) == interrupt_after:  # a signal right after a result is written; others are running
            raise KeyboardInterrupt

    monkeypatch.setattr(ResultStream, "write", interrupting)
    assert main(_args(model_dir, prompts, out)) == 130
    assert len(out.read_text().splitlines()) == interrupt_after
    assert _stats_tokens(out) == _decode_tokens(out)  # the interrupted run's stats: its written results only
    monkeypatch.setattr(ResultStream, "write", write)
    capsys.readouterr()
    assert main(_args(model_dir, prompts, out)) == 0
    tokens, rows = _decode_tokens(out)
    assert _stats_tokens(out) == (tokens, rows)
    assert f"fastrl generate: {tokens} tokens from decode rounds" in capsys.readouterr().out


def _round(**kwargs) -> RoundStats:
    fields = dict(
        strategy=Strategy.parse("suffix_8"),
        batch_size=4,
        drafted_tokens=[6, 6, 6, 6],
        accepted_tokens=[2, 0, 5, 3],
        emitted_tokens=[3, 1, 2, 4],  # row 2 stopped inside its accepted path
        wall_time_s=0.8,
        draft_time_s=0.2,
        verify_time_s=0.4,
        plain_time_estimate_s=1.0,  # plain time per round at batch 4 (0.4 s) x 10 tokens / 4 rows
        catch_up_time_s=0.1,
    )
    return RoundStats(**(fields | kwargs))


def test_a_round_cut_to_its_kept_rows_keeps_their_share_of_time_and_estimate():
    cut = without_rows(_round(), [3, 1])  # the rows of two requests still running: 3 and 1 tokens
    assert cut is not None
    assert (cut.batch_size, cut.drafted_tokens, cut.accepted_tokens, cut.emitted_tokens) == (2, [6, 6], [5, 3], [2, 4])
    assert cut.wall_time_s == pytest.approx(0.4)
    assert (cut.draft_time_s, cut.verify_time_s, cut.catch_up_time_s) == pytest.approx((0.1, 0.2, 0.05))
    assert cut.plain_time_estimate_s == pytest.approx(0.6)  # 0.4 s / 4 rows x the 6 tokens kept
    assert RoundTotals.of([cut]).estimated_speedup == pytest.approx(0.6 / 0.4)


def test_a_running_row_is_told_from_a_stopped_one_of_as_many_tokens():
    """Emitted 2 with 1 accepted (running) or with 5 accepted (stopped inside its path): the running one goes."""
    stats = _round(accepted_tokens=[1, 0, 5, 3], emitted_tokens=[2, 1, 2, 4])
    cut = without_rows(stats, [2])
    assert cut is not None and (cut.accepted_tokens, cut.emitted_tokens) == ([0, 5, 3], [1, 2, 4])


def test_a_round_without_kept_rows_is_dropped_and_one_without_dropped_rows_is_itself():
    stats = _round()
    assert without_rows(stats, [3, 1, 2, 4]) is None
    assert without_rows(stats, []) is stats


def test_a_plain_round_cut_keeps_its_estimate_equal_to_its_time():
    plain = _round(
        strategy=Strategy.parse("disable"),
        drafted_tokens=[0] * 4,
        accepted_tokens=[0] * 4,
        emitted_tokens=[1] * 4,
        draft_time_s=0.0,
        verify_time_s=0.0,
        plain_time_estimate_s=0.8,
        catch_up_time_s=0.0,
    )
    cut = without_rows(plain, [1])
    assert cut is not None and cut.plain_time_estimate_s == pytest.approx(cut.wall_time_s) == pytest.approx(0.6)

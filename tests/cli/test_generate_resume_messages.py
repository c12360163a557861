"""What a resumed `fastrl generate` says when it refuses or skips work: a refusal names the recorded setting that
differs before it blames the prompts (results of another ``n`` sit at other indices), names the prompts-file line
(1-based, blank lines counted) and the "sample" of the result, and counts prompts as the user wrote them; a finished
output with a missing plot_output draws it from the round log its stats_output holds, and says truly why not when
it cannot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastrl.cli import main


def _write(path: Path, lines: list[dict | None]) -> Path:
    path.write_text("".join(("" if x is None else json.dumps(x)) + "\n" for x in lines))
    return path


def _args(model_dir, prompts: Path, out: Path, *extra: str) -> list[str]:
    return [
        "generate",
        f"model={model_dir}",
        f"prompts={prompts}",
        f"output={out}",
        "max_new_tokens=4",
        "temperature=0.8",
        "n=4",
        "batch_size=8",
        "progress=false",
        *extra,
    ]


@pytest.fixture(scope="module")
def made(model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """Prompts on lines 1, 3 and 4 (line 2 is blank) and their n=4 results, with stats_output (no plot)."""
    tmp = tmp_path_factory.mktemp("made")
    prompts = _write(tmp / "in.jsonl", [{"prompt_ids": [5, 6, 7]}, None, {"prompt_ids": [8, 9]}, {"prompt_ids": [4]}])
    out = tmp / "out.jsonl"
    assert main(_args(model_dir, prompts, out, f"stats_output={out.with_suffix('.stats.json')}")) == 0
    return prompts, out


def _copy(made: tuple[Path, Path], tmp_path: Path, keep=lambda record: True) -> Path:
    out = tmp_path / "out.jsonl"
    records = [json.loads(line) for line in made[1].read_text().splitlines()]
    out.write_text("".join(json.dumps(r) + "\n" for r in records if keep(r)))
    return out


def _refusal(capsys) -> str:
    return capsys.readouterr().err


def test_another_n_is_named_as_the_setting_that_differs(model_dir, made, tmp_path, capsys):
    """Without samples 0 and 1 of line 1 the first result is index 2: with n=2 that index is line 3's, whose prompt
    differs; the refusal still names n, the setting that differs."""
    out = _copy(made, tmp_path, keep=lambda r: r["index"] >= 2)
    before = out.read_bytes()
    assert main([*_args(model_dir, made[0], out), "n=2"]) == 2
    err = _refusal(capsys)
    assert "other settings: n=4 (now 2)" in err
    assert "another prompt" not in err and out.read_bytes() == before


def test_an_edited_line_is_named_by_its_line_in_the_file_and_the_sample(model_dir, made, tmp_path, capsys):
    """Line 3 is the second prompt (line 2 is blank); samples 0 and 1 of it are not in the output, so the first
    result of it there is "sample": 2."""
    out = _copy(made, tmp_path, keep=lambda r: (r["prompt_index"], r["sample"]) not in ((1, 0), (1, 1)))
    prompts = _write(
        tmp_path / "in.jsonl", [{"prompt_ids": [5, 6, 7]}, None, {"prompt_ids": [8, 10]}, {"prompt_ids": [4]}]
    )
    assert main(_args(model_dir, prompts, out)) == 2
    err = _refusal(capsys)
    assert f'holds a result for line 3 of prompts={prompts} ("sample": 2) made from another prompt' in err
    assert "resume=false" in err


def test_another_seed_is_named_with_both_seeds(model_dir, made, tmp_path, capsys):
    out = _copy(made, tmp_path)
    first = json.loads(out.read_text().splitlines()[0])
    assert (first["prompt_index"], first["sample"]) == (0, 0)
    assert main([*_args(model_dir, made[0], out), "seed=7"]) == 2
    err = _refusal(capsys)
    assert f'line 1 of prompts={made[0]} ("sample": 0) made with seed {first["seed"]}, but this run samples it ' in err
    assert "with seed 7 " in err


def test_a_shorter_prompts_file_is_counted_in_prompts(model_dir, made, tmp_path, capsys):
    out = _copy(made, tmp_path)
    prompts = _write(tmp_path / "two.jsonl", [{"prompt_ids": [5, 6, 7]}, None, {"prompt_ids": [8, 9]}])
    assert main(_args(model_dir, prompts, out)) == 2
    err = _refusal(capsys)
    assert f'holds a result for prompt 3 ("sample": 0), but prompts={prompts} has 2 prompts (x n=4: 8 results)' in err


def test_a_missing_plot_of_a_finished_output_is_drawn_from_its_stats(model_dir, made, tmp_path, capsys):
    """The run that made the results finished and wrote its stats: the plot asked for afterwards comes from them,
    the very picture the run would have drawn."""
    out = tmp_path / "out.jsonl"
    stats, plot = out.with_suffix(".stats.json"), out.with_suffix(".png")
    args = _args(model_dir, made[0], out, f"stats_output={stats}", f"plot_output={plot}")
    assert main(args) == 0
    drawn = plot.read_bytes()
    plot.unlink()
    capsys.readouterr()
    assert main(args) == 0
    err = _refusal(capsys)
    assert (
        f"(stats_output={stats} left as it is); plot_output={plot} drawn from the rounds in stats_output={stats}" in err
    )
    assert "not written" not in err and plot.read_bytes() == drawn


def test_a_missing_plot_without_stats_output_says_what_it_needs(model_dir, made, tmp_path, capsys):
    out = _copy(made, tmp_path)
    plot = tmp_path / "out.png"
    assert main(_args(model_dir, made[0], out, f"plot_output={plot}")) == 0
    err = _refusal(capsys)
    assert f"plot_output={plot} not written: it is drawn from the rounds that made these results, which only a " in err
    assert "stats_output file keeps" in err and "ended before" not in err and not plot.exists()


def test_a_stats_file_without_rounds_is_named_and_the_plot_not_written(model_dir, made, tmp_path, capsys):
    """A stats JSON whose rounds cannot be read; a file that is no stats JSON at all ("{}") is refused before any
    work (it would be overwritten by a run that had results to make)."""
    out = _copy(made, tmp_path)
    stats, plot = tmp_path / "s.json", tmp_path / "out.png"
    damaged = json.dumps({"strategy_selector": "bandit", "bucket_thresholds": [1, 8], "round_log": [{}]}) + "\n"
    stats.write_text(damaged)
    assert main(_args(model_dir, made[0], out, f"stats_output={stats}", f"plot_output={plot}")) == 0
    err = _refusal(capsys)
    assert f"plot_output={plot} not written: stats_output={stats} is not the stats of a fastrl generate run" in err
    assert f"stats_output={stats} left as it is" in err and not plot.exists() and stats.read_text() == damaged
    stats.write_text("{}\n")
    assert main(_args(model_dir, made[0], out, f"stats_output={stats}", f"plot_output={plot}")) == 2
    err = _refusal(capsys)
    assert f"stats_output={stats} is not the stats JSON of a `fastrl generate` run (it has no " in err
    assert not plot.exists() and stats.read_text() == "{}\n"


def test_a_negative_index_is_named_as_no_prompt(model_dir, made, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"index": -1, "prompt_ids": [5, 6, 7]}) + "\n")
    assert main(_args(model_dir, made[0], out)) == 2
    assert f'output={out} holds a result with "index": -1, which names no prompt' in _refusal(capsys)

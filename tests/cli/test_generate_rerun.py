"""Nothing lost on a re-run of `fastrl generate` (issue 25): a finished run run again leaves stats_output and
plot_output byte-identical; an interrupted run, resumed, writes stats covering the whole run (its rounds and tokens
equal an uninterrupted run's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastrl.cli import main


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "in.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": [5 + i % 50, 6 + i % 7, 7]}) + "\n" for i in range(120)))
    return path


def _args(model_dir, prompts, out: Path) -> list[str]:
    return [
        "generate",
        f"model={model_dir}",
        f"prompts={prompts}",
        f"output={out}",
        f"stats_output={out.with_suffix('.stats.json')}",
        f"plot_output={out.with_suffix('.png')}",
        "max_new_tokens=12",
        "batch_size=1",
        "progress=false",
    ]


def _totals(out: Path) -> tuple[int, int]:
    stats = json.loads(out.with_suffix(".stats.json").read_text())
    return stats["rounds"], stats["emitted_tokens"]


@pytest.fixture(scope="module")
def full_run(model_dir, prompts, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full") / "out.jsonl"
    assert main(_args(model_dir, prompts, out)) == 0
    return out


def test_a_finished_rerun_leaves_stats_and_plot_byte_identical(model_dir, prompts, full_run, capsys):
    stats, plot = full_run.with_suffix(".stats.json"), full_run.with_suffix(".png")
    before = (stats.read_bytes(), plot.read_bytes(), full_run.read_bytes())
    assert _totals(full_run)[0] > 0
    assert main(_args(model_dir, prompts, full_run)) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert (stats.read_bytes(), plot.read_bytes(), full_run.read_bytes()) == before


def test_a_finished_rerun_says_which_statistics_the_interrupted_run_never_wrote(
    model_dir, prompts, full_run, tmp_path, capsys
):
    """A signal after the last result but before the statistics leaves every result and no stats file: the rerun
    has nothing to do and no rounds to write them from, so it says so instead of "left as they are"."""
    out = tmp_path / "out.jsonl"
    out.write_bytes(full_run.read_bytes())
    assert main(_args(model_dir, prompts, out)) == 0
    err = capsys.readouterr().err
    assert f"stats_output={out.with_suffix('.stats.json')} and plot_output={out.with_suffix('.png')} not written" in err
    assert "resume=false" in err and not out.with_suffix(".stats.json").exists()


def test_interrupted_then_resumed_stats_cover_the_whole_run(model_dir, prompts, full_run, tmp_path):
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    restore = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731 (see test_generate_stream)
    cmd = [sys.executable, "-m", "fastrl.cli", *_args(model_dir, prompts, out)]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, preexec_fn=restore)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and len(out.read_text().splitlines()) >= 3:
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.01)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    kept = len(out.read_text().splitlines())
    assert 3 <= kept < 120
    partial_rounds, partial_tokens = _totals(out)  # the interrupted run wrote the stats of what it kept
    assert 0 < partial_rounds < _totals(full_run)[0]
    assert main(_args(model_dir, prompts, out)) == 0
    assert _totals(out) == _totals(full_run)
    assert out.read_bytes() == full_run.read_bytes()


def test_blank_lines_in_a_kept_output_are_dropped_not_a_failure_at_the_end(model_dir, prompts, full_run, tmp_path):
    """A blank line (an `echo >> out.jsonl`, an editor) is skipped when the file is read, but the run's last step
    parsed every line: the run failed after its work, before its stats, with an error naming no file."""
    out = tmp_path / "out.jsonl"
    lines = full_run.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]) + "\n" + "".join(lines[3:-1]) + "\n \n")  # blank lines, the last result missing
    assert main(_args(model_dir, prompts, out)) == 0
    assert out.read_text() == full_run.read_text()
    assert _totals(out)[1] > 0
    out.write_text(out.read_text() + "\n")  # a finished run with a trailing blank line: nothing to do, no failure
    assert main(_args(model_dir, prompts, out)) == 0
    assert out.read_text() == full_run.read_text()

"""recipes/cotrain_drift/plot.py: --help is answered, a missing or damaged run is one usage error naming the file,
and drift.png / drift.json are replaced only with --overwrite."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEP = {"step": 0, "reward_mean": 0.5, "loss": 0.1, "mean_accept_length": 2.0, "drift_kl": None}


def _plot(argv: list[str]) -> None:
    runpy.run_path(str(ROOT / "recipes/cotrain_drift/plot.py"))["main"](argv)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    for arm in ("frozen", "cotrained"):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "metrics.jsonl").write_text("".join(json.dumps(STEP | {"step": i}) + "\n" for i in range(4)))
    return tmp_path


def _refused(argv: list[str], said: str, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        _plot(argv)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and said in captured.err, captured.err
    assert captured.out == "" and "Traceback" not in captured.err


def test_help_is_answered(capsys):
    with pytest.raises(SystemExit) as stopped:
        _plot(["--help"])
    assert stopped.value.code == 0 and "usage: python recipes/cotrain_drift/plot.py" in capsys.readouterr().out


def test_a_missing_or_damaged_run_is_refused(run, tmp_path, capsys):
    _refused([str(tmp_path / "nope")], "argument out: " + str(tmp_path / "nope") + " is missing", capsys)
    (run / "cotrained" / "metrics.jsonl").write_text(json.dumps(STEP) + '\n{"step": 1, "rew')
    _refused([str(run)], "cotrained/metrics.jsonl:2: not a line of metrics: not JSON", capsys)
    (run / "cotrained" / "metrics.jsonl").write_text("")
    _refused([str(run)], "cotrained/metrics.jsonl holds no steps", capsys)
    (run / "frozen" / "metrics.jsonl").unlink()
    _refused([str(run)], "frozen/metrics.jsonl is missing", capsys)
    assert not (run / "drift.json").exists()


def test_outputs_are_replaced_only_with_overwrite(run, capsys):
    (run / "drift.json").write_text("finished")
    _refused([str(run)], "drift.json exists; pass --overwrite to replace it", capsys)
    assert (run / "drift.json").read_text() == "finished"
    _plot([str(run), "--overwrite"])
    assert json.loads((run / "drift.json").read_text())["steps"] == 4
    assert (run / "drift.png").read_bytes()[:4] == b"\x89PNG"


def test_a_step_whose_loss_was_not_finite_is_a_gap_not_a_refusal(run):
    """metrics.jsonl writes a non-finite metric as null; the plot refused the whole run for one diverged step."""
    lines = [json.dumps(STEP | {"step": i} | ({"loss": None} if i == 2 else {})) for i in range(4)]
    (run / "cotrained" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    _plot([str(run)])
    assert json.loads((run / "drift.json").read_text())["steps"] == 4

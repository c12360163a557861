"""recipes/results/compare.py: a duplicate or malformed --run, a damaged metrics.jsonl and an --out that is a
directory or already written are each one usage error naming them, before any plotting; outputs are replaced only
with --overwrite."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEP = {
    "step": 0,
    "rollout_time_s": 2.0,
    "mean_accept_length": 1.5,
    "step_time_s": 4.0,
    "reward_mean": 0.5,
    "response_tokens": 100,
}


def _compare(argv: list[str]) -> None:
    runpy.run_path(str(ROOT / "recipes/results/compare.py"))["main"](argv)


def _run(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text(text)
    return directory


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return _run(tmp_path / "good", "".join(json.dumps(STEP | {"step": i}) + "\n" for i in range(3)))


def _refused(argv: list[str], said: str, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        _compare(argv)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and said in captured.err, captured.err
    assert captured.out == "" and "Traceback" not in captured.err


def test_a_duplicate_label_is_refused(good, tmp_path, capsys):
    _refused(
        ["--run", f"x={good}", "--run", f"x={good}", "--out", str(tmp_path / "o")], "label 'x' is given twice", capsys
    )
    assert not (tmp_path / "o.png").exists()


def test_a_run_without_a_label_is_refused(good, tmp_path, capsys):
    _refused(["--run", str(good), "--out", str(tmp_path / "o")], "expected LABEL=RUN_DIR", capsys)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (json.dumps(STEP) + '\n{"step": 1, "rollout_ti', "metrics.jsonl:2: not a line of metrics: not JSON"),
        ("", "metrics.jsonl holds no steps"),
        (json.dumps({"step": 0}) + "\n", "metrics.jsonl:1: no 'rollout_time_s'"),
        (json.dumps(STEP | {"reward_mean": "x"}) + "\n", "metrics.jsonl:1: 'reward_mean' must be a number (or null)"),
        ("[1, 2]\n", "metrics.jsonl:1: not a line of metrics: not a JSON object"),
    ],
)
def test_a_damaged_metrics_file_is_one_error_naming_file_and_line(text, said, tmp_path, capsys):
    run = _run(tmp_path / "bad", text)
    _refused(["--run", f"a={run}", "--out", str(tmp_path / "o")], f"--run a: {run / said}", capsys)


def test_a_directory_out_is_refused(good, tmp_path, capsys):
    out = tmp_path / "figures"
    out.mkdir()
    _refused(["--run", f"a={good}", "--out", f"{out}/"], f"--out {out}/ is a directory; give a file prefix", capsys)
    assert not (tmp_path / "figures.png").exists() and not (tmp_path / "figures.md").exists()


def test_existing_outputs_are_replaced_only_with_overwrite(good, tmp_path, capsys):
    out = tmp_path / "o"
    (tmp_path / "o.md").write_text("finished")
    _refused(["--run", f"a={good}", "--out", str(out)], f"{tmp_path / 'o.md'} exists; choose a new prefix", capsys)
    assert (tmp_path / "o.md").read_text() == "finished" and not (tmp_path / "o.png").exists()
    _compare(["--run", f"a={good}", "--run", f"b={good}", "--out", str(out), "--overwrite"])
    assert "| b | 3 | 2.00 | 1.00x | 4.00 | 1.00x | 1.50 | 0.500 |" in (tmp_path / "o.md").read_text()
    assert (tmp_path / "o.png").read_bytes()[:4] == b"\x89PNG"

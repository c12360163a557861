"""recipes/fault_injection: --out is emptied only when an earlier run of the same script made it; another script's
finished results (run.py's under campaign.py) are refused, never removed."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes/fault_injection"


@pytest.fixture
def fresh_out(monkeypatch):
    monkeypatch.syspath_prepend(str(RECIPE))  # the scripts import out_dir from beside them
    return runpy.run_path(str(RECIPE / "out_dir.py"))["fresh_out"]


def _results_of(out: Path, script: str) -> Path:
    out.mkdir()
    (out / ".fault_injection").write_text(f"{script}\n")
    (out / "baseline.log").write_text("finished results")
    return out


@pytest.mark.parametrize("script", ["campaign.py", "run.py"])
def test_another_scripts_results_are_refused_and_kept(script, tmp_path, fresh_out, capsys):
    other = "run.py" if script == "campaign.py" else "campaign.py"
    out = _results_of(tmp_path / "out", other)
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(RECIPE / script))["main"](["--out", str(out)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and f"holds the results of {other}, not {script}" in err
    assert (out / "baseline.log").read_text() == "finished results"


def test_an_earlier_run_of_the_same_script_is_emptied(tmp_path, fresh_out):
    out = _results_of(tmp_path / "out", "run.py")
    fresh_out(out, "run.py")
    assert sorted(p.name for p in out.iterdir()) == [".fault_injection"]


def test_unmarked_files_and_a_bad_path_are_refused(tmp_path, fresh_out):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="a fault-injection run did not write"):
        fresh_out(out, "run.py")
    assert (out / "notes.txt").read_text() == "keep"
    with pytest.raises(ValueError, match="cannot be made"):
        fresh_out(out / "notes.txt" / "x", "run.py")

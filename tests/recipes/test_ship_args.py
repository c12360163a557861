"""recipes/smollm2_drafter/ship.py checks the whole source drafter and the target before writing, and writes
through a staged directory: a refused ship leaves the target as it was, never a mix of two drafters."""

from __future__ import annotations

import runpy
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
DRAFTER = ROOT / "fastrl/assets/arith-tiny-drafter"


def _ship(argv: list[str]) -> None:
    runpy.run_path(str(ROOT / "recipes/smollm2_drafter/ship.py"))["main"](argv)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """An existing target holding a drafter with a draft vocabulary the new one lacks."""
    target = tmp_path / "shipped"
    shutil.copytree(DRAFTER, target)
    (target / "draft_vocab.safetensors").write_bytes(b"old vocabulary")
    return target


def _refused(argv: list[str], said: str, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        _ship(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and said in err and "Traceback" not in err


def test_no_arguments_is_a_usage_error(capsys):
    _refused([], "the following arguments are required: source, target", capsys)


def test_a_source_without_weights_leaves_the_target_whole(tmp_path, shipped, capsys):
    source = tmp_path / "config_only"
    source.mkdir()
    shutil.copyfile(DRAFTER / "drafter_config.json", source / "drafter_config.json")
    before = _snapshot(shipped)
    _refused([str(source), str(shipped), "--overwrite"], "drafter.safetensors is missing", capsys)
    assert _snapshot(shipped) == before
    assert [p.name for p in shipped.parent.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_a_missing_source_makes_no_target(tmp_path, capsys):
    _refused([str(tmp_path / "nope"), str(tmp_path / "new")], "argument source:", capsys)
    assert not (tmp_path / "new").exists()


def test_an_existing_target_needs_overwrite(shipped, capsys):
    before = _snapshot(shipped)
    _refused([str(DRAFTER), str(shipped)], "not empty; choose a new one, or pass --overwrite", capsys)
    assert _snapshot(shipped) == before


def test_the_source_itself_is_refused(capsys):
    _refused([str(DRAFTER), str(DRAFTER), "--overwrite"], "writing it would destroy the input", capsys)


def test_overwrite_replaces_the_whole_drafter(shipped, capsys):
    _ship([str(DRAFTER), str(shipped), "--overwrite"])
    assert "drafter shipped to" in capsys.readouterr().out
    assert sorted(p.name for p in shipped.iterdir()) == ["drafter.safetensors", "drafter_config.json", "metrics.json"]
    assert (shipped / "drafter_config.json").read_bytes() == (DRAFTER / "drafter_config.json").read_bytes()
    weights = load_file(shipped / "drafter.safetensors")
    assert weights.keys() == load_file(DRAFTER / "drafter.safetensors").keys()
    assert {str(t.dtype) for t in weights.values()} == {"torch.bfloat16"}

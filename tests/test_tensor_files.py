"""Tensor files get the permissions of any other file the user creates (safetensors alone writes 0600)."""

import os

import torch
from safetensors.torch import load_file

from fastrl.assets_path import bundled_model_dir
from fastrl.models.checkpoint import load_model
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import save_drafter
from fastrl.tensor_files import save_tensors


def _mode(path) -> int:
    return path.stat().st_mode & 0o777


def test_saved_tensors_follow_the_umask_and_round_trip(tmp_path):
    previous = os.umask(0o027)
    try:
        save_tensors({"w": torch.arange(6.0).view(2, 3)}, tmp_path / "t.safetensors", metadata={"format": "pt"})
    finally:
        os.umask(previous)
    assert _mode(tmp_path / "t.safetensors") == 0o640
    assert torch.equal(load_file(tmp_path / "t.safetensors")["w"], torch.arange(6.0).view(2, 3))


def test_a_saved_drafter_is_readable_like_its_config(tmp_path):
    save_drafter(EagleDrafter(load_model(bundled_model_dir()).config), tmp_path / "d", policy_name="arith-tiny")
    modes = {p.name: _mode(p) for p in (tmp_path / "d").iterdir()}
    assert len(set(modes.values())) == 1, modes

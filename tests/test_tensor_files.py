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


def test_a_write_the_system_refuses_is_its_os_error(tmp_path):
    """safetensors reports a failed write as its own error; save_tensors gives the OSError (here a file-size limit,
    EFBIG; a full disk is ENOSPC the same way), so commands can say it in one line. In a child process: the limit
    holds for the whole process."""
    import subprocess
    import sys

    code = f"""
import errno, resource, signal, torch
from fastrl.tensor_files import save_tensors
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    save_tensors({{"w": torch.zeros(100000)}}, {str(tmp_path / "big.safetensors")!r})
except OSError as err:
    print(err.errno == errno.EFBIG, err.filename)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", str(tmp_path / "big.safetensors")], done.stderr
